"""Jobs submitted through eigtrain.launch.slurm to a real single-node Slurm cluster (tests/support/slurm_fixture.py).

Each job has 2 CPU tasks that form a gloo group. Interruptions are real Slurm signals: `scancel
--signal=USR2` delivers the same signal Slurm sends `signal_delay_s` before a time limit.
"""

import json
import os
import re
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path

import cloudpickle
import pytest
import torch
import torch.distributed as torch_dist
from eigtrain.launch.slurm import JobFailedError, submit, wait, world_size

from eigtrain import dist
from eigtrain.dist.slurm_nodes import scontrol_hostnames

# The jobs' Python processes import nothing from tests/: ship this module's functions by value.
cloudpickle.register_pickle_by_value(sys.modules[__name__])


def launcher(folder: Path, **overrides) -> dict:
    return {
        "name": "slurm",
        "folder": str(folder),
        "time": 5,
        "tasks_per_node": 2,
        "cpus_per_task": 1,
        "max_requeues": 2,
        **overrides,
    }


def test_launcher_config_defaults_and_errors():
    assert world_size({"name": "slurm", "folder": "f", "nodes": 4, "gpus_per_node": 8}) == 32
    assert world_size({"folder": "f", "tasks_per_node": None}) == 1  # CPU: one task per node
    for cfg, message in [
        ({}, "launcher.folder must be set"),
        ({"folder": "f", "gpus": 8}, r"unknown key 'gpus'; allowed: name, job_name, folder"),
        ({"folder": "f", "gpus_per_node": 8, "tasks_per_node": 9}, "tasks_per_node=9 exceeds launcher.gpus_per_node=8"),
        ({"folder": "f", "time": "04:00:00"}, "bad value for time: Value '04:00:00'"),
        ({"folder": "f", "time": 0}, "launcher.time must be an integer >= 1, got 0"),
        ({"folder": "f", "name": "local"}, "launcher.name='local' given to the Slurm launcher"),
    ]:
        with pytest.raises(ValueError, match=message):
            world_size(cfg)


def test_srun_task_ranges_are_read_as_srun_writes_them():
    from eigtrain.launch.slurm_report import _task_set

    assert _task_set("1") == {1} and _task_set("0-1") == {0, 1} and _task_set("0-2,5,7-8") == {0, 1, 2, 5, 7, 8}


def sbatch_options(*overrides: str) -> list[str]:
    """The #SBATCH lines eigtrain-train would submit for these overrides (submitit writes them)."""
    from eigtrain.launch.slurm import make_executor

    from eigtrain.train.command import compose_config

    cfg = compose_config(["experiment=cpu_debug", "launcher=slurm", "run_dir=/tmp/r", *overrides])
    executor = make_executor(cfg.launcher, loader_workers=cfg.data.num_workers)  # as eigtrain-train submits
    text = executor._executor._make_submission_file_text("true", "uid")
    return [line.removeprefix("#SBATCH ") for line in text.splitlines() if line.startswith("#SBATCH")]


def test_default_resources_follow_the_data_workers_and_bind_gpus(slurm_cluster):  # submitit needs sbatch on PATH
    options = sbatch_options("data.num_workers=6", "launcher.gpus_per_node=8")
    assert {
        "--cpus-per-task=7",
        "--mem-per-cpu=4096M",
        "--gpus-per-node=8",
        "--gpu-bind=none",
        "--ntasks-per-node=8",
    } <= set(options)
    options = sbatch_options("launcher.gpus_per_node=4", "launcher.gpu_binding=task")
    assert {"--cpus-per-task=2", "--gpus-per-task=1", "--ntasks-per-node=4"} <= set(options)
    assert not any(o.startswith(("--gpus-per-node", "--gpu-bind")) for o in options)
    options = sbatch_options("launcher.cpus_per_task=3", "launcher.mem=64G")  # overridable; a CPU job asks no GPU
    assert {"--cpus-per-task=3", "--mem=64G"} <= set(options)
    assert not any(o.startswith(("--mem-per-cpu", "--gpu")) for o in options)
    assert "--mem-per-cpu=8G" in sbatch_options("launcher.mem_per_cpu=8G")
    assert not any(o.startswith("--mem") for o in sbatch_options("launcher.mem_per_cpu=null"))  # no request at all


def node_cpus() -> int:
    return int(
        subprocess.run(["sinfo", "-h", "-o", "%c"], capture_output=True, text=True, check=True).stdout.split()[0]
    )


def test_a_request_no_node_can_hold_is_refused_before_submission(slurm_cluster, tmp_path):
    """2 tasks x (node's CPUs) CPUs: Slurm would accept it and keep it PENDING (PartitionConfig) for ever."""
    cpus = node_cpus()
    with pytest.raises(
        ValueError,
        match=rf"could never start: it asks 1 node\(s\) of 2 task\(s\) x {cpus} CPU\(s\) = "
        rf"{2 * cpus} CPUs.*partition 'debug' has 0 node\(s\) that can hold it .*"
        r"lower launcher.tasks_per_node, launcher.cpus_per_task",
    ):
        submit(launcher(tmp_path / "slurm", cpus_per_task=cpus), all_reduce_job, str(tmp_path))
    assert not (tmp_path / "slurm").exists() or not list((tmp_path / "slurm").glob("*_submission.sh"))
    with pytest.raises(
        ValueError,
        match=r"launcher.partition='nope' is not a partition of this cluster; "
        r"partitions: debug",
    ):
        submit(launcher(tmp_path / "slurm", partition="nope"), all_reduce_job, str(tmp_path))


def test_the_issues_two_task_job_on_a_small_node_is_one_line_from_eigtrain_train(slurm_cluster, tmp_path, monkeypatch):
    """launcher=slurm launcher.tasks_per_node=2 with the default cpus_per_task (data.num_workers + 1): more CPUs than
    the node has -> eigtrain-train ends with one config-error line, and nothing is submitted."""
    from eigtrain.train.command import main

    workers = node_cpus() - 1  # cpus_per_task = workers + 1 = the node's CPUs; 2 tasks need twice that
    monkeypatch.setattr(
        sys,
        "argv",
        [
            "eigtrain-train",
            "experiment=cpu_debug",
            "launcher=slurm",
            "launcher.wait=true",
            "launcher.tasks_per_node=2",
            f"data.num_workers={workers}",
            f"run_dir={tmp_path / 'run'}",
        ],
    )
    with pytest.raises(SystemExit) as ended:
        main()
    assert re.fullmatch(
        r"eigtrain-train: config error: this Slurm job could never start: it asks 1 node\(s\) of 2 "
        r"task\(s\) x \d+ CPU\(s\) = \d+ CPUs.*",
        str(ended.value.code),
    ), ended.value.code
    assert not list(tmp_path.rglob("*_submission.sh"))


def test_waiting_on_a_job_that_can_never_start_ends_with_one_line(slurm_cluster, tmp_path):
    from eigtrain.launch.slurm import RequeueableCall, make_executor, slurm_state

    cfg = launcher(tmp_path / "slurm", cpus_per_task=node_cpus())  # submitted as an older eigtrain did: unchecked
    job = make_executor(cfg).submit(RequeueableCall(all_reduce_job, 0, False), str(tmp_path))
    try:
        with pytest.raises(JobFailedError) as failed:
            wait(job, poll_s=0.5, timeout_s=90)
        message = str(failed.value)
        assert "\n" not in message and re.match(
            rf"Slurm job {job.job_id} can never start \(PartitionConfig: it asks "
            r"more than the partition's nodes have .*\); cancelled it",
            message,
        )
        assert slurm_state(job.job_id) in ("CANCELLED", None)
    finally:
        subprocess.run(["scancel", job.job_id])


def test_pending_reasons_that_mean_never_and_those_that_mean_later():
    from eigtrain.launch.slurm_capacity import never_starts

    assert never_starts({"JobState": "PENDING", "Reason": "PartitionTimeLimit"}).startswith("PartitionTimeLimit: its")
    for fields in (
        {"JobState": "PENDING", "Reason": "Resources"},
        {"JobState": "PENDING", "Reason": "Priority"},
        {"JobState": "RUNNING", "Reason": "None"},
        {"JobState": "PENDING", "Reason": "ReqNodeNotAvail"},
    ):
        assert never_starts(fields) is None


@pytest.mark.slow
def test_slurm_sweep_submits_one_job_per_point_with_the_default_resources(slurm_cluster, tmp_path):
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "eigtrain.train.command",
            "-m",
            "experiment=cpu_debug",
            "optim.lr=0.05,0.1",
            "launcher=slurm",
            f"run_dir={tmp_path / 'sweep'}",
            "+launcher.additional_parameters.hold=true",
        ],  # held: never runs
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    jobs = [line.split()[3] for line in out.stdout.splitlines() if line.startswith("submitted Slurm job")]
    try:
        assert len(jobs) == 2
        shown = [
            subprocess.run(["scontrol", "show", "job", "-o", j], capture_output=True, text=True, check=True).stdout
            for j in jobs
        ]
        for job in shown:  # cpu_debug: 1 loader worker + the training process
            assert "CPUs/Task=2" in job and "MinMemoryCPU=4G" in job and "JobState=PENDING" in job, job
        logs = sorted(field.split("=", 1)[1] for job in shown for field in job.split() if field.startswith("StdOut="))
        assert [Path(log).parent.parent.name for log in logs] == [
            "experiment=cpu_debug,optim.lr=0.05",
            "experiment=cpu_debug,optim.lr=0.1",
        ]
    finally:
        subprocess.run(["scancel", *jobs])


# ------------------------------------------------------------------------------------------------
# A 2-task job


def all_reduce_job(out: str) -> int:
    env = dist.init_distributed(timeout_s=60)
    total = torch.tensor([env.rank + 1.0])
    torch_dist.all_reduce(total)
    record = {
        **asdict(env),
        "sum": total.item(),
        "RANK": os.environ["RANK"],
        "scontrol": scontrol_hostnames(os.environ["SLURM_STEP_NODELIST"]),
    }  # Slurm's own expansion served
    Path(out, f"rank{env.rank}.json").write_text(json.dumps(record))
    dist.destroy()
    return env.rank


@pytest.mark.slow
def test_two_task_job_forms_a_group(slurm_cluster, tmp_path):
    job = submit(launcher(tmp_path / "slurm"), all_reduce_job, str(tmp_path))
    assert wait(job, poll_s=0.5, timeout_s=90) == [0, 1]
    port = 20000 + int(job.job_id) % 20000
    for rank in (0, 1):
        record = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert record == {
            "rank": rank,
            "world_size": 2,
            "local_rank": rank,
            "local_world_size": 2,
            "node_rank": 0,
            "num_nodes": 1,
            "master_addr": os.uname().nodename.split(".")[0],
            "master_port": port,
            "source": "slurm",
            "sum": 3.0,
            "RANK": str(rank),
            "scontrol": [os.uname().nodename.split(".")[0]],
        }
    script = job.paths.submission_file.read_text()
    for flag in ("--signal=USR2@120", "--requeue", "--ntasks-per-node=2", "--kill-on-bad-exit=1", "unset RANK"):
        assert flag in script


def dying_rank_job() -> None:
    dist.init_distributed(timeout_s=300)
    if dist.resolve_env().rank == 1:
        raise RuntimeError("rank 1 fails on purpose")
    torch_dist.all_reduce(torch.ones(1))  # would wait for the 300 s timeout without --kill-on-bad-exit


@pytest.mark.slow
def test_dead_rank_ends_the_job_with_its_error(slurm_cluster, tmp_path):
    start = time.monotonic()
    job = submit(launcher(tmp_path / "slurm"), dying_rank_job)
    with pytest.raises(JobFailedError, match="rank 1 fails on purpose"):
        wait(job, poll_s=0.5, timeout_s=90)
    assert time.monotonic() - start < 60


def killed_job() -> None:
    os.kill(os.getpid(), 9)  # as the OOM killer would: no Python error, no result file


@pytest.mark.slow
def test_killed_tasks_are_named_with_slurms_reason_and_how_srun_ended_them(slurm_cluster, tmp_path):
    job = submit(launcher(tmp_path / "slurm", max_requeues=0), killed_job)
    with pytest.raises(JobFailedError) as failure:
        wait(job, poll_s=0.5, timeout_s=90)
    message = str(failure.value)
    assert f"Slurm job {job.job_id} ended (FAILED, NonZeroExitCode, exit " in message, message
    # Both tasks kill themselves at once; one whose peer died first may be ended by --kill-on-bad-exit before it
    # gets there (under load, task start-up is skewed), and is then named with srun's "Terminated".
    ended = re.findall(r"task (\d): no result; srun: (\w+)", message)
    assert sorted(task for task, _ in ended) == ["0", "1"] and ("Killed" in dict(ended).values()), message
    assert set(dict(ended).values()) <= {"Killed", "Terminated"}, message


# ------------------------------------------------------------------------------------------------
# Requeue: a job that checkpoints its progress and resumes from it, like the trainer


def update(x: torch.Tensor, step: int, world_size: int) -> torch.Tensor:
    """One step of a toy training run; the all-reduced 'gradient' of rank r is [r + 1, step, 1]."""
    grad = torch.tensor([world_size * (world_size + 1) / 2, world_size * step, world_size], dtype=torch.float64)
    return 0.9 * x + 0.1 * grad


def progress_job(out: str, steps: int, save_every: int, step_s: float) -> list[float]:
    env = dist.init_distributed(timeout_s=60)
    out = Path(out)
    step, x = 0, torch.zeros(3, dtype=torch.float64)
    if (out / "ckpt.pt").exists():
        saved = torch.load(out / "ckpt.pt", weights_only=True)
        step, x = saved["step"], saved["x"]
    with open(out / f"starts_rank{env.rank}.txt", "a") as f:
        f.write(f"{step} {os.environ.get('SLURM_RESTART_COUNT', 0)}\n")
    while step < steps:
        grad = torch.tensor([env.rank + 1.0, step, 1.0], dtype=torch.float64)
        torch_dist.all_reduce(grad)
        x = 0.9 * x + 0.1 * grad
        step += 1
        time.sleep(step_s)
        stop = dist.stop_requested()
        if env.rank == 0 and (step % save_every == 0 or stop):
            torch.save({"step": step, "x": x}, out / "ckpt.tmp")
            os.replace(out / "ckpt.tmp", out / "ckpt.pt")
        if env.rank == 0:
            with open(out / "progress.txt", "a") as f:  # appended: the requeued run continues the file
                f.write(f"{step}\n")
        if stop:
            break
    dist.destroy()
    return x.tolist()


def progress_log(out: Path) -> list[int]:
    try:
        return [int(line) for line in (out / "progress.txt").read_text().split()]
    except (FileNotFoundError, ValueError):
        return []


def progress(out: Path) -> int:
    return (progress_log(out) or [0])[-1]


def signal_after(job, out: Path, step: int, timeout_s: float = 60) -> None:
    """USR2 to every task once the job has done `step` steps."""
    deadline = time.monotonic() + timeout_s
    while progress(out) < step:
        assert time.monotonic() < deadline, f"job {job.job_id} made no progress; logs in {job.paths.folder}"
        time.sleep(0.1)
    subprocess.run(["scancel", "--signal=USR2", job.job_id], check=True)


def release_requeued(job, timeout_s: float = 60) -> None:
    """Slurm holds a requeued job for ~2 minutes (Reason=BeginTime); let it start 2 s after the requeue.

    Not at once: slurmd revokes the killed run's credential at a time in whole seconds, and a run
    started within that same second gets "Job credential revoked" and the job ends FAILED (seen on a
    loaded CI machine). Slurm's own hold exists for this reason; 2 s is enough on one node. Sleep, then
    StartTime=now: a future StartTime would wait for the next scheduling pass (30-60 s).
    """
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        shown = subprocess.run(["scontrol", "show", "job", "-o", job.job_id], capture_output=True, text=True).stdout
        if "Reason=BeginTime" in shown:
            time.sleep(2)
            subprocess.run(["scontrol", "update", f"JobId={job.job_id}", "StartTime=now"], check=True)
            return
        time.sleep(0.2)
    raise AssertionError(f"job {job.job_id} was not requeued; logs in {job.paths.folder}")


STEPS, SAVE_EVERY, STEP_S = 20, 5, 0.2


@pytest.mark.slow
def test_signalled_job_is_requeued_and_finishes_like_an_uninterrupted_run(slurm_cluster, tmp_path):
    # Default mode: submitit's USR2 handler requeues at once. (save_on_signal=True: the trainer test.)
    job = submit(launcher(tmp_path / "slurm"), progress_job, str(tmp_path), STEPS, SAVE_EVERY, STEP_S)
    signal_after(job, tmp_path, step=7)
    release_requeued(job)
    results = wait(job, poll_s=0.5, timeout_s=90)

    expected = torch.zeros(3, dtype=torch.float64)
    for step in range(STEPS):
        expected = update(expected, step, world_size=2)
    assert results[0] == results[1] == expected.tolist()  # bit-identical, float64

    for rank in (0, 1):
        lines = (tmp_path / f"starts_rank{rank}.txt").read_text().splitlines()
        (first, first_restarts), (resumed, restarts) = [tuple(map(int, line.split())) for line in lines]
        assert (first, first_restarts, restarts) == (0, 0, 1)  # exactly one requeue
        # requeued at once: resumes from the last periodic checkpoint the first run wrote (its last logged
        # step, or the one after it when it was killed between saving and logging)
        steps = progress_log(tmp_path)
        last = next(s for s, after in zip(steps, steps[1:]) if after <= s)  # where the requeued run restarts
        assert resumed % SAVE_EVERY == 0 and last - SAVE_EVERY < resumed <= last + 1 and resumed > 0, steps


@pytest.mark.slow
@pytest.mark.parametrize("save_on_signal", [False, True])
def test_requeues_are_bounded(slurm_cluster, tmp_path, save_on_signal):
    job = submit(
        launcher(tmp_path / "slurm", save_on_signal=save_on_signal, max_requeues=0),
        progress_job,
        str(tmp_path),
        STEPS,
        SAVE_EVERY,
        STEP_S,
    )
    signal_after(job, tmp_path, step=3)
    with pytest.raises(JobFailedError, match="not requeued"):
        wait(job, poll_s=0.5, timeout_s=60)
    assert len((tmp_path / "starts_rank0.txt").read_text().splitlines()) == 1


# ------------------------------------------------------------------------------------------------
# The real trainer, 2 CPU tasks


def training_config(run_dir: Path, data_root: Path, *overrides: str):
    from eigtrain.train.command import compose_config

    return compose_config(
        [
            "experiment=cpu_debug",
            f"run_dir={run_dir}",
            f"data.root={data_root}",
            "data.num_workers=1",
            "steps=40",
            "checkpoint_every=10",
            "keep_last=10",
            "log_every=1",
            "logging.wandb.mode=disabled",
            "logging.progress=false",
            "launcher=slurm",
            "launcher.tasks_per_node=2",
            "launcher.cpus_per_task=1",
            "launcher.time=5",
            *overrides,
        ]
    )


def first_logged_step(run_dir: Path, timeout_s: float = 90) -> None:
    deadline = time.monotonic() + timeout_s
    while not (run_dir / "metrics.jsonl").exists() or not (run_dir / "metrics.jsonl").read_text().strip():
        assert time.monotonic() < deadline, f"no training step logged in {run_dir}"
        time.sleep(0.05)


@pytest.mark.slow
def test_training_job_checkpoints_and_resumes_after_requeue_to_the_same_weights(slurm_cluster, tmp_path):
    from eigtrain.launch import launch
    from safetensors.torch import load_file

    from eigtrain.runs.checkpoint import complete_checkpoints
    from eigtrain.train.command import run

    data = tmp_path / "data"  # written by the first job's rank 0 (write_if_missing)
    whole = training_config(tmp_path / "whole", data)
    results = wait(launch(whole.launcher, run, whole), poll_s=0.5, timeout_s=150)
    assert [r["step"] for r in results] == [40, 40]
    assert [s for s, _ in complete_checkpoints(tmp_path / "whole" / "checkpoints")] == [10, 20, 30, 40]

    interrupted = training_config(tmp_path / "interrupted", data, "launcher.save_on_signal=true")
    job = launch(interrupted.launcher, run, interrupted)
    first_logged_step(tmp_path / "interrupted")
    subprocess.run(["scancel", "--signal=USR2", job.job_id], check=True)
    release_requeued(job)
    results = wait(job, poll_s=0.5, timeout_s=150)
    assert [r["step"] for r in results] == [40, 40]

    # The save at the signal: the first run stopped at step N (any N, also one of checkpoint_every's) and
    # the requeued run resumed from exactly that step, so no step was lost.
    log = job.paths.stderr.read_text()
    stopped = re.findall(r"saved step (\d+) on signal and requeued job", log)
    resumed = re.findall(r"resumed from \S+ \(step (\d+)\)", log)
    assert len(stopped) == 1 and resumed == stopped and 0 < int(stopped[0]) < 40, log
    assert int(stopped[0]) in [s for s, _ in complete_checkpoints(tmp_path / "interrupted" / "checkpoints")]
    first = load_file(tmp_path / "whole" / "model.safetensors")
    second = load_file(tmp_path / "interrupted" / "model.safetensors")
    assert first.keys() == second.keys()
    for name in first:
        assert torch.equal(first[name], second[name]), name  # bit-identical resume on CPU


@pytest.mark.slow
def test_eigtrain_train_on_slurm_runs_the_jobs_converted_config_with_a_cpu_per_loader_worker(
    slurm_cluster, digits_root, tmp_path
):
    """The job runs the TrainConfig eigtrain-train converted on the login node (pickled with it); cpus_per_task left
    null is data.num_workers + 1 (cpu_debug: 1 worker)."""
    argv = ["experiment=cpu_debug", f"data.root={digits_root}", "steps=2", "checkpoint_every=2", "launcher=slurm"]
    argv += ["launcher.wait=true", "launcher.tasks_per_node=1", "logging.progress=false", f"run_dir={tmp_path / 'run'}"]
    out = subprocess.run(
        [sys.executable, "-m", "eigtrain.train.command", *argv],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert (tmp_path / "run" / "model.safetensors").is_file()
    pickles = list((tmp_path / "run" / "slurm").glob("*.pkl"))  # the submitted call and config: the owner's only
    assert pickles and all(p.stat().st_mode & 0o077 == 0 for p in pickles), [oct(p.stat().st_mode) for p in pickles]
    submission = next((tmp_path / "run" / "slurm").glob("*_submission.sh")).read_text()
    assert "#SBATCH --cpus-per-task=2" in submission


@pytest.mark.parametrize(
    "shards",
    [
        "pipe:curl -s -H 'Authorization: Bearer tok_live_0123456789' https://h/x-{0..1}.tar",
        "pipe:sshpass -p Hunter2Hunter2 scp me@h:/x.tar /dev/stdout",  # by shape
        "https://me:pw0123456@h/x-{0..1}.tar",
    ],
)
def test_a_literal_credential_is_never_submitted_to_slurm(tmp_path, shards):
    """submitit pickles the submitted config to disk: a credential written out in it is refused before anything is
    written or submitted (no cluster needed to refuse); a $NAME the job's shell expands is the documented way."""
    from omegaconf import OmegaConf

    cfg = OmegaConf.create({"data": {"shards": shards}})
    with pytest.raises(ValueError, match=r"^data\.shards holds a credential as text") as refused:
        submit(launcher(tmp_path / "slurm"), print, cfg)
    assert "\n" not in str(refused.value) and "Hunter2" not in str(refused.value) and not (tmp_path / "slurm").exists()
    from eigtrain.redact import literal_credentials

    reference = OmegaConf.create({"data": {"shards": "pipe:curl -s -H 'Authorization: Bearer $TOKEN' https://h/x.tar"}})
    assert literal_credentials(reference) == []
