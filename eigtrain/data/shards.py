"""Shards from anywhere: brace patterns and URL lists, one opener for every kind of URL, and reading a shard's
samples (counting them by one read).

    urls = expand_shards("https://host/imagenet-train-{000000..001023}.tar")
    samples = complete_samples(urls[0], open_url(urls[0]))

URLs: local paths, ``file:``, ``http(s)://``, ``pipe:CMD`` (runs the shell command CMD, which writes the tar to
stdout), and object stores
(``s3://``, ``gs://``, ... through fsspec when its backend, e.g. s3fs or gcsfs, is installed; otherwise
webdataset's `gopen` handlers, e.g. gsutil for ``gs://``; ``pipe:aws s3 cp URL -`` always works). Every read of a
remote shard is bounded by the timeout (``data.io_timeout_s``), so a stalled server or command is an error naming
it, never a hang.

The sample counts of many shards without an eigtrain ``index.json`` (an index, else a cached scan):
`eigtrain.data.sample_counts`.
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path
from typing import Iterable, Sequence
from urllib.error import HTTPError, URLError
from urllib.parse import urlparse
from urllib.request import url2pathname, urlopen

import webdataset as wds
from braceexpand import braceexpand
from webdataset.gopen import gopen_schemes

from eigtrain.data.bounded_io import bounded, call_within, open_pipe
from eigtrain.data.tar_members import tar_files
from eigtrain.data.url_auth import http_request
from eigtrain.redact import redact_url

log = logging.getLogger(__name__)

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
    return 0.25 * 2**attempt


def _open_remote(url: str, timeout_s: float):
    kind = scheme(url)
    try:
        if kind in ("http", "https"):
            return urlopen(http_request(url), timeout=timeout_s)  # the socket timeout bounds connection and reads
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
    files = ({**f, "__url__": url} for f in tar_files(stream))
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
            log.warning(
                "reading shard %s failed after %d samples (%s); reading it again (%d/%d)",
                url,
                n,
                error,
                attempt + 1,
                retries,
            )
            time.sleep(backoff_s(attempt))
    raise ShardError(
        f"shard {url} cannot be read to its end after {n} samples ({error}): it is truncated or unreachable; "
        f"repair it or leave it out of data.shards"
    )
