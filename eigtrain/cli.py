"""key=value command-line arguments (the Hydra override style) into a typed dataclass."""

from __future__ import annotations

from dataclasses import fields

from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException


def parse_key_values(schema: type, argv: list[str]):
    """An instance of dataclass `schema`; an unknown key or a bad value is one ValueError naming it."""
    keys = ", ".join(f.name for f in fields(schema))
    bad = [a for a in argv if "=" not in a]
    if bad:
        raise ValueError(f"arguments must be key=value, got {bad}; keys: {keys}")
    try:
        return OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(schema), OmegaConf.from_dotlist(argv)))
    except OmegaConfBaseException as error:
        raise ValueError(f"{str(error).splitlines()[0]} (keys: {keys})") from None
