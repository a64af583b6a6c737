"""The marker of a shard write in progress: `write_shards` creates ``OUT/.eigtrain-writing`` before its first shard
and removes it after ``index.json``, so a directory holding the marker and no index is eigtrain's own interrupted
write (killed, out of time, Ctrl-C). The next write removes exactly what that write made (shard names it gives and
their ``.tmp`` files) and starts again; anything else in the directory, or a writer still alive, is refused.
"""

from __future__ import annotations

import json
import os
import re
import socket
from pathlib import Path

from eigtrain import safe_files

MARKER = ".eigtrain-writing"
# what write_shards names a file: shards, their temporaries, the index's temporary (eigtrain.safe_files, or older)
_OWN = re.compile(r"^[A-Za-z0-9_.-]+-\d{6}\.tar(\.tmp)?$|^index\.json\.tmp$|^\.index\.json\.[0-9a-f]{12}\.tmp$")


def begin(out: Path) -> None:
    """Mark `out` as being written by this process (before any shard)."""
    record = {"pid": os.getpid(), "host": socket.gethostname()}
    path = Path(out) / MARKER
    safe_files.write_text(path, json.dumps(record) + "\n")


def finish(out: Path) -> None:
    """The write is complete (its index written): `out` is no longer an interrupted write."""
    (Path(out) / MARKER).unlink(missing_ok=True)


def clear_interrupted(out: Path) -> bool:
    """If `out` holds an interrupted write of eigtrain's and nothing else, remove that write's files (True);
    False when there is no marker. `FileExistsError`, one line, when the writer may still be running or another
    file lies beside the write's: then nothing is removed."""
    out = Path(out)
    marker = out / MARKER
    if not marker.is_file():
        return False
    writer = _writer(marker)
    if writer is not None:
        raise FileExistsError(f"{out} is being written by {writer} ({marker}); wait for it, or stop it")
    others = sorted(p.name for p in out.iterdir() if p.name != MARKER and not (_OWN.match(p.name) and p.is_file()))
    if others:
        raise FileExistsError(
            f"{out} holds an interrupted eigtrain write ({MARKER}) and files it did not write ({', '.join(others[:3])}"
            f"{' ...' if len(others) > 3 else ''}): refusing to touch it (nothing was changed); choose another directory"
        )
    for path in out.iterdir():
        if path.name != MARKER:
            path.unlink()
    marker.unlink()  # last: a write killed during this clean-up is still recognised next time
    return True


def _writer(marker: Path) -> str | None:
    """'pid N on HOST' when the marker's writer may still be running: alive on this host, or on another host
    (which cannot be checked from here); None when it is gone (or the marker is unreadable: a write killed as it
    wrote the marker)."""
    try:
        record = json.loads(marker.read_text())
        pid, host = int(record["pid"]), str(record["host"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if host != socket.gethostname():
        return f"pid {pid} on {host}"
    if pid == os.getpid():
        return f"pid {pid} (this process)"
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return None
    except PermissionError:  # alive, another user's
        pass
    return f"pid {pid} on {host}"
