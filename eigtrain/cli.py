"""Command lines of every eigtrain command: Hydra overrides composed onto a typed dataclass schema.

`compose_dataclass` serves the small commands (eigtrain-shards, -rr, -eval, -synthetic): the dataclass is
the schema (registered in Hydra's ConfigStore), the arguments are Hydra overrides (`key=value`,
`a.b=value`, lists `[1,2]`), and Hydra composes them, so unknown keys and bad types are rejected the
same way as in eigtrain-train. `check_hydra_command_line` composes eigtrain-train's command line (every
sweep point of a multirun) before Hydra runs it, so that a config error is one line, not a traceback.
Every failure is a `ValueError` (a `ConfigError` for training) whose message is one line naming the key.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import os
import re
import sys
import typing
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from hydra.errors import HydraException, MissingConfigException
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from eigtrain.schema import ConfigError, describe

_INTEGRAL_FLOAT = re.compile(r"^[+-]?\d[\d_]*(\.\d*)?[eE][+]?\d+$")


# ------------------------------------------------------------------------------------ error lines


def error_line(error: BaseException) -> str:
    """One line for a Hydra or OmegaConf error: the key, what is wrong, and what is allowed."""
    if isinstance(error, MissingConfigException) and error.options is not None and error.missing_cfg_file:
        group, _, option = error.missing_cfg_file.rpartition("/")
        return f"{group}={option} is not an option; allowed: {', '.join(sorted(error.options))}"
    cause = error if isinstance(error, OmegaConfBaseException) else error.__cause__
    if isinstance(cause, OmegaConfBaseException):
        return describe(cause)
    return " ".join(str(error).split("\n")[:1]) or type(error).__name__


# --------------------------------------------------------------------- small commands (dataclasses)


def compose_dataclass(schema: type, argv: Sequence[str], groups: Mapping[str, Mapping[str, dict]] | None = None):
    """An instance of dataclass `schema` from Hydra overrides `argv`; ValueError (one line) on a bad one.

    groups: optional named presets, e.g. {"preset": {"paper": {...}}}: `preset=paper` applies those values
    first (a Hydra config group), explicit keys still win. Values of string fields are taken literally
    (`kernels=a,b`, `path=/x/{000..009}.tar`), integers accept `3e5`, and `a.KEY=value` adds KEY to a
    dict field, as the commands always did.
    """
    from hydra import compose, initialize
    from hydra.core.config_store import ConfigStore
    from hydra.core.global_hydra import GlobalHydra

    names = [f.name for f in dataclasses.fields(schema)]
    check_repeated_keys(argv)
    overrides = []
    for item in argv:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ValueError(f"arguments are key=value, got {item!r}; keys: {', '.join(names)}")
        if key.split(".")[0] not in names and key not in (groups or {}):
            raise ValueError(f"unknown key {key!r}; allowed: {', '.join(names)}")
        overrides.append(_as_override(schema, key, value))

    store, primary = ConfigStore.instance(), f"eigtrain_cli_{schema.__module__}.{schema.__qualname__}".replace(".", "_")
    store.store(name=f"{primary}_schema", node=schema)
    defaults: list[Any] = [f"{primary}_schema"]
    for group, options in (groups or {}).items():
        for option, values in options.items():
            own = {group: option} if group in names else {}
            store.store(group=f"{primary}_{group}", name=option, node={**own, **values}, package="_global_")
        defaults.append({f"{primary}_{group}": None})
        overrides = [f"{primary}_{o}" if o.startswith(f"{group}=") else o for o in overrides]
    store.store(name=primary, node={"defaults": [*defaults, "_self_"]})

    outer = GlobalHydra.instance().hydra if GlobalHydra.instance().is_initialized() else None
    GlobalHydra.instance().clear()  # also inside a running Hydra app (eigtrain-train writing demo shards)
    try:
        with initialize(version_base="1.3", config_path=None):
            cfg = compose(primary, overrides=overrides)
        return OmegaConf.to_object(cfg)
    except MissingConfigException as error:  # preset=NAME that does not exist
        missing = error.missing_cfg_file or ""
        group = missing.rpartition("/")[0].removeprefix(f"{primary}_")
        raise ValueError(
            f"{group}={missing.rpartition('/')[2]!r} is unknown; allowed: {', '.join(sorted(error.options or []))}"
        ) from None
    except (HydraException, OmegaConfBaseException) as error:
        raise ValueError(error_line(error).replace(f"{primary}_", "")) from None
    finally:
        GlobalHydra.instance().clear()
        if outer is not None:
            GlobalHydra.instance().initialize(outer)


def _field_type(schema: type, key: str):
    """The declared type at dotted `key` of dataclass `schema` ("dict entry" inside a dict field)."""
    kind: Any = schema
    for part in key.lstrip("+~").split("."):
        if kind == "dict entry" or _is_dict(kind):
            kind = "dict entry"
            continue
        if not (isinstance(kind, type) and dataclasses.is_dataclass(kind)):
            return None
        kind = typing.get_type_hints(kind).get(part)
    return kind


def _is_dict(kind) -> bool:
    return any(t is dict or typing.get_origin(t) is dict for t in (kind, *typing.get_args(kind)))


def _as_override(schema: type, key: str, value: str) -> str:
    kind = _field_type(schema, key)
    if kind == "dict entry":  # a new key of a dict field (encoder.kwargs.KEY=VALUE): add or replace it
        return f"++{key.lstrip('+')}={value}"
    args = set(typing.get_args(kind)) - {type(None)} or {kind}
    lists = [t for t in (kind, *args) if typing.get_origin(t) is list]
    if lists:
        return f"{key}={_as_list(lists[0], value)}"
    return f"{key}={_as_value(args, value)}"


def _as_value(args: set, value: str) -> str:
    """One value of declared type(s) `args` in Hydra's override grammar."""
    if (
        args <= {str, Any}
        and value != "null"
        and not value.startswith(("'", '"'))
        and not (Any in args and value.startswith("["))
    ):
        return f"'{_quoted(value)}'"  # taken literally: commas, braces, `=` are no Hydra syntax here
    if args == {int} and _INTEGRAL_FLOAT.match(value):
        number = float(value.replace("_", ""))
        if number == int(number):
            return str(int(number))
    return value


def _as_list(kind, value: str) -> str:
    """A list key's value: `[a,b]`, `a,b` or one `a` (each item read as the item type: a path item may hold `=`,
    `~`, braces or parentheses). A value with quotes is the user's own Hydra syntax (quote items holding commas)."""
    if value == "null" or "'" in value or '"' in value:
        return value
    inner = value[1:-1] if value.startswith("[") and value.endswith("]") else value
    item_type = {*typing.get_args(kind)} or {Any}
    return "[" + ",".join(_as_value(item_type, item.strip()) for item in _top_level_items(inner)) + "]"


def _top_level_items(text: str) -> list[str]:
    """`text` split at the commas outside braces (a shard pattern's {a,b} stays one item); none when empty."""
    items, depth, start = [], 0, 0
    for i, char in enumerate(text):
        depth += (char == "{") - (char == "}")
        if char == "," and depth == 0:
            items.append(text[start:i])
            start = i + 1
    return [*items, text[start:]] if text.strip() else []


def _quoted(value: str) -> str:
    return value.replace("\\", "\\\\").replace("'", "\\'")


# --------------------------------------------------------------------------- eigtrain-train (Hydra)


def hydra_overrides(argv: Sequence[str]) -> tuple[list[str], bool, str | None] | None:
    """(overrides, multirun, config_name) of a Hydra app's command line; None when it asks for help,
    completion, a rerun or the like (nothing to compose) or is not valid (Hydra then says why)."""
    from hydra._internal.utils import get_args_parser

    try:
        with contextlib.redirect_stderr(io.StringIO()), contextlib.redirect_stdout(io.StringIO()):
            args = get_args_parser().parse_args(list(argv))
    except SystemExit:
        return None
    if (
        args.help
        or args.hydra_help
        or args.shell_completion
        or args.info
        or args.experimental_rerun
        or args.config_path
    ):
        return None
    overrides = list(args.overrides)
    if args.config_dir:
        overrides.append(f"hydra.searchpath=[file://{args.config_dir}]")
    return overrides, bool(args.multirun), args.config_name


def sweep_points(overrides: Sequence[str]) -> list[list[str]]:
    """Points to check of a sweep: every value of each swept key once (the other keys at their first)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parsed = OverridesParser.create().parse_overrides(list(overrides))
    values: list[list[str | None] | None] = []  # None: a sweep whose values Hydra expands itself
    for override in parsed:
        if override.is_sweep_override():
            key = override.get_key_element()
            try:
                values.append([f"{key}={v}" for v in override.sweep_string_iterator()])
            except Exception:  # glob() and other sweeps that need the config repository: checked by Hydra
                values.append(None)
        else:
            values.append([override.input_line])
    fixed = [v[0] if v else None for v in values]
    points = [[o for o in fixed if o is not None]]
    for i, options in enumerate(values):
        for option in (options or [])[1:]:
            points.append([o for o in fixed[:i] + [option] + fixed[i + 1 :] if o is not None])
    return points


def point_key(overrides: Sequence[str]) -> tuple[str, ...]:
    """A point's overrides as Hydra's sweeper hands them to the point's job (each value rendered again: `false` ->
    `False`; a repeated key once, at its first place, with its last value), so that a point checked before Hydra ran
    is known again in its job."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    rendered: dict[str, str] = {}
    for override in OverridesParser.create().parse_overrides(list(overrides)):
        key = override.get_key_element()
        rendered[key] = f"{key}={override.get_value_element_as_str()}"
    return tuple(rendered.values())


def check_hydra_command_line(argv: Sequence[str], check: Callable[[list[str], str | None], None]) -> None:
    """Compose each point of the command line with `check(overrides, config_name)`; a bad one is one
    ConfigError line (an unknown key or option with the allowed ones, a bad type, a failed check)."""
    parsed = hydra_overrides(argv)
    if parsed is None:
        return
    overrides, multirun, config_name = parsed
    check_repeated_keys(overrides)
    try:
        points = sweep_points(overrides) if multirun else [overrides]
        for point in points:
            check(point, config_name)
    except ConfigError:
        raise
    except (HydraException, OmegaConfBaseException) as error:
        raise ConfigError(_brace_hint(overrides) or _grammar_hint(overrides) or error_line(error)) from None


_BRACE_PATTERN = re.compile(r"\{[^{}]*(\.\.|,)[^{}]*\}")  # {000..099} or {a,b}: a shard pattern, not Hydra syntax


def check_repeated_keys(overrides: Sequence[str]) -> None:
    """A shell that expanded an unquoted brace pattern gives one `key=` per shard, and Hydra would silently keep the
    last: refuse a key given several times with values that differ only inside (as an expansion's do), and say how
    to quote the pattern. (A key repeated otherwise, `steps=4 steps=2`, keeps Hydra's last-one-wins.)"""
    values: dict[str, list[str]] = {}
    for item in overrides:
        key, sep, value = item.partition("=")
        if sep:
            values.setdefault(key.lstrip("+~"), []).append(value)
    for key, given in values.items():
        if len(set(given)) > 1 and os.path.commonprefix(given) and os.path.commonprefix([v[::-1] for v in given]):
            raise ConfigError(
                f"{key} is given {len(given)} times ({', '.join(given[:3])}{', ...' if len(given) > 3 else ''}"
                f"): did the shell expand a brace pattern? Quote it: \"{key}='DIR/train-{{000..099}}.tar'\""
            )


def _grammar_hint(overrides: Sequence[str]) -> str | None:
    """How to quote a value that Hydra's override grammar cannot read (a sweep point's `run_dir=runs/sw/dim=4`)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parser = OverridesParser.create()
    for item in overrides:
        try:
            parser.parse_overrides([item])
        except HydraException:
            key, _, value = item.partition("=")
            return (
                f"{item}: Hydra's override grammar cannot read this value; quote it as \"{key}='{value}'\" "
                f"(the single quotes reach Hydra, the double quotes the shell)"
            )
    return None


def _brace_hint(overrides: Sequence[str]) -> str | None:
    """How to quote an unquoted brace pattern, which Hydra's override grammar cannot read."""
    for item in overrides:
        key, _, value = item.partition("=")
        if _BRACE_PATTERN.search(value) and not value.startswith(("'", '"')):
            return (
                f"{key}={value}: Hydra reads braces as its own syntax; quote the pattern as "
                f"\"{key}='{value}'\" (the single quotes reach Hydra, the double quotes stop the shell expanding it)"
            )
    return None


COMMAND_ERRORS = (ValueError, OSError, RuntimeError)  # bad input; unreadable files or shards; max_corrupt, coverage


def asks_for_help(args: list[str], usage: str | None) -> bool:
    """`-h` / `--help` alone: print the command's usage (its module's docstring) and say so; every command the same."""
    if args in (["-h"], ["--help"]):
        print((usage or "").strip())
        return True
    return False


def one_line_errors(command: str, body: Callable[[], Any], errors: tuple[type[Exception], ...] = COMMAND_ERRORS) -> int:
    """Run a command's body: an expected failure is one line on stderr naming the command, without credentials (a
    corrupt sample's signed shard URL, say), and exit status 2; else 0."""
    from eigtrain.redact import redact_url

    try:
        body()
    except errors as error:
        print(redact_url(f"{command}: {error}"), file=sys.stderr)
        return 2
    return 0
