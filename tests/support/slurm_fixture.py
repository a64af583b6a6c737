"""A real single-node Slurm cluster (tools/slurm_local.sh) for the tests that submit jobs. Never a mock.

tests/conftest.py registers it (pytest_plugins): a test asks for the `slurm_cluster` fixture. The first pytest process
that needs the cluster starts it (installing Debian's packages when `sbatch` is missing); the last
one to finish stops it, unless it was already running before the tests. The users (pids) are
kept in a file under a lock, so pytest-xdist workers share one cluster.
"""

import fcntl
import os
import shutil
import subprocess
from contextlib import contextmanager
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "tools" / "slurm_local.sh"
CLUSTER_DIR = Path(os.environ.get("EIGTRAIN_SLURM_DIR", "/tmp/eigtrain-slurm"))


@contextmanager
def _locked():
    CLUSTER_DIR.mkdir(parents=True, exist_ok=True)
    with open(CLUSTER_DIR / "fixture.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield
        fcntl.flock(lock, fcntl.LOCK_UN)


def _users(add: int | None = None, remove: int | None = None) -> set[int]:
    """Live pytest processes using the cluster (pids of crashed runs drop out by themselves)."""
    path = CLUSTER_DIR / "fixture.users"
    pids = {int(p) for p in path.read_text().split()} if path.exists() else set()
    pids = {p for p in pids if _alive(p)} - {remove} | ({add} if add else set())
    path.write_text("\n".join(map(str, sorted(pids))))
    return pids


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False


def _is_up(conf: Path) -> bool:
    if not conf.exists() or shutil.which("scontrol") is None:
        return False
    ping = subprocess.run(
        ["scontrol", "ping"], env={**os.environ, "SLURM_CONF": str(conf)}, capture_output=True, text=True
    )
    return "is UP" in ping.stdout


@pytest.fixture(scope="session")
def slurm_cluster():
    """Path of the running cluster's slurm.conf; SLURM_CONF is set for the session."""
    if shutil.which("sbatch") is None and shutil.which("apt-get") is None:
        pytest.skip("Slurm is not installed and apt-get is unavailable to install it")
    conf = CLUSTER_DIR / "slurm.conf"
    with _locked():
        if _users(add=os.getpid()) == {os.getpid()}:  # first user: remember whether we start it
            (CLUSTER_DIR / "fixture.started").write_text("0" if _is_up(conf) else "1")
        # OMP_NUM_THREADS=1 as many users' shells have it: the node must still declare every CPU (GNU nproc
        # answers OMP_NUM_THREADS, and a node of 1 CPU never starts a 2-task job)
        run = subprocess.run(
            ["bash", str(SCRIPT), "start", str(CLUSTER_DIR)],
            capture_output=True,
            text=True,
            env={**os.environ, "OMP_NUM_THREADS": "1"},
        )
        if run.returncode != 0:
            _users(remove=os.getpid())
            pytest.fail(f"tools/slurm_local.sh start failed ({run.returncode}):\n{run.stderr[-4000:]}")
        conf = Path(run.stdout.strip().splitlines()[-1])
    previous = os.environ.get("SLURM_CONF")
    os.environ["SLURM_CONF"] = str(conf)  # for sbatch/scontrol here and, through Slurm, in the jobs
    try:
        yield conf
    finally:
        if previous is None:
            os.environ.pop("SLURM_CONF", None)
        else:
            os.environ["SLURM_CONF"] = previous
        with _locked():
            if not _users(remove=os.getpid()) and (CLUSTER_DIR / "fixture.started").read_text() == "1":
                subprocess.run(["bash", str(SCRIPT), "stop", str(CLUSTER_DIR)], capture_output=True)
