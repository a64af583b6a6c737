"""Credentials out of everything eigtrain writes or logs: URLs keep their scheme, host and path (so shards can
still be told apart) but lose userinfo (`https://user:pass@host`) and query values (`?X-Amz-Signature=...`);
`pipe:` commands lose every value whose name is auth-like (a rule on the name, not a list of tools: headers such as
`PRIVATE-TOKEN:`, options such as `--oauth2-bearer`, `-o Credentials:...=`, `NAME=value`) and `-u user:password`.

The live config keeps the real values (the run needs them); only what is persisted or printed is redacted:
config.yaml, wandb's config and recorded command line, the shard-count cache, wids shard indexes, sweep directory
names and Hydra's multirun.yaml, the Rayleigh-Ritz manifest, error messages naming a shard and log lines.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import sys
from pathlib import Path
from typing import Any

from eigtrain import safe_files

MASK = "REDACTED"

# scheme://userinfo@ : userinfo runs to the last '@' before the host's end (a password may hold '@'; '/' ends it)
_USERINFO = re.compile(r"(?P<scheme>\b[A-Za-z][A-Za-z0-9+.-]*://)[^/?#\s'\"@]*(?:@[^/?#\s'\"@]*)*@")
# inside a URL: ?key=value&key=value (also `;`): each value up to the next separator or brace-pattern syntax;
# a component without '=' (?token) entirely; punctuation ending a sentence (`URL: ...`) stays
_QUERY_PART = re.compile(r"(?P<sep>[?&;])(?P<key>[^=&;#{},?]*=)?[^&;#{},]*?(?=[&;#{},]|[:.)]*$)")
_WORD = re.compile(r"[^\s'\"]+")
# pipe: commands: a credential is found by its NAME, not by the tool that takes it. A name is auth-like when it holds
# one of these words (a header `PRIVATE-TOKEN:`, an option `--oauth2-bearer`, an assignment `refresh_token=`)
_AUTH = r"(?:token|auth|key|secret|passw(?:or)?d|pass|credential|bearer|session|cookie|signature|sig|private)"
# short words that are auth-like only as a whole part of a name (`--pat`, `X-JFrog-Art-Api:`; not `--path`, `--rapid`)
_AUTH_PART = r"(?:[A-Za-z0-9_.-]*[-_.])?(?:pat|api|pw|pwd|sas|jwt)(?![A-Za-z0-9_.-])"  # the name's last part
_NAME = r"(?:[A-Za-z0-9_.-]*" + _AUTH + r"[A-Za-z0-9_.-]*|" + _AUTH_PART + ")"
_VALUE = r"(?:'[^']*'|\"[^\"]*\"|[^\s'\"]+)"
# `Name: value` (a header; `Credentials:...` of `gsutil -o`): inside quotes up to the quote's end, else one word
_HEADER = re.compile(r"(?P<pre>^|[\s'\"=])(?P<name>" + _NAME + r"\s*:\s*)(?!//)(?P<rest>[^'\"\n]+)", re.IGNORECASE)
# NAME=value: environment variables, `-o section:name=value` options, `key=value` arguments
_ASSIGNMENT = re.compile(r"(?<![A-Za-z0-9_.:-])(?P<name>[A-Za-z0-9_.:-]*" + _AUTH + r"[A-Za-z0-9_.-]*=)" + _VALUE, re.I)
# --auth-like-option value / =value; -u/--user user:password (curl, wget); after a flag (`--anyauth`, `--no-auth`)
# the next option or a URL is not its value
_OPTION = re.compile(
    r"(?<!\S)(?P<name>(?:--?" + _NAME + r"|-u|--user|--proxy-user|--http-user|--ftp-user)(?:=|\s+))"
    r"(?!-|[^\s'\"]*://|" + MASK + r")(?P<value>" + _VALUE + r")",
    re.IGNORECASE,
)
# a password option by its shape: `-pVALUE` attached (7z, mysql, unrar), `-p VALUE` / `-P VALUE` (sshpass, unzip), but
# not a path or a file name (unzip -p a.zip), a number (ssh -p 22) or another option (mkdir -p -v)
_SHORT_PASSWORD = re.compile(
    r"(?<!\S)(?P<name>-[pP](?:\s+)?)(?!-|[^\s'\"]*[/~]|[\w-]+\.[A-Za-z0-9]{1,5}(?:\s|$)|\d+(?:\s|$)|" + MASK + r")"
    r"(?P<value>" + _VALUE + r")"
)
# `$NAME` / `${NAME}`: the shell expands it when the job runs; a reference, not a credential (it stays as written)
_SHELL_REFERENCE = re.compile(r"\$(?:[A-Za-z_][A-Za-z0-9_]*|\{[A-Za-z_][A-Za-z0-9_]*\})")
_remembered: set[str] = set()  # values masked in this process: masked wherever they appear again (error messages)
_MIN_REMEMBERED = 6


def redact_url(text: str) -> str:
    """`text` (a URL, a brace pattern, a `pipe:` command, or a message naming URLs) without credentials:
    userinfo and query values become REDACTED; in a `pipe:` command also every value whose name is auth-like
    (headers, options, NAME=value; see `_AUTH`) and `-u`/`--user` values; and anywhere, a value masked before
    in this process. Text without a URL is returned unchanged."""
    if not isinstance(text, str) or ":" not in text:
        return text
    out = _USERINFO.sub(lambda m: f"{m['scheme']}{MASK}@", text)
    out = _WORD.sub(lambda m: _redact_query(m[0]) if "://" in m[0] or "file:" in m[0] else m[0], out)
    if "pipe:" in out:
        out = _HEADER.sub(_mask_header, out)
        out = _ASSIGNMENT.sub(lambda m: _mask(m, m[0][len(m["name"]) :]), out)
        out = _OPTION.sub(lambda m: _mask(m, m["value"]), out)
        out = _SHORT_PASSWORD.sub(lambda m: _mask(m, m["value"]), out)
    for secret in tuple(_remembered):  # a copy: another thread (a log filter) may add one meanwhile
        out = out.replace(secret, MASK)
    return out


def _mask(match: re.Match, value: str) -> str:
    """The match with its value masked (a quoted value keeps its quotes); the value remembered."""
    bare = value.strip().strip("'\"")
    if bare and _SHELL_REFERENCE.fullmatch(bare.split()[-1]):  # `Bearer $TOKEN`: expanded in the job, never written
        return f"{match['name']}{value}"
    # the value, and the secret inside it: `Bearer T` -> T, `user:password` -> password
    for part in {bare, bare.split()[-1] if bare.split() else "", bare.rpartition(":")[2]}:
        if len(part) >= _MIN_REMEMBERED and MASK not in part:
            _remembered.add(part)
    quote = value[0] if value[:1] in "'\"" and len(value) > 1 and value[-1] == value[0] else ""
    return f"{match['name']}{quote}{MASK}{quote}"


def _mask_header(m: re.Match) -> str:
    """A header's value: inside quotes all of it; unquoted (`Credentials:name=value`) its first word only."""
    if m["pre"] in ("'", '"'):
        return m["pre"] + _mask(m, m["rest"])
    value = m["rest"].split(None, 1)[0]
    return m["pre"] + _mask(m, value) + m["rest"][len(value) :]


def _redact_query(url: str) -> str:
    """Query values of a URL (or of each URL of a brace pattern) masked, from the first '?' on."""
    head, mark, rest = url.partition("?")
    if not mark:
        return url
    return head + _QUERY_PART.sub(lambda m: f"{m['sep']}{m['key'] or ''}{MASK}", mark + rest)


def redact_config(cfg: Any) -> Any:
    """A plain copy of a config (an OmegaConf node, dict, list or value) with every string passed through
    `redact_url`; the argument itself is left as it is."""
    from omegaconf import DictConfig, ListConfig, OmegaConf

    if isinstance(cfg, (DictConfig, ListConfig)):
        cfg = OmegaConf.to_container(cfg, resolve=True)
    if isinstance(cfg, dict):
        return {k: redact_config(v) for k, v in cfg.items()}
    if isinstance(cfg, (list, tuple)):
        return type(cfg)(redact_config(v) for v in cfg)
    return redact_url(cfg) if isinstance(cfg, str) else cfg


def literal_credentials(cfg: Any, key: str = "") -> list[str]:
    """The dotted keys of `cfg` (a config node, dict, list, dataclass or value) whose text holds a credential, i.e.
    what `redact_config` would mask. A reference the shell expands in the job (`$TOKEN`) is none."""
    import dataclasses

    from omegaconf import DictConfig, ListConfig, OmegaConf

    if isinstance(cfg, (DictConfig, ListConfig)):
        cfg = OmegaConf.to_container(cfg, resolve=False)
    elif dataclasses.is_dataclass(cfg) and not isinstance(cfg, type):
        cfg = {f.name: getattr(cfg, f.name) for f in dataclasses.fields(cfg)}
    if isinstance(cfg, dict):
        return [k for name, v in cfg.items() for k in literal_credentials(v, f"{key}.{name}" if key else str(name))]
    if isinstance(cfg, (list, tuple)):
        return [k for i, v in enumerate(cfg) for k in literal_credentials(v, f"{key}[{i}]")]
    return [key or "value"] if isinstance(cfg, str) and redact_url(cfg) != cfg else []


def is_redacted(text: Any) -> bool:
    """Whether a value read back from a run's files had credentials removed (it cannot be used as is)."""
    return isinstance(text, str) and (f"={MASK}" in text or f"{MASK}@" in text or f"?{MASK}" in text)


def saved_value_usable(value: Any, key: str, config: Any) -> None:
    """Refuse (ValueError, one line) a value read back from a run's saved `config` file that was redacted there:
    the credential it needs is not on disk, so the command line has to give the value again."""
    values = value if isinstance(value, (list, tuple)) else [value]
    if any(is_redacted(v) for v in values):
        raise ValueError(
            f"{key} in {config} was saved without its credentials ({MASK}): pass {key}=... "
            f"(with them) on the command line"
        )


class RedactingFilter(logging.Filter):
    """A log handler's filter: the formatted message without credentials."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        redacted = redact_url(message)
        if redacted != message:
            record.msg, record.args = redacted, None
        return True


def redact_logs() -> None:
    """Every handler of the root logger redacts what it writes (once per handler, however often called)."""
    for handler in logging.getLogger().handlers:
        if not any(isinstance(f, RedactingFilter) for f in handler.filters):
            handler.addFilter(RedactingFilter())


@contextlib.contextmanager
def redacted_argv():
    """sys.argv without credentials for the duration (libraries that record the command line, e.g. wandb)."""
    saved = sys.argv
    sys.argv = [redact_url(a) for a in saved]
    try:
        yield
    finally:
        sys.argv = saved


def redact_yaml_file(path: str | os.PathLike) -> None:
    """Rewrite a YAML file another library wrote for eigtrain (Hydra's multirun.yaml) without credentials;
    interpolations stay as they are."""
    from omegaconf import OmegaConf

    path = Path(path)
    if not path.is_file():
        return
    saved = OmegaConf.to_container(OmegaConf.load(path), resolve=False)
    redacted = redact_config(saved)
    if redacted != saved:
        safe_files.write_text(path, OmegaConf.to_yaml(OmegaConf.create(redacted)))
