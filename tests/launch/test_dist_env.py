"""eigtrain.dist: rank/world resolution (Slurm, torchrun, single), process groups, dead ranks, stop flags."""

import multiprocessing as mp
import os
import shutil
import signal
import time

import pytest
import torch
import torch.distributed as torch_dist

from eigtrain import dist
from eigtrain.dist import DistEnv, expand_nodelist, expand_tasks_per_node, resolve_env, slurm_nodes
from eigtrain.dist.slurm_nodes import scontrol_hostnames
from tests.support.runs import free_port

# What srun sets for task 5 of a 2-node x 4-task step (values seen on a real Slurm 22.05).
SLURM_TASK = {
    "SLURM_JOB_ID": "123456",
    "SLURM_STEP_ID": "0",
    "SLURM_PROCID": "5",
    "SLURM_NTASKS": "8",
    "SLURM_LOCALID": "1",
    "SLURM_NODEID": "1",
    "SLURM_JOB_NODELIST": "gpu[07-08]",
    "SLURM_STEP_NODELIST": "gpu[07-08]",
    "SLURM_TASKS_PER_NODE": "4(x2)",
    "SLURM_STEP_TASKS_PER_NODE": "4(x2)",
}
TORCHRUN = {
    "TORCHELASTIC_RUN_ID": "none",
    "RANK": "3",
    "WORLD_SIZE": "4",
    "LOCAL_RANK": "1",
    "LOCAL_WORLD_SIZE": "2",
    "GROUP_RANK": "1",
    "MASTER_ADDR": "node1",
    "MASTER_PORT": "29400",
}


@pytest.fixture
def no_scontrol(tmp_path, monkeypatch):
    """A PATH without scontrol: the node list goes to eigtrain's own parser."""
    monkeypatch.setenv("PATH", str(tmp_path))


@pytest.fixture
def slurm_conf(tmp_path, monkeypatch):
    """A minimal slurm.conf: enough for scontrol's local hostlist expansion, no cluster needed."""
    if shutil.which("scontrol") is None:
        pytest.skip("scontrol is not installed")
    conf = tmp_path / "slurm.conf"
    conf.write_text(
        "ClusterName=t\nSlurmctldHost=localhost\nNodeName=localhost CPUs=1\nPartitionName=p Nodes=localhost\n"
    )
    monkeypatch.setenv("SLURM_CONF", str(conf))
    return conf


NODELISTS = [
    ("vm", ["vm"]),
    ("gpu[01-03,07],cpu5,a[1-2]-ib", ["gpu01", "gpu02", "gpu03", "gpu07", "cpu5", "a1-ib", "a2-ib"]),
    ("n[9-11]", ["n9", "n10", "n11"]),
    ("x[001-002,010]", ["x001", "x002", "x010"]),
    ("r[1-2]n[3,5]", ["r1n3", "r1n5", "r2n3", "r2n5"]),
    ("node-1,node-2", ["node-1", "node-2"]),
]


@pytest.mark.parametrize("nodelist, hosts", NODELISTS)
def test_expand_nodelist_without_scontrol_parses_it_itself(no_scontrol, nodelist, hosts):
    assert scontrol_hostnames(nodelist) is None
    assert expand_nodelist(nodelist) == hosts


@pytest.mark.parametrize("nodelist, hosts", NODELISTS)
def test_expand_nodelist_with_scontrol_agrees_with_the_parser(slurm_conf, nodelist, hosts):
    assert expand_nodelist(nodelist) == hosts  # Slurm's answer, or the parser's where this Slurm rejects the list


@pytest.mark.parametrize(
    "nodelist, hosts",
    [
        ("n[9-11]", ["n9", "n10", "n11"]),
        ("r[1-2]n[3,5]", ["r1n3", "r1n5", "r2n3", "r2n5"]),
        ("gpu[01-03,07],cpu5", ["gpu01", "gpu02", "gpu03", "gpu07", "cpu5"]),
    ],
)
def test_scontrol_expands_the_node_list_where_it_can(slurm_conf, nodelist, hosts):
    assert scontrol_hostnames(nodelist) == hosts


def test_scontrol_rejecting_a_list_leaves_it_to_the_parser(slurm_conf):
    assert scontrol_hostnames("a[x]") is None  # scontrol exits 0 here, saying "Invalid hostlist" on stderr
    with pytest.raises(ValueError, match="bad range 'x' in Slurm node list"):
        expand_nodelist("a[x]")


def test_scontrol_without_a_configuration_falls_back(tmp_path, monkeypatch):
    if shutil.which("scontrol") is None:
        pytest.skip("scontrol is not installed")
    monkeypatch.setenv("SLURM_CONF", str(tmp_path / "missing.conf"))
    # scontrol retries a missing config for up to 60 s, so this is the timeout path; 1 s keeps CI short
    monkeypatch.setattr(slurm_nodes, "SCONTROL_TIMEOUT_S", 1)
    assert scontrol_hostnames("n[9-11]") is None
    assert expand_nodelist("n[9-11]") == ["n9", "n10", "n11"]


@pytest.mark.parametrize("bad", ["", "a[]", "a[1-2", "a]1", "a[3-1]", "a,,b", "a[x]", "a[[1]]"])
def test_expand_nodelist_rejects_malformed(no_scontrol, bad):
    with pytest.raises(ValueError, match="Slurm node list"):
        expand_nodelist(bad)


def test_expand_tasks_per_node():
    assert expand_tasks_per_node("4(x2),3") == [4, 4, 3]
    assert expand_tasks_per_node("2") == [2]
    with pytest.raises(ValueError, match="tasks-per-node"):
        expand_tasks_per_node("4(2)")


def test_slurm_multi_node():
    env = resolve_env(SLURM_TASK)
    assert env == DistEnv(
        rank=5,
        world_size=8,
        local_rank=1,
        local_world_size=4,
        node_rank=1,
        num_nodes=2,
        master_addr="gpu07",
        master_port=20000 + 123456 % 20000,
        source="slurm",
    )


def test_slurm_uneven_tasks_per_node_and_job_level_fallbacks():
    environ = {k: v for k, v in SLURM_TASK.items() if not k.startswith("SLURM_STEP_")}
    environ.update(
        SLURM_STEPID="0",
        SLURM_NTASKS="7",
        SLURM_PROCID="6",
        SLURM_LOCALID="2",
        SLURM_NODEID="1",
        SLURM_TASKS_PER_NODE="4,3",
        SLURM_JOB_NODELIST="a[1-2]-ib",
    )
    env = resolve_env(environ)
    assert (env.rank, env.local_rank, env.local_world_size, env.num_nodes, env.master_addr) == (6, 2, 3, 2, "a1-ib")


def test_slurm_ntasks_per_node_is_the_last_fallback():
    environ = {k: v for k, v in SLURM_TASK.items() if "TASKS_PER_NODE" not in k}
    environ["SLURM_NTASKS_PER_NODE"] = "4"
    assert resolve_env(environ).local_world_size == 4


def test_port_differs_between_jobs_and_stays_in_range():
    ports = {resolve_env({**SLURM_TASK, "SLURM_JOB_ID": str(j)}).master_port for j in (1, 2, 19999, 20000)}
    assert ports == {20001, 20002, 39999, 20000}


def test_torchrun_inside_slurm_allocation_wins():
    env = resolve_env({**SLURM_TASK, **TORCHRUN})
    assert env == DistEnv(3, 4, 1, 2, 1, 2, "node1", 29400, "torchrun")


def test_batch_shell_without_srun_is_single_process():
    # sbatch's shell has SLURM_PROCID=0 and the job's SLURM_NTASKS, but it is one process.
    environ = {"SLURM_JOB_ID": "7", "SLURM_PROCID": "0", "SLURM_NTASKS": "2", "SLURM_LOCALID": "0"}
    assert resolve_env(environ) == DistEnv(0, 1, 0, 1, 0, 1, "127.0.0.1", 29500, "single")
    assert resolve_env({}).source == "single"


def test_our_own_exported_vars_agree_with_slurm():
    # init_distributed exports RANK etc.; resolving again inside the same task must still work.
    env = resolve_env({**SLURM_TASK, "RANK": "5", "WORLD_SIZE": "8", "LOCAL_RANK": "1"})
    assert env.source == "slurm" and env.rank == 5


@pytest.mark.parametrize(
    "change, message",
    [
        ({"SLURM_PROCID": None}, "SLURM_PROCID not set"),
        ({"SLURM_LOCALID": None, "SLURM_NODEID": None}, "SLURM_LOCALID, SLURM_NODEID not set"),
        ({"SLURM_STEP_NODELIST": None, "SLURM_JOB_NODELIST": None}, "SLURM_JOB_NODELIST not set"),
        ({"SLURM_STEP_TASKS_PER_NODE": None, "SLURM_TASKS_PER_NODE": None}, "SLURM_TASKS_PER_NODE"),
        ({"SLURM_PROCID": "five"}, "SLURM_PROCID='five' is not an integer"),
        ({"SLURM_NTASKS": "6"}, "sums to 8 tasks but SLURM_NTASKS=6"),
        ({"SLURM_PROCID": "8"}, r"SLURM_PROCID=8 is outside \[0, SLURM_NTASKS=8\)"),
        ({"SLURM_LOCALID": "4"}, r"SLURM_LOCALID=4 is outside \[0, 4\)"),
        ({"SLURM_NODEID": "2"}, "SLURM_NODEID=2 is outside the 2 nodes"),
        ({"SLURM_STEP_NODELIST": "gpu[07-09]"}, "describes 2 nodes but SLURM_STEP_NODELIST='gpu\\[07-09\\]' has 3"),
        ({"RANK": "0"}, "inconsistent launch variables: RANK=0 but Slurm says 5"),
    ],
)
def test_slurm_missing_or_inconsistent_variables(change, message):
    environ = {**SLURM_TASK, **{k: v for k, v in change.items() if v is not None}}
    for k in [k for k, v in change.items() if v is None]:
        environ.pop(k)
    with pytest.raises(ValueError, match=message):
        resolve_env(environ)


@pytest.mark.parametrize(
    "environ, message",
    [
        ({"RANK": "0"}, "WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT not set"),
        ({**TORCHRUN, "RANK": "4"}, r"RANK=4 is outside \[0, WORLD_SIZE=4\)"),
        ({**TORCHRUN, "LOCAL_WORLD_SIZE": "3"}, "WORLD_SIZE=4 is not a multiple of LOCAL_WORLD_SIZE=3"),
        ({**TORCHRUN, "MASTER_PORT": ""}, "MASTER_PORT='' is not an integer"),
    ],
)
def test_torchrun_missing_or_inconsistent_variables(environ, message):
    with pytest.raises(ValueError, match=message):
        resolve_env(environ)


def test_init_single_process_exports_and_creates_no_group(monkeypatch):
    for name in (
        "RANK",
        "WORLD_SIZE",
        "LOCAL_RANK",
        "LOCAL_WORLD_SIZE",
        "MASTER_ADDR",
        "MASTER_PORT",
        "TORCHELASTIC_RUN_ID",
        "SLURM_STEP_ID",
        "SLURM_STEPID",
    ):
        monkeypatch.setenv(name, "")  # so that monkeypatch restores the original state afterwards
        monkeypatch.delenv(name)
    env = dist.init_distributed(backend="gloo")
    assert env.source == "single" and not torch_dist.is_initialized()
    assert (os.environ["RANK"], os.environ["WORLD_SIZE"], os.environ["MASTER_PORT"]) == ("0", "1", "29500")
    assert dist.is_rank_zero() and dist.broadcast_object({"a": 1}) == {"a": 1}
    dist.barrier()
    dist.destroy()


@pytest.fixture
def restore_signals():
    saved = {s: signal.getsignal(s) for s in (signal.SIGUSR2, signal.SIGTERM)}
    yield
    for s, handler in saved.items():
        signal.signal(s, handler)
    dist._StopState.installed = dist._StopState.stopped = dist._StopState.requeue = False


@pytest.mark.parametrize("sig, requeue", [(None, False), (signal.SIGTERM, False), (signal.SIGUSR2, True)])
def test_stop_handler_only_sets_a_flag(restore_signals, sig, requeue):
    assert not dist.stop_requested()  # no handler installed: never stops
    dist.install_stop_handler()
    assert not dist.stop_requested()
    if sig is not None:
        os.kill(os.getpid(), sig)  # would end the process without the handler
    assert dist.stop_requested() == dist.stopped() == (sig is not None)
    assert dist.requeue_requested() == requeue


# ------------------------------------------------------------------------------------------------
# Two real gloo processes


def _worker(rank: int, port: int, failure: str, results) -> None:
    env = DistEnv(rank, 2, rank, 2, 0, 1, "127.0.0.1", port, "torchrun")
    dist.init_distributed(env, backend="gloo", timeout_s=3)
    t = torch.tensor([rank + 1.0])
    torch_dist.all_reduce(t)
    # Save-on-signal agreement: only rank 1 gets the signal, both ranks stop at the same step.
    dist.install_stop_handler()
    stop_step = None
    for step in range(1, 6):
        if rank == 1 and step == 3:
            os.kill(os.getpid(), signal.SIGUSR2)
        if dist.stop_requested():
            stop_step = step
            break
    results.put((rank, "ok", t.item(), stop_step, dist.requeue_requested()))
    if rank == 1:  # the peer now dies, or hangs without joining the next collective
        if failure == "dead":
            results.close()
            results.join_thread()  # flush the queue before dying
            os._exit(0)
        time.sleep(30)
        return
    start = time.monotonic()
    try:
        torch_dist.all_reduce(torch.ones(1))
        results.put((rank, "no error", None, None, None))
    except RuntimeError as e:
        results.put((rank, "error", str(e), time.monotonic() - start, None))


@pytest.mark.slow
@pytest.mark.parametrize("failure", ["dead", "stuck"])
def test_two_gloo_processes_collective_then_peer_failure_raises(failure):
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=_worker, args=(r, port, failure, results), daemon=True) for r in range(2)]
    for p in procs:
        p.start()
    try:
        got = [results.get(timeout=60) for _ in range(3)]
    finally:
        for p in procs:
            p.kill()
            p.join()
    oks = sorted(g for g in got if g[1] == "ok")
    assert [(r, s, stop, rq) for r, _, s, stop, rq in oks] == [(0, 3.0, 3, True), (1, 3.0, 3, True)]
    ((rank, outcome, message, seconds, _),) = [g for g in got if g[1] != "ok"]
    assert (rank, outcome) == (0, "error"), message
    assert seconds < 10, f"collective took {seconds:.1f} s to fail (timeout 3 s)"
    if failure == "stuck":
        assert "timed out" in message.lower() or "timeout" in message.lower(), message
