"""Sample counts of shards without an eigtrain ``index.json``, reading as little as possible.

    counts = shard_counts(expand_shards(PATTERN), cache_dir="runs/x/data")

First that applies: a `wids` shard index (``{"wids_version": 1, "shardlist": [{"url", "nsamples"}, ...]}``,
written by ``eigtrain-shards index PATTERN``) given explicitly or found next to the shards as
``wids-index.json``; eigtrain's own ``index.json`` next to the shards; a scan that reads every shard once,
cached in `cache_dir` (beside the run, never in the data's location).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import posixpath
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import cast
from urllib.parse import urljoin, urlparse
from urllib.request import urlopen

from eigtrain import safe_files
from eigtrain.data.bounded_io import call_within
from eigtrain.data.shards import (
    DEFAULT_TIMEOUT_S,
    FSSPEC_SCHEMES,
    ShardError,
    count_samples,
    local_path,
    open_url,
    scheme,
)
from eigtrain.data.url_auth import http_request
from eigtrain.redact import redact_url

log = logging.getLogger(__name__)

WIDS_INDEX_NAME = "wids-index.json"
EIGTRAIN_INDEX_NAME = "index.json"


def read_wids_index(location: str, timeout_s: float = DEFAULT_TIMEOUT_S) -> dict[str, int]:
    """{absolute shard URL: sample count} of a wids shard index (relative URLs are relative to the index)."""
    with open_url(location, timeout_s) as f:
        raw = json.loads(f.read())
    if not isinstance(raw, dict) or not isinstance(raw.get("shardlist"), list):
        raise ValueError(f"{location} is not a wids shard index (a JSON object with a 'shardlist' list)")
    counts = {}
    for entry in raw["shardlist"]:
        counts[_resolve(location, entry["url"])] = int(entry["nsamples"])
    return counts


def write_wids_index(out: str | os.PathLike, urls: list[str], counts: list[int], name: str = "") -> Path:
    """Write a wids shard index; URLs of shards in the index's own directory are stored relative to it."""
    out = Path(out)
    base = out.resolve().parent
    entries = []
    for url, n in zip(urls, counts):
        path = local_path(url)
        if path is not None and path.resolve().parent == base:
            url = path.name
        entries.append({"url": redact_url(url), "nsamples": int(n)})  # an index persists no credential
    payload = {"__kind__": "wids-shard-index-v1", "wids_version": 1, "name": name, "shardlist": entries}
    safe_files.write_text(out, json.dumps(payload, indent=1) + "\n")
    return out


def _resolve(index_location: str, url: str) -> str:
    if scheme(url) or os.path.isabs(url):
        return url
    path = local_path(index_location)
    if path is not None:
        return str(path.parent / url)
    return urljoin(index_location, url)


def _sibling(url: str, name: str) -> str | None:
    """`name` in the directory of shard `url` (None for pipe: commands)."""
    path = local_path(url)
    if path is not None:
        return str(path.parent / name)
    if scheme(url) == "pipe":
        return None
    parsed = urlparse(url)
    return parsed._replace(path=posixpath.join(posixpath.dirname(parsed.path), name), query="").geturl()


def known_counts(urls: list[str], shard_index: str | None, timeout_s: float) -> dict[str, int]:
    """Counts from an explicit index, or from a wids or eigtrain index found in the shards' directories."""
    if shard_index:
        return _keyed_by(urls, read_wids_index(shard_index, timeout_s))
    first_of_dir: dict[str, str] = {}
    for url in urls:
        if (directory := _sibling(url, "")) is not None:
            first_of_dir.setdefault(directory, url)
    counts: dict[str, int] = {}
    for url in list(first_of_dir.values())[:8]:  # shards usually share one directory; look in a few at most
        for name, reader in ((WIDS_INDEX_NAME, read_wids_index), (EIGTRAIN_INDEX_NAME, _read_eigtrain_counts)):
            try:
                index = cast(str, _sibling(url, name))  # None only for pipe: URLs, which first_of_dir leaves out
                counts.update(reader(index, min(timeout_s, 10.0)))
            except (OSError, ValueError, KeyError, TypeError, AttributeError):
                continue  # no index there (or not one we read): the scan covers those shards
    return _keyed_by(urls, counts)


def _keyed_by(urls: list[str], counts: dict[str, int]) -> dict[str, int]:
    """`counts` also under each of `urls` whose entry an index holds without credentials (as eigtrain writes it)."""
    return {**counts, **{u: counts[redact_url(u)] for u in urls if u not in counts and redact_url(u) in counts}}


def _read_eigtrain_counts(location: str, timeout_s: float) -> dict[str, int]:
    with open_url(location, min(timeout_s, 10.0)) as f:
        raw = json.loads(f.read())
    return {
        _resolve(location, name): int(n)
        for split, shards in raw.items()
        if split != "meta"
        for name, n in shards.items()
    }


def shard_counts(
    urls: list[str],
    cache_dir: str | os.PathLike | None = None,
    shard_index: str | None = None,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    scan_threads: int = 16,
) -> list[int]:
    """Sample count of every shard: from an index when there is one, else from a scan cached in `cache_dir`."""
    for url in urls:  # a missing local shard is reported before anything else happens
        path = local_path(url)
        if path is not None and not path.is_file():
            raise ShardError(f"shard {url} does not exist")
    known = known_counts(urls, shard_index, timeout_s)
    if shard_index:
        missing = [u for u in urls if u not in known]
        if missing:
            raise ValueError(f"{len(missing)} shards are not in the shard index {shard_index}, e.g. {missing[0]}")
    todo = [u for u in urls if u not in known]
    if todo:
        known.update(_scanned_counts(todo, cache_dir, timeout_s, scan_threads))
    return [known[u] for u in urls]


def _cache_file(cache_dir: Path, urls: list[str]) -> Path:
    digest = hashlib.sha256("\n".join(map(redact_url, urls)).encode()).hexdigest()[:16]  # no credential in a name
    return cache_dir / f"shard-counts-{digest}.json"


def shard_version(url: str, timeout_s: float = DEFAULT_TIMEOUT_S) -> list | None:
    """What the store says identifies this upload of the shard, for the count cache: a local file's size and mtime,
    an HTTP server's ETag / Last-Modified / Content-Length (a HEAD request), an object store's ETag / modification
    time / size (fsspec's info); None where nothing is known (pipe: commands, a server that answers no HEAD)."""
    path = local_path(url)
    if path is not None:
        stat = path.stat()
        return [stat.st_size, stat.st_mtime_ns]
    kind = scheme(url)
    try:
        if kind in ("http", "https"):
            with urlopen(http_request(url, method="HEAD"), timeout=timeout_s) as answer:
                found = [answer.headers.get(h) for h in ("ETag", "Last-Modified", "Content-Length")]
        elif kind in FSSPEC_SCHEMES:
            found = _object_version(call_within(lambda: _object_info(url), timeout_s, url))
        else:
            return None
    except (OSError, ValueError, ImportError):
        return None
    return found if any(v is not None for v in found) else None


def _object_info(url: str) -> dict:
    import fsspec

    fs, path = fsspec.core.url_to_fs(url)
    return fs.info(path)


def _object_version(info: dict) -> list:
    keys = ("ETag", "etag", "generation", "md5Hash", "LastModified", "last_modified", "mtime", "updated", "size")
    return [str(info[k]) if info.get(k) is not None else None for k in keys]


def _scanned_counts(urls: list[str], cache_dir, timeout_s: float, threads: int) -> dict[str, int]:
    names = [redact_url(u) for u in urls]  # what the cache file stores: the URLs without credentials
    cache = _cache_file(Path(cache_dir), urls) if cache_dir is not None else None
    if cache is not None:  # taken before any scan: a shard re-uploaded while it is counted is counted again next time
        with ThreadPoolExecutor(max(1, min(threads, len(urls)))) as pool:
            versions = list(pool.map(lambda u: shard_version(u, min(timeout_s, 10.0)), urls))
    if cache is not None and cache.is_file():
        cached = json.loads(cache.read_text())
        if cached.get("urls") == names and cached.get("versions") == versions:
            return dict(zip(urls, cached["counts"]))
        log.warning("shard count cache %s does not match the shards (changed or re-uploaded): scanning again", cache)
    log.info(
        "counting the samples of %d shards (one read of each; cached%s)",
        len(urls),
        f" in {cache}" if cache else " nowhere: pass a cache directory",
    )
    with ThreadPoolExecutor(max(1, min(threads, len(urls)))) as pool:
        counts = list(pool.map(lambda u: count_samples(u, timeout_s), urls))
    if cache is not None:
        cache.parent.mkdir(parents=True, exist_ok=True)
        safe_files.write_text(cache, json.dumps({"urls": names, "versions": versions, "counts": counts}) + "\n")
    return dict(zip(urls, counts))
