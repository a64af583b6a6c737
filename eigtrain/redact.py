"""Credentials out of everything eigtrain writes or logs: URLs keep their scheme, host and path (so shards can
still be told apart) but lose userinfo (`https://user:pass@host`) and query values (`?X-Amz-Signature=...`).

The live config keeps the real values (the run needs them); only what is persisted or printed is redacted:
config.yaml, wandb's config, the shard-count cache, sweep directory names, the Rayleigh-Ritz manifest and error
messages naming a shard.
"""

from __future__ import annotations

import re
from typing import Any

MASK = "REDACTED"

# scheme://userinfo@ : userinfo runs to the last '@' before the host's end (a password may hold '@'; '/' ends it)
_USERINFO = re.compile(r"(?P<scheme>\b[A-Za-z][A-Za-z0-9+.-]*://)[^/?#\s'\"@]*(?:@[^/?#\s'\"@]*)*@")
# inside a URL: ?key=value&key=value (also `;`): each value up to the next separator or brace-pattern syntax;
# a component without '=' (?token) entirely; punctuation ending a sentence (`URL: ...`) stays
_QUERY_PART = re.compile(r"(?P<sep>[?&;])(?P<key>[^=&;#{},?]*=)?[^&;#{},]*?(?=[&;#{},]|[:.)]*$)")
_WORD = re.compile(r"[^\s'\"]+")
# pipe: commands: credentials passed as headers or environment variables
_HEADER = re.compile(r"(?P<name>\b(?:Authorization|Proxy-Authorization|Cookie|X-[A-Za-z-]*(?:Token|Key|Auth)[A-Za-z-]*)"
                     r"\s*:\s*)[^'\"\n]+", re.IGNORECASE)
_SECRET_ASSIGNMENT = re.compile(r"(?P<name>\b[A-Za-z_]*(?:TOKEN|SECRET|PASSWORD|PASSWD|KEY|CREDENTIALS?)"
                                r"[A-Za-z_0-9]*=)[^\s'\"]+", re.IGNORECASE)


def redact_url(text: str) -> str:
    """`text` (a URL, a brace pattern, a `pipe:` command, or a message naming URLs) without credentials:
    userinfo and query values become REDACTED; in a `pipe:` command also authorization headers and
    TOKEN/SECRET/PASSWORD/KEY=... assignments. Text without a URL is returned unchanged."""
    if not isinstance(text, str) or ":" not in text:
        return text
    out = _USERINFO.sub(lambda m: f"{m['scheme']}{MASK}@", text)
    out = _WORD.sub(lambda m: _redact_query(m[0]) if "://" in m[0] or "file:" in m[0] else m[0], out)
    if "pipe:" in out:
        out = _HEADER.sub(lambda m: f"{m['name']}{MASK}", out)
        out = _SECRET_ASSIGNMENT.sub(lambda m: f"{m['name']}{MASK}", out)
    return out


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


def is_redacted(text: Any) -> bool:
    """Whether a value read back from a run's files had credentials removed (it cannot be used as is)."""
    return isinstance(text, str) and (f"={MASK}" in text or f"{MASK}@" in text or f"?{MASK}" in text)
