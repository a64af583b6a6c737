"""Shards from anywhere: brace patterns and URL lists, one opener for every kind of URL, and sample counts
without an eigtrain ``index.json``.

    urls = expand_shards("https://host/imagenet-train-{000000..001023}.tar")
    counts = shard_counts(urls, cache_dir="runs/x/data")

URLs: local paths, ``file:``, ``http(s)://``, ``pipe:CMD`` (runs the shell command CMD, which writes the tar to
stdout), and object stores
(``s3://``, ``gs://``, ... through fsspec when its backend, e.g. s3fs or gcsfs, is installed; otherwise
webdataset's `gopen` handlers, e.g. gsutil for ``gs://``; ``pipe:aws s3 cp URL -`` always works). Every read of a
remote shard is bounded by the timeout (``data.io_timeout_s``), so a stalled server or command is an error naming
it, never a hang.

Sample counts, first that applies: a `wids` shard index (``{"wids_version": 1, "shardlist": [{"url", "nsamples"},
...]}``, written by ``eigtrain-shards index PATTERN``) given explicitly or found next to the shards as
``wids-index.json``; eigtrain's own ``index.json`` next to the shards; a scan that reads every shard once,
cached in `cache_dir` (beside the run, never in the data's location).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import posixpath
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Iterable, Sequence
from urllib.error import HTTPError, URLError
from urllib.parse import urljoin, urlparse
from urllib.request import Request, url2pathname, urlopen

import webdataset as wds
from braceexpand import braceexpand
from webdataset.gopen import gopen_schemes

from .bounded_io import bounded, call_within, open_pipe

from ..redact import redact_url

log = logging.getLogger(__name__)

WIDS_INDEX_NAME = "wids-index.json"
EIGTRAIN_INDEX_NAME = "index.json"
FSSPEC_SCHEMES = ("s3", "s3a", "gs", "gcs", "az", "abfs", "abfss", "adl", "oci", "hdfs", "webhdfs")
DEFAULT_TIMEOUT_S = 60.0
READ_RETRIES = 2  # further reads of a network shard whose read failed midway
OPEN_RETRIES = 2  # further attempts to open a network shard after a failure that may pass
TRANSIENT_HTTP = (408, 425, 429)  # the 4xx answers that mean "later", not "never"


class ShardError(OSError):
    """A shard that cannot be opened or read; the message names it (without credentials: it is printed and logged)."""

    def __init__(self, message: str):
        super().__init__(redact_url(message))


class PermanentShardError(ShardError):
    """A shard the store says is not there or not for us (HTTP 404, 403, no such file): retrying cannot help."""


def expand_shards(shards: str | Sequence[str]) -> list[str]:
    """URLs of a brace pattern (``dir/train-{000000..000099}.tar``) or a list of patterns/URLs, in order."""
    items = [shards] if isinstance(shards, (str, os.PathLike)) else list(shards)
    urls = [url for item in items for url in braceexpand(str(item))]
    if not urls:
        raise ValueError(f"data.shards={shards!r} names no shards")
    seen = set()
    for url in urls:
        if url in seen:
            raise ValueError(f"shard {url} occurs twice in data.shards={shards!r}")
        seen.add(url)
    return urls


def scheme(url: str) -> str:
    parsed = urlparse(url)
    return "" if len(parsed.scheme) == 1 else parsed.scheme  # "C:" is a drive letter, not a scheme


def local_path(url: str) -> Path | None:
    """The file of a local path or ``file:`` URL; None for anything else."""
    kind = scheme(url)
    if kind == "":
        return Path(url)
    if kind == "file":
        return Path(url2pathname(urlparse(url).path))
    return None


def open_url(url: str, timeout_s: float = DEFAULT_TIMEOUT_S):
    """A binary file object reading `url`, every read bounded by `timeout_s`; `ShardError` naming the URL when it
    cannot be opened. A network failure that may pass (HTTP 5xx/408/429, a reset, no answer) is retried
    `OPEN_RETRIES` times with backoff; one that cannot (404, 403, a missing object) is a `PermanentShardError` at
    once."""
    path = local_path(url)
    if path is not None:
        try:
            return open(path, "rb")
        except FileNotFoundError:
            raise PermanentShardError(f"shard {url} does not exist") from None
        except OSError as exn:
            raise PermanentShardError(f"cannot open shard {url}: {exn.strerror or exn}") from None
    for attempt in range(OPEN_RETRIES + 1):
        try:
            return _open_remote(url, timeout_s)
        except PermanentShardError:
            raise
        except ShardError as exn:
            if attempt == OPEN_RETRIES:
                raise
            log.warning("%s; retrying in %.2g s (%d/%d)", exn, backoff_s(attempt), attempt + 1, OPEN_RETRIES)
            time.sleep(backoff_s(attempt))


def backoff_s(attempt: int) -> float:
    return 0.25 * 2 ** attempt


def _open_remote(url: str, timeout_s: float):
    kind = scheme(url)
    try:
        if kind in ("http", "https"):
            return urlopen(url, timeout=timeout_s)  # the socket timeout bounds the connection and every read
        if kind == "pipe":
            return open_pipe(url, timeout_s)
        if kind in FSSPEC_SCHEMES:
            return bounded(call_within(lambda: _open_object_store(url), timeout_s, url), timeout_s, url)
        return bounded(wds.gopen(url, "rb"), timeout_s, url)  # webdataset's other handlers
    except HTTPError as exn:
        error = ShardError if exn.code >= 500 or exn.code in TRANSIENT_HTTP else PermanentShardError
        raise error(f"cannot open shard {url}: HTTP {exn.code} {exn.reason}") from None
    except URLError as exn:
        raise ShardError(f"cannot reach shard {url}: {exn.reason}") from None
    except (FileNotFoundError, PermissionError) as exn:  # an object store's missing or forbidden object
        what = "does not exist" if isinstance(exn, FileNotFoundError) else f"is not readable: {exn}"
        raise PermanentShardError(f"shard {url} {what}") from None
    except ShardError:
        raise
    except Exception as exn:
        raise ShardError(f"cannot open shard {url}: {type(exn).__name__}: {exn}") from None


def _open_object_store(url: str):
    import fsspec

    try:
        return fsspec.open(url, "rb").open()
    except ImportError as exn:  # fsspec has no backend for this scheme installed
        if scheme(url) in gopen_schemes:
            return wds.gopen(url, "rb")
        raise ShardError(
            f"cannot open shard {url}: {exn}; install the fsspec backend (s3fs for s3://, gcsfs for gs://) or "
            f"name the shards as pipe: commands, e.g. 'pipe:aws s3 cp {url} -'"
        ) from None


def iter_samples(url: str, stream) -> Iterable[dict]:
    """Samples of one tar stream, grouped by key as webdataset does (``__url__`` set to `url`)."""
    files = ({**f, "__url__": url} for f in wds.tariterators.tar_file_iterator(stream))
    return wds.tariterators.group_by_keys(files)


def complete_samples(url: str, stream) -> Iterable[dict]:
    """`iter_samples`, but each sample is handed on only once the next one has started or the whole stream was
    read: the last group of a cut read may lack members, and then it is not delivered (the read raises)."""
    pending = None
    for sample in iter_samples(url, stream):
        if pending is not None:
            yield pending
        pending = sample
    if getattr(stream, "length", None):  # HTTP: drain the tar's padding; bytes still missing = a cut transfer
        stream.read()
        if stream.length:
            raise OSError(f"the transfer of {url} ended {stream.length} bytes before its Content-Length")
    if pending is not None:
        yield pending


def count_samples(url: str, timeout_s: float = DEFAULT_TIMEOUT_S) -> int:
    """Samples in one shard, by reading it once; `ShardError` naming it when it cannot be read to the end. A network
    read that fails midway (a reset, a stall) is started again `READ_RETRIES` times, with backoff."""
    retries = 0 if local_path(url) is not None else READ_RETRIES  # a damaged local file stays damaged
    for attempt in range(retries + 1):
        n, stream = 0, open_url(url, timeout_s)
        try:
            for _ in complete_samples(url, stream):
                n += 1
            return n
        except Exception as exn:
            error = f"{type(exn).__name__}: {exn}"
        finally:
            try:
                stream.close()
            except Exception:  # a pipe: command's exit status; the error above already names the shard
                pass
        if attempt < retries:
            log.warning("reading shard %s failed after %d samples (%s); reading it again (%d/%d)", url, n, error,
                        attempt + 1, retries)
            time.sleep(backoff_s(attempt))
    raise ShardError(
        f"shard {url} cannot be read to its end after {n} samples ({error}): it is truncated or unreachable; "
        f"repair it or leave it out of data.shards")


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
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_text(json.dumps(payload, indent=1) + "\n")
    os.replace(tmp, out)
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
                counts.update(reader(_sibling(url, name), min(timeout_s, 10.0)))
            except (OSError, ValueError, KeyError, TypeError, AttributeError):
                continue  # no index there (or not one we read): the scan covers those shards
    return _keyed_by(urls, counts)


def _keyed_by(urls: list[str], counts: dict[str, int]) -> dict[str, int]:
    """`counts` also under each of `urls` whose entry an index holds without credentials (as eigtrain writes it)."""
    return {**counts, **{u: counts[redact_url(u)] for u in urls if u not in counts and redact_url(u) in counts}}


def _read_eigtrain_counts(location: str, timeout_s: float) -> dict[str, int]:
    with open_url(location, min(timeout_s, 10.0)) as f:
        raw = json.loads(f.read())
    return {_resolve(location, name): int(n) for split, shards in raw.items() if split != "meta"
            for name, n in shards.items()}


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
            with urlopen(Request(url, method="HEAD"), timeout=timeout_s) as answer:
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
    log.info("counting the samples of %d shards (one read of each; cached%s)", len(urls),
             f" in {cache}" if cache else " nowhere: pass a cache directory")
    with ThreadPoolExecutor(max(1, min(threads, len(urls)))) as pool:
        counts = list(pool.map(lambda u: count_samples(u, timeout_s), urls))
    if cache is not None:
        cache.parent.mkdir(parents=True, exist_ok=True)
        tmp = cache.with_name(cache.name + f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps({"urls": names, "versions": versions, "counts": counts}) + "\n")
        os.replace(tmp, cache)
    return dict(zip(urls, counts))
