"""The bad-input matrix: the real commands (eigtrain-rr, -train, -shards, -eval through their entry points, in this
process) against bad shards on disk and behind a fault-injecting HTTP server on 127.0.0.1 (tests/support/fault_server.py),
bad command lines and bad output places. Each case states what eigtrain does: one line naming the cause (exit code
2 or a SystemExit message), or a completed run; nothing hangs (every case runs under a timeout) and no user file or
finished work is lost (the user's files are hashed before and after). docs/bad-input.md's table is this one.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import os
import re
import shutil
import subprocess
import sys
import tarfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import pytest
import torch
from PIL import Image

from tests.support.fault_server import FaultServer
from tests.support.foreign_shards import good_samples, write_shard

pytestmark = [
    pytest.mark.timeout(120),
    pytest.mark.filterwarnings("ignore:The image decoding and encoding capabilities:DeprecationWarning"),
]

ENCODER = "encoder=module:tests.safety.test_bad_input:tiny_encoder"


def tiny_encoder() -> torch.nn.Module:
    """The encoder of the eigtrain-rr cases: any images -> 4 features."""
    return torch.nn.Sequential(torch.nn.AdaptiveAvgPool2d(2), torch.nn.Flatten(), torch.nn.Linear(12, 4))


# ---------------------------------------------------------------------------------------------- the world


@dataclass
class World:
    """What a case works with: a shard directory (also served over HTTP), a place for outputs, the user's files."""

    tmp: Path
    shards: Path
    server: FaultServer
    user_files: list[Path] = field(default_factory=list)

    def shard(self, name: str, samples: list[dict]) -> Path:
        return write_shard(self.shards / name, samples)

    def raw(self, name: str, data: bytes) -> Path:
        path = self.shards / name
        path.write_bytes(data)
        return path

    def unchanged(self, command: Callable[[], "Outcome"]) -> "Outcome":
        """Run a command; the shards and the user's files must be byte for byte as they were before it."""
        files = self.user_files + sorted(self.shards.iterdir())
        before = digest(files)
        outcome = command()
        assert digest(files) == before, "a command changed or removed a user's file"
        return outcome

    def user_dir(self, name: str) -> Path:
        """A directory of the user's (a finished training run): must survive every command untouched."""
        directory = self.tmp / name
        (directory / "step-00000010").mkdir(parents=True)
        for file in (directory / "step-00000010" / "model.pt", directory / "notes.txt"):
            file.write_bytes(os.urandom(64))
            self.user_files.append(file)
        return directory


@pytest.fixture
def world(tmp_path):
    shards = tmp_path / "shards"
    shards.mkdir()
    write_shard(shards / "good-0.tar", good_samples("g0", 6))
    write_shard(shards / "good-1.tar", good_samples("g1", 6))
    with FaultServer(shards) as server:
        yield World(tmp_path, shards, server)


def digest(files: list[Path]) -> dict:
    return {str(f): hashlib.sha256(f.read_bytes()).hexdigest() if f.exists() else None for f in files}


@dataclass
class Outcome:
    code: int
    message: str  # what the command printed last on stderr / its SystemExit message


def rr(world: World, *args: str) -> Outcome:
    """eigtrain-rr with the tiny encoder over data.shards (the args' `data.shards=` etc.), in this process."""
    from eigtrain.export.command import main

    base = ["num_workers=0", "batch_size=4", "device=cpu"]
    if not any(a.startswith(("run_dir=", "checkpoint=")) for a in args):  # a run brings its encoder and data
        base += [
            ENCODER,
            "data.image_size=8",
            "data.augment=cifar",
            f"data.cache_dir={world.tmp / 'cache'}",
            "data.io_timeout_s=1",
        ]
    names = {a.partition("=")[0] for a in args}
    argv = [a for a in base if a.partition("=")[0] not in names] + list(args)
    if not any(a.startswith("out=") for a in argv):
        argv.append(f"out={world.tmp / 'export'}")
    stderr = io.StringIO()
    with _redirect_stderr(stderr):
        code = world.unchanged(lambda: main(argv))
    return Outcome(code, _last_line(stderr.getvalue()))


def train(world: World, *overrides: str) -> Outcome:
    """eigtrain-train (Hydra app) in this process: its exit code and one-line message."""
    from eigtrain.train.command import main

    saved = sys.argv
    sys.argv = ["eigtrain-train", *overrides]
    try:
        return world.unchanged(lambda: _exit_outcome(main))
    finally:
        sys.argv = saved


def shards_index(world: World, pattern: str, *args: str) -> Outcome:
    from eigtrain.data.write import main

    return world.unchanged(
        lambda: _exit_outcome(lambda: main(["index", pattern, f"out={world.tmp / 'index.json'}", *args]))
    )


def _exit_outcome(main: Callable[[], object]) -> Outcome:
    try:
        main()
        return Outcome(0, "")
    except SystemExit as exit:
        return Outcome(1 if exit.code else 0, str(exit.code or ""))


def _last_line(text: str) -> str:
    lines = [line for line in text.splitlines() if line.strip() and not line.startswith(("WARNING", "INFO"))]
    return lines[-1] if lines else ""


class _redirect_stderr:
    def __init__(self, buffer):
        self.buffer = buffer

    def __enter__(self):
        self.saved, sys.stderr = sys.stderr, self.buffer

    def __exit__(self, *exc):
        sys.stderr = self.saved


def png(mode: str) -> bytes:
    """A PNG in a mode other than RGB (16-bit gray "I;16", gray with alpha "LA", palette "P")."""
    buffer = io.BytesIO()
    Image.new(mode, (8, 8), 300 if mode == "I;16" else None).save(buffer, format="PNG")
    return buffer.getvalue()


def good_with(name_prefix: str, n: int, index: int, **change) -> list[dict]:
    samples = good_samples(name_prefix, n)
    samples[index] = {k: v for k, v in {**samples[index], **change}.items() if v is not None}
    return samples


# ---------------------------------------------------------------------------------------------- the cases
# Each case: (set-up and command, what must hold of the outcome). Short regexes of the one line eigtrain prints.


def local(world, names):
    return str(world.shards / names)


def missing_local(world):
    return rr(world, f"data.shards={local(world, 'good-{0..2}.tar')}")


def http_status(status):
    def case(world):
        world.server.faults["/good-1.tar"] = [status]
        outcome = rr(world, f"data.shards={world.server.url('good-{0..1}.tar')}")
        assert world.server.gets("good-1.tar") == 1  # permanent: never retried
        return outcome

    return case


def http_flaky(*faults):
    def case(world):
        world.server.faults["/good-1.tar"] = list(faults)
        return rr(world, f"data.shards={world.server.url('good-{0..1}.tar')}")

    return case


def http_stalled(world):
    world.server.faults["/good-1.tar"] = ["stall"]
    return rr(world, f"data.shards={world.server.url('good-{0..1}.tar')}", "data.io_timeout_s=0.5")


def damaged(kind):
    def case(world):
        whole = (world.shards / "good-1.tar").read_bytes()
        with tarfile.open(world.shards / "good-1.tar") as tar:
            cut = tar.getmembers()[-1].offset_data + 10  # inside the last member's data
        data = {"truncated": whole[:cut], "empty": b"", "not_tar": os.urandom(3000)}[kind]
        world.raw("good-1.tar", data)
        return rr(world, f"data.shards={local(world, 'good-{0..1}.tar')}")

    return case


def bad_sample(**change):
    def case(world):
        world.shard("good-1.tar", good_with("b1", 6, 3, **change))
        return rr(world, f"data.shards={local(world, 'good-{0..1}.tar')}", "data.label_key=cls")

    return case


def all_bad(world):
    world.shard("good-1.tar", [{"__key__": f"x-{i}", "jpg": b"\xff\xd8 garbage"} for i in range(6)])
    return rr(world, f"data.shards={local(world, 'good-{0..1}.tar')}", "data.max_corrupt=3")


def token_url(world):
    secret = "S3cr3tS1gnature"
    outcome = rr(world, f"data.shards={world.server.url('good-{0..1}.tar')}?X-Amz-Signature={secret}")
    written = [p for p in world.tmp.rglob("*") if p.is_file() and secret.encode() in p.read_bytes()]
    assert outcome.code == 0 and secret not in outcome.message and not written, written
    return outcome


def userinfo_url(world):
    """http://user:password@host: read with them (it failed to resolve), stored without."""
    secret = "S3cr3tPassw0rd"
    outcome = rr(world, f"data.shards={world.server.url('good-{0..1}.tar').replace('://', f'://me:{secret}@')}")
    written = [p for p in world.tmp.rglob("*") if p.is_file() and secret.encode() in p.read_bytes()]
    assert outcome.code == 0 and secret not in outcome.message and not written, written
    return outcome


def pipe_with_token(world):
    """A pipe: command with its credential in a header: the command gets it, no file eigtrain writes holds it."""
    secret = "S3cr3tT0k3n"
    client = world.tmp / "client.sh"  # serves the shard only with the right header, as a private store would
    client.write_text(f'[ "$2" = "PRIVATE-TOKEN: {secret}" ] && exec cat "$3"\n')
    shards = local(world, "good-{0..1}.tar")
    outcome = rr(world, f'data.shards=pipe:sh {client} -H "PRIVATE-TOKEN: {secret}" {shards}')
    written = [p for p in world.tmp.rglob("*") if p.is_file() and p != client and secret.encode() in p.read_bytes()]
    assert outcome.code == 0 and secret not in outcome.message and not written, written
    assert "PRIVATE-TOKEN: REDACTED" in (world.tmp / "export" / "manifest.json").read_text()
    return outcome


def out_existing_run_dir(world):
    run = world.user_dir("my-run")
    return rr(world, f"data.shards={local(world, 'good-{0..1}.tar')}", f"out={run}")


def out_read_only(world):
    place = world.tmp / "ro"
    place.mkdir()
    mounted = _mount(place, "ro,size=64k")
    if not mounted:
        place.chmod(0o555)
    try:
        return rr(world, f"data.shards={local(world, 'good-{0..1}.tar')}", f"out={place / 'export'}")
    finally:
        subprocess.run(["umount", str(place)]) if mounted else place.chmod(0o755)


def out_full_disk(world):
    with small_disk(world, "16k") as place:
        (place / "filler").write_bytes(b"\0" * 12 * 1024)
        outcome = rr(world, f"data.shards={local(world, 'good-{0..1}.tar')}", f"out={place / 'export'}")
        assert [p.name for p in place.iterdir()] == ["filler"]  # no half-written export left behind
        return outcome


@contextlib.contextmanager
def small_disk(world, size: str):
    """A tmpfs of `size` (a disk that fills up), mounted for the case; skipped where none can be mounted."""
    place = world.tmp / "full"
    place.mkdir()
    if not _mount(place, f"size={size}"):
        pytest.skip("no tmpfs to fill (needs root): the full-disk cases run where one can be mounted")
    try:
        yield place
    finally:
        subprocess.run(["umount", str(place)])


def _mount(place: Path, options: str) -> bool:
    if os.geteuid() != 0:
        return False
    return (
        subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(place)], capture_output=True).returncode
        == 0
    )


def no_image_size(world):
    return rr(world, f"data.shards={local(world, 'good-{0..1}.tar')}", "data.image_size=null")


def rr_args(*args):
    return lambda world: rr(world, *args)


def train_args(*args):
    return lambda world: train(world, "experiment=cpu_debug", f"run_dir={world.tmp / 'run'}", *args)


def index_of(pattern_of: Callable[[World], str], *args):
    return lambda world: shards_index(world, pattern_of(world), *args)


def nan_loss(world):
    outcome = train(
        world,
        "experiment=cpu_debug",
        f"run_dir={world.tmp / 'run'}",
        "steps=4",
        "optim.lr=1e30",
        "max_nonfinite_steps=1",
        "checkpoint_every=1",
        "logging.wandb.mode=disabled",
        "logging.progress=false",
        "data.num_workers=0",
    )
    last_good = re.search(r"last good checkpoint: (\S+)", outcome.message)
    assert last_good and (last_good.group(1) == "None" or Path(last_good.group(1)).is_dir()), outcome.message
    return outcome


def train_small(world, run_dir, shards, *extra):
    """A 2-step cpu_debug run on `shards` (12 samples, batches of 6): Hydra's last value wins for `extra`'s keys."""
    return train(
        world,
        "experiment=cpu_debug",
        f"run_dir={run_dir}",
        f"data.shards='{shards}'",
        "data.image_size=[8,8]",
        "data.augment=cifar",  # RGB shards: digits' one-value normalization is refused
        "data.label_key=cls",
        "logging.wandb.mode=disabled",
        "logging.progress=false",
        "data.num_workers=0",
        "batch_size=6",
        "steps=2",
        "checkpoint_every=1",
        *extra,
    )


def checkpoint_full_disk(world):
    with small_disk(world, "64k") as place:
        outcome = train_small(world, place / "run", local(world, "good-{0..1}.tar"))
        assert not list(place.rglob("COMPLETE")), "a checkpoint that did not fit is marked complete"
        return outcome


def final_export_full_disk(world):
    """A finished run resumed (model.safetensors lost) on a disk with room for everything but the final weights:
    the trainer's final export is one line, with no temporary left and the checkpoints as they were."""
    run = world.tmp / "run"
    assert train_small(world, run, local(world, "good-{0..1}.tar")).code == 0
    weights = (run / "model.safetensors").stat().st_size
    (run / "model.safetensors").unlink()
    used = sum(-(-p.stat().st_size // 4096) * 4096 for p in run.rglob("*") if p.is_file())
    with small_disk(world, f"{(used + weights // 2) // 1024}k") as place:
        shutil.copytree(run, place / "run")
        outcome = train_small(world, place / "run", local(world, "good-{0..1}.tar"))
        left = sorted(p.name for p in (place / "run").iterdir())
        assert "model.safetensors" not in left and not [n for n in left if n.endswith(".tmp")], left
        assert (place / "run" / "checkpoints" / "step-2" / "COMPLETE").exists()
        return outcome


def all_bad_batch(world):
    """Every sample of one batch unusable (a whole shard of garbage, read as one batch): a counted, skipped step."""
    world.shard("good-1.tar", [{"__key__": f"x-{i}", "jpg": b"\xff\xd8 garbage", "cls": 0} for i in range(6)])
    return train_small(
        world,
        world.tmp / "run",
        local(world, "good-{0..1}.tar"),
        "data.mix_shards=1",
        "data.shuffle_block=0",
        "data.max_corrupt=100",
        "steps=4",
    )


def pipe_in_saved_config(world):
    """A run trained on a pipe: source (the user typed it); re-reading its saved config must not run the command."""
    mark = world.tmp / "command-ran"
    source = f"pipe:touch {mark}; cat {local(world, 'good-{0..1}.tar')}"
    assert train_small(world, world.tmp / "run", source).code == 0 and mark.exists()
    mark.unlink()
    outcome = rr(world, f"run_dir={world.tmp / 'run'}", f"out={world.tmp / 'export'}")
    assert not mark.exists(), "a command read back from config.yaml ran"
    return outcome


# -- run directories from anyone (issue 34): checkpoints verified, nothing unpickled, one writer, provenance checked
def small_run(world, *extra) -> Path:
    """A finished 2-step run (checkpoints step-1 and step-2) on the world's two shards."""
    run = world.tmp / "run"
    assert train_small(world, run, local(world, "good-{0..1}.tar"), "dim=4", *extra).code == 0
    return run


def step_of(run: Path, n: int) -> Path:
    return run / "checkpoints" / f"step-{n}"


def rr_checkpoint_without_marker(world):
    step = step_of(small_run(world), 2)
    (step / "COMPLETE").unlink()  # a save that never finished
    return rr(world, f"checkpoint={step}")


def bit_flipped_newest_step(world):
    """Resume falls back to the newest step that verifies (a warning names the file) and finishes the run."""
    run = small_run(world, "steps=2")
    shard = step_of(run, 2) / "__0_0.distcp"
    data = shard.read_bytes()
    shard.write_bytes(data[:100] + bytes([data[100] ^ 1]) + data[101:])  # same size: only a checksum sees it
    outcome = train_small(world, run, local(world, "good-{0..1}.tar"), "dim=4")
    from eigtrain.runs.checkpoint_verify import check_step

    check_step(step_of(run, 2))  # step 2 written again, from step 1
    return outcome


def truncated_metadata(world):
    step = step_of(small_run(world), 2)
    (step / ".metadata").write_bytes((step / ".metadata").read_bytes()[:40])
    return rr(world, f"checkpoint={step}")


def planted_pickle(world):
    import pickle

    from eigtrain.runs.checkpoint_verify import write_checksums

    run, marker = small_run(world), world.tmp / "code-ran"

    class Planted:
        def __reduce__(self):
            return (open, (str(marker), "w"))

    (step_of(run, 2) / ".metadata").write_bytes(pickle.dumps(Planted()))
    write_checksums(step_of(run, 2), skip=(".eigtrain-checkpoint", "COMPLETE"))  # as a careful attacker would
    outcome = rr(world, f"checkpoint={step_of(run, 2)}")
    assert not marker.exists(), "a pickle planted in a checkpoint ran"
    return outcome


def second_trainer(world):
    from eigtrain.runs.lock import RunLock

    run = small_run(world, "steps=1")
    lock = RunLock(run)  # a trainer still running there (this process holds the lock)
    try:
        return train_small(world, run, local(world, "good-{0..1}.tar"), "dim=4")
    finally:
        lock.release()


def resume_another_objective(world):
    run = small_run(world, "stop_after=1")
    saved = (run / "config.yaml").read_bytes()
    outcome = train_small(world, run, local(world, "good-{0..1}.tar"), "dim=4", "objective=vicreg")
    assert (run / "config.yaml").read_bytes() == saved  # not rewritten by a refused resume
    return outcome


def eval_other_weights_export(world):
    from eigtrain.evaluate.command import main

    run = small_run(world)
    assert rr(world, f"checkpoint={step_of(run, 1)}", f"out={world.tmp / 'rr-step-1'}").code == 0
    val = world.shard("val-0.tar", good_samples("v0", 6))
    args = [f"run_dir={run}", f"rr={world.tmp / 'rr-step-1'}", f"data.val_shards={val}", "probe=closed_form"]
    stderr = io.StringIO()
    with _redirect_stderr(stderr):
        code = main([*args, "random_draws=2", "retrieval=none", "dims=[4]", f"out={world.tmp / 'ev'}"])
    return Outcome(code, _last_line(stderr.getvalue()))


OK = (0, "")


def case(name: str, run: Callable[[World], Outcome], expected: tuple[int, str], *marks):
    return pytest.param(run, expected, id=name, marks=marks)


CASES = [  # name, set-up and command, (exit code, regex of the one line eigtrain prints)
    case("missing-local-shard", missing_local, (2, r"shard .*good-2.tar does not exist")),
    case("http-404", http_status("404"), (2, r"cannot open shard http://127.0.0.1:\d+/good-1.tar: HTTP 404")),
    case("http-403", http_status("403"), (2, r"cannot open shard http://127.0.0.1:\d+/good-1.tar: HTTP 403")),
    case("http-500-then-ok", http_flaky("500", "ok"), OK),
    case("http-503-twice-then-ok", http_flaky("503", "503", "ok"), OK),
    case("connection-reset-mid-tar", http_flaky("reset", "ok"), OK),
    case(
        "stalled-server",
        http_stalled,
        (
            2,
            r"good-1.tar cannot be read to its end after \d+ samples \((TimeoutError|"
            r"timeout).*truncated or unreachable",
        ),
    ),
    case(
        "stalled-server-index",
        index_of(
            lambda w: (w.server.faults.update({"/good-1.tar": ["stall"]}), w.server.url("good-{0..1}.tar"))[1],
            "timeout_s=0.5",
        ),
        (1, r"eigtrain-shards index: error: shard .*good-1.tar cannot be read to its end"),
    ),
    case(
        "truncated-tar",
        damaged("truncated"),
        (2, r"good-1.tar cannot be read to its end after \d+ samples .*truncated"),
    ),
    case("empty-tar", damaged("empty"), (2, r"good-1.tar cannot be read to its end after 0 samples")),
    case("non-tar-bytes", damaged("not_tar"), (2, r"good-1.tar cannot be read to its end after 0 samples")),
    case(
        "jpeg-with-garbage",
        bad_sample(jpg=b"\xff\xd8\xff\xe0 garbage"),
        (2, r"1 unusable samples in data.shards .*more than max_corrupt=0; the last: shard .*good-1.tar, key b1-03"),
    ),
    case("png-16-bit", bad_sample(jpg=None, png=png("I;16")), OK),
    case("png-gray-alpha", bad_sample(jpg=None, png=png("LA")), OK),
    case("png-palette", bad_sample(jpg=None, png=png("P")), OK),
    case(
        "no-image-member",
        bad_sample(jpg=None, txt="a caption"),
        (2, r"key b1-03: KeyError: .no image member .*the sample has \['cls', 'txt'\]"),
    ),
    case(
        "wrong-label-type",
        bad_sample(cls="seven"),
        (
            2,
            r"key b1-03: ValueError: label data.label_key=cls is 'seven', "
            r"not an integer",
        ),
    ),
    case("all-bad-shard", all_bad, (2, r"4 unusable samples .*more than max_corrupt=3; the last: shard .*good-1.tar")),
    case("url-with-token", token_url, OK),
    case("url-with-user-and-password", userinfo_url, OK),
    case("pipe-command-with-a-token-header", pipe_with_token, OK),
    case("out-an-existing-run-dir", out_existing_run_dir, (2, r"my-run")),
    case("out-read-only", out_read_only, (2, r"cannot write .*ro/export: (Read-only file system|Permission denied)")),
    case("out-full-disk", out_full_disk, (2, r"No space left on device")),
    case("rr-without-image-size", no_image_size, (2, r"encoder= with data.shards needs data.image_size")),
    case("rr-unknown-key", rr_args("colour=red"), (2, r"unknown key 'colour'; allowed: ")),
    case("rr-bad-value", rr_args("batch_size=many"), (2, r"batch_size")),
    case(
        "train-bad-override-value",
        train_args("steps=abc"),
        (1, r"eigtrain-train: config error: bad value for steps: Value 'abc'"),
    ),
    case("train-unknown-key", train_args("colour=red"), (1, r"eigtrain-train: config error: unknown key 'colour'")),
    case(
        "train-unquoted-brace",
        train_args("data.shards=/x/a-{000..009}.tar"),
        (1, r"Hydra reads braces as its own syntax; quote the pattern as \"data.shards='/x/a-\{000..009\}.tar'\""),
    ),
    case(
        "train-shell-expanded-brace",
        train_args("data.shards=/x/a-000.tar", "data.shards=/x/a-001.tar"),
        (
            1,
            r"data.shards is given 2 times \(/x/a-000.tar, /x/a-001.tar\): did the shell expand a brace pattern\? "
            r"Quote it",
        ),
    ),
    case(
        "train-http-404-at-start",
        lambda w: (
            w.server.faults.update({"/good-1.tar": ["404"]}),
            train(
                w,
                "experiment=cpu_debug",
                f"run_dir={w.tmp / 'run'}",
                f"data.shards='{w.server.url('good-{0..1}.tar')}'",
                "data.image_size=[8,8]",
                "data.augment=cifar",
                "logging.wandb.mode=disabled",
            ),
        )[1],
        (1, r"^eigtrain-train: data error: cannot open shard http://127.0.0.1:\d+/good-1.tar: HTTP 404"),
    ),
    case(
        "too-few-samples-for-a-batch",
        lambda w: train_small(w, w.tmp / "run", local(w, "good-{0..1}.tar"), "batch_size=64"),
        (1, r"^eigtrain-train: data.shards .* has 12 samples, fewer than one batch per worker"),
    ),
    case(
        "checkpoint-on-a-full-disk",
        checkpoint_full_disk,
        (1, r"eigtrain-train: cannot write a checkpoint in .*full/run \(\d+ bytes free there\)"),
    ),
    case(
        "final-export-on-a-full-disk",
        final_export_full_disk,
        (1, r"^eigtrain-train: cannot write .*model\.safetensors.*(disk is full|No space left)"),
    ),
    case("all-bad-batch-in-training", all_bad_batch, OK),
    case(
        "pipe-in-a-saved-config",
        pipe_in_saved_config,
        (
            2,
            r"data.shards in .*config.yaml is a pipe: source, which "
            r"runs a shell command.*data.allow_pipe=true",
        ),
    ),
    case("nan-loss", nan_loss, (1, r"non-finite loss or gradient, more than max_nonfinite_steps=1")),
    case(
        "rr-checkpoint-without-marker",
        rr_checkpoint_without_marker,
        (2, r"cannot read .*step-2/COMPLETE: the checkpoint is not complete"),
    ),
    case("bit-flipped-newest-checkpoint", bit_flipped_newest_step, OK),
    case("truncated-dcp-metadata", truncated_metadata, (2, r"step-2 fails verification: .*\.metadata does not match")),
    case(
        "pickle-planted-in-a-checkpoint", planted_pickle, (2, r"cannot read .*\.metadata: .*is not checkpoint metadata")
    ),
    case(
        "second-trainer-on-a-run-dir",
        second_trainer,
        (1, r"run is being written by another eigtrain-train \(host .*pid \d+"),
    ),
    case(
        "resume-with-another-objective",
        resume_another_objective,
        (1, r"config error: resuming .* at step 1 with objective changed .*new_lineage=true"),
    ),
    case(
        "eval-rr-solved-on-other-weights",
        eval_other_weights_export,
        (2, r"solved on other weights .*allow_foreign_export=true"),
    ),
]


@pytest.mark.parametrize("run, expected", CASES)
def test_bad_input(world, run, expected):
    outcome = run(world)
    code, pattern = expected
    assert outcome.code == code, outcome
    if pattern:
        assert re.search(pattern, outcome.message), outcome.message
        assert "\n" not in outcome.message.strip() and "Traceback" not in outcome.message
    assert all(f.exists() for f in world.user_files)  # the user's run survived
