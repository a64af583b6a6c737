"""key=value command-line arguments (the Hydra override style) into a typed dataclass."""

from __future__ import annotations

from dataclasses import fields

from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException


def parse_key_values(schema: type, argv: list[str]):
    """An instance of dataclass `schema`; an unknown key or a bad value is one ValueError naming it."""
    names = [f.name for f in fields(schema)]
    for item in argv:
        key, sep, _ = item.partition("=")
        if not sep:
            raise ValueError(f"arguments are key=value, got {item!r}; keys: {', '.join(names)}")
        if key.split(".")[0] not in names:
            raise ValueError(f"unknown key {key!r}; allowed: {', '.join(names)}")
    try:
        return OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(schema), OmegaConf.from_dotlist(argv)))
    except OmegaConfBaseException as error:
        raise ValueError(f"bad value for {getattr(error, 'full_key', None)}: {str(error).splitlines()[0]}") from None
