"""Submit a function to Slurm with submitit: multi-node jobs, bounded requeue, save-on-signal.

The submitted function runs once per task (one task per GPU). It must resume by itself from its run
directory: a requeued job calls it again with the same arguments, so no state is pickled here.

Two ways a job comes back after a time limit or preemption notice (Slurm sends USR2
`signal_delay_s` seconds before the end; see launch/README.md):
- default: submitit's USR2 handler on rank 0 calls `RequeueableCall.checkpoint` and requeues at
  once; progress since the last periodic checkpoint is lost.
- `save_on_signal: true`: USR2/SIGTERM only set a flag (`eigtrain.dist.install_stop_handler`); the
  trainer sees it at the next step boundary on all ranks (`dist.stop_requested()`), saves, returns,
  and `RequeueableCall` then requeues.
Both are bounded by `max_requeues` (counted with SLURM_RESTART_COUNT).
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping

import submitit
from eigtrain.launch.slurm_capacity import check_fits, never_starts
from eigtrain.launch.slurm_report import JobFailedError, failed_tasks, failure_report, job_ending, job_fields
from submitit.core.job_environment import JobEnvironment

from eigtrain import dist
from eigtrain.redact import literal_credentials
from eigtrain.schema import SlurmLauncherConfig, typed

# Every key and its default: eigtrain.schema.SlurmLauncherConfig (docs/configuration.md).
GPU_BINDINGS = ("node", "task")


def _config(cfg: Mapping | SlurmLauncherConfig) -> SlurmLauncherConfig:
    """The launcher group as its schema dataclass (unknown keys and bad types: a ConfigError naming the key), with
    the checks a type cannot express, and tasks_per_node resolved (null: one per GPU, at least one)."""
    c = typed(SlurmLauncherConfig, cfg)
    if c.name != "slurm":
        raise ValueError(f"launcher.name={c.name!r} given to the Slurm launcher")
    if not c.folder:
        raise ValueError("launcher.folder must be set (submitit logs go there; use a folder in the run dir)")
    minimum = {"time": 1, "nodes": 1, "gpus_per_node": 0, "max_requeues": 0, "signal_delay_s": 0}
    for key, low in minimum.items():
        if getattr(c, key) < low:
            raise ValueError(f"launcher.{key} must be an integer >= {low}, got {getattr(c, key)!r}")
    if c.gpu_binding not in GPU_BINDINGS:
        raise ValueError(f"launcher.gpu_binding={c.gpu_binding!r}; allowed: {', '.join(GPU_BINDINGS)}")
    if c.cpus_per_task is not None and c.cpus_per_task < 1:
        raise ValueError(f"launcher.cpus_per_task must be an integer >= 1, got {c.cpus_per_task!r}")
    if c.tasks_per_node is None:
        c = dataclasses.replace(c, tasks_per_node=max(1, c.gpus_per_node))
    if c.tasks_per_node is None or c.tasks_per_node < 1:
        raise ValueError(f"launcher.tasks_per_node must be an integer >= 1, got {c.tasks_per_node!r}")
    if c.gpus_per_node and c.tasks_per_node > c.gpus_per_node:
        raise ValueError(
            f"launcher.tasks_per_node={c.tasks_per_node} exceeds launcher.gpus_per_node={c.gpus_per_node}: one task per GPU"
        )
    return c


_INHERITED_LAUNCH_VARS = (
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "MASTER_ADDR",
    "MASTER_PORT",
    "TORCHELASTIC_RUN_ID",
)


def task_cpus(c: SlurmLauncherConfig, loader_workers: int | None) -> SlurmLauncherConfig:
    """`c` with cpus_per_task, where it is left null and the job's DataLoader workers (data.num_workers) are known:
    one CPU per worker plus the training process."""
    if c.cpus_per_task is not None or loader_workers is None:
        return c
    return dataclasses.replace(c, cpus_per_task=int(loader_workers) + 1)


def world_size(cfg: Mapping | SlurmLauncherConfig) -> int:
    """How many tasks (ranks) the job will have: nodes x tasks_per_node, after validating `cfg`."""
    c = _config(cfg)
    return c.nodes * c.tasks_per_node


def make_executor(cfg: Mapping | SlurmLauncherConfig, loader_workers: int | None = None) -> submitit.AutoExecutor:
    """A submitit executor for Slurm from the `launcher` config (eigtrain.schema.SlurmLauncherConfig); `loader_workers`
    (data.num_workers) sizes cpus_per_task where it is null (`task_cpus`)."""
    c = task_cpus(_config(cfg), loader_workers)
    if shutil.which("sbatch") is None:
        raise RuntimeError("launcher=slurm but `sbatch` is not on PATH: submit from a Slurm login node")
    executor = submitit.AutoExecutor(folder=c.folder, cluster="slurm", slurm_max_num_timeout=c.max_requeues)
    additional = dict(c.additional_parameters)
    if c.max_requeues > 0:
        additional.setdefault("requeue", True)  # even where the site's JobRequeue=0
    mem_gb = None
    if isinstance(c.mem, str):
        additional["mem"] = c.mem
    elif c.mem is not None:
        mem_gb = float(c.mem)
    elif c.mem_per_cpu is not None:  # memory that grows with the loader workers (cpus_per_task)
        per_cpu = c.mem_per_cpu
        additional.setdefault("mem_per_cpu", per_cpu if isinstance(per_cpu, str) else f"{int(float(per_cpu) * 1024)}M")
    gpus = {}
    if c.gpus_per_node and c.gpu_binding == "task":  # Slurm gives each task its own GPU (cuda:0 there)
        gpus["slurm_gpus_per_task"] = 1
    elif c.gpus_per_node:  # every task sees the node's GPUs and takes the one at its local rank, so
        gpus["gpus_per_node"] = c.gpus_per_node  # NCCL keeps peer-to-peer/NVLink between them
        additional.setdefault("gpu_bind", "none")
    executor.update_parameters(
        name=c.job_name,
        timeout_min=c.time,
        nodes=c.nodes,
        tasks_per_node=c.tasks_per_node,
        **gpus,  # none at all on CPU partitions
        cpus_per_task=c.cpus_per_task,
        mem_gb=mem_gb,
        slurm_partition=c.partition,
        slurm_account=c.account,
        slurm_qos=c.qos,
        slurm_constraint=c.constraint,
        slurm_signal_delay_s=c.signal_delay_s,
        # The submitting shell's environment reaches the job: drop launch variables that would
        # contradict Slurm's (e.g. when submitting from inside a torchrun or Slurm process).
        slurm_setup=[f"unset {' '.join(_INHERITED_LAUNCH_VARS)}", *c.setup],
        slurm_additional_parameters=additional,
        # A rank that dies ends the whole step now instead of leaving the others in a collective.
        slurm_srun_args=["--kill-on-bad-exit=1"],
    )
    return executor


def restart_count() -> int:
    """How many times Slurm has requeued this job so far."""
    return int(os.environ.get("SLURM_RESTART_COUNT", "0"))


class RequeueableCall(submitit.helpers.Checkpointable):
    """`fn(*args)` on every task, requeued (at most `max_requeues` times) when Slurm says time is up."""

    def __init__(self, fn: Callable, max_requeues: int, save_on_signal: bool):
        self.fn, self.max_requeues, self.save_on_signal = fn, max_requeues, save_on_signal

    def __call__(self, *args, **kwargs):
        requeue_signal = JobEnvironment._usr_sig()
        if self.save_on_signal:  # replaces submitit's USR2 handler with a flag
            dist.install_stop_handler(requeue_signal=requeue_signal, stop_signals=(signal.SIGTERM,))
        else:
            _only_in_this_process(requeue_signal)
        result = self.fn(*args, **kwargs)
        if self.save_on_signal and dist.stopped():  # the trainer saved at a step boundary and returned
            self._leave_after_save(_where(result))
        return result

    def checkpoint(self, *args, **kwargs):
        """Called by submitit on rank 0 on USR2 (without save_on_signal): resubmit the same call."""
        if restart_count() >= self.max_requeues:
            print(
                f"not requeuing: already requeued {restart_count()} times (launcher.max_requeues)",
                file=sys.stderr,
                flush=True,
            )
            return None  # submitit then ends the job as not completed
        return super().checkpoint(*args, **kwargs)

    def _leave_after_save(self, where: str) -> None:
        # Leave through SystemExit, not an exception or a return: submitit then writes no result, so
        # whoever waits on the job keeps waiting for the run that continues training.
        if not dist.requeue_requested():  # SIGTERM: preempted (Slurm requeues it), cancelled or out of time
            print(f"saved{where} on SIGTERM; the job comes back only if Slurm requeues it", file=sys.stderr, flush=True)
            sys.exit(-1)
        if restart_count() >= self.max_requeues:  # the same answer on every rank: all of them end
            raise RuntimeError(
                f"stopped on signal and saved, but not requeued: already requeued "
                f"{restart_count()} times (launcher.max_requeues={self.max_requeues})"
            )
        env = JobEnvironment()
        if env.global_rank != 0:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)  # die at once when the requeue stops us
            time.sleep(600)  # rank 0 requeues; Slurm then stops this task
            sys.exit(-1)
        subprocess.check_call(["scontrol", "requeue", env.job_id], timeout=60)
        print(f"saved{where} on signal and requeued job {env.job_id}", file=sys.stderr, flush=True)
        sys.exit(-1)


def _where(result) -> str:
    """' step N' when the function returned its step (as eigtrain.train.command.run does), so the log says where
    the requeued run must resume."""
    step = result.get("step") if isinstance(result, Mapping) else None
    return f" step {step}" if isinstance(step, int) else ""


def _only_in_this_process(signum: int) -> None:
    """Forked data-loader workers inherit Python signal handlers and Slurm signals them too:
    keep submitit's checkpoint-and-requeue handler to the task's own process (one requeue)."""
    handler, pid = signal.getsignal(signum), os.getpid()

    def guarded(sig, frame):
        if os.getpid() == pid:
            handler(sig, frame)

    signal.signal(signum, guarded)


def refuse_literal_credentials(args: tuple, kwargs: Mapping) -> None:
    """ValueError (one line) when a submitted argument holds a credential as text (a `pipe:` command's token):
    submitit would pickle it to disk. A reference the job's shell expands (`$TOKEN`, exported before submitting:
    Slurm passes the environment on) reaches the job without being written."""
    found = [key for value in (*args, *kwargs.values()) for key in literal_credentials(value)]
    if found:
        raise ValueError(
            f"{found[0]} holds a credential as text, and launcher=slurm would write it to disk (submitit pickles the "
            f'config): export it as an environment variable and write $NAME in its place (e.g. -H "Authorization: '
            f"Bearer $TOKEN\"); the job's shell expands it"
        )


def submit(
    cfg: Mapping | SlurmLauncherConfig, fn: Callable, *args, loader_workers: int | None = None, **kwargs
) -> submitit.Job:
    """Submit `fn(*args, **kwargs)` as one Slurm job; print its id and logs; wait if `cfg.wait`. `loader_workers`:
    the job's data.num_workers, which sizes cpus_per_task where it is null (`task_cpus`)."""
    refuse_literal_credentials(args, kwargs)  # before anything is written or submitted
    c = task_cpus(_config(cfg), loader_workers)
    check_fits(c)  # a request no node of the partition can hold would stay PENDING for ever
    saved_umask = os.umask(0o077)  # submitit pickles the call and its arguments into launcher.folder: owner only
    try:  # (and reads its results back from there: a folder it creates is the owner's only too)
        executor = make_executor(c)
        job = executor.submit(RequeueableCall(fn, c.max_requeues, c.save_on_signal), *args, **kwargs)
    finally:
        os.umask(saved_umask)
    print(
        f"submitted Slurm job {job.job_id} ({c.nodes} node(s) x {c.tasks_per_node} task(s))\n"
        f"  stdout: {job.paths.stdout}\n  stderr: {job.paths.stderr}\n  folder: {job.paths.folder}",
        flush=True,
    )
    if c.wait:
        wait(job)
    return job


_RUNNING_STATES = {
    "PENDING",
    "CONFIGURING",
    "RUNNING",
    "COMPLETING",
    "REQUEUED",
    "REQUEUE_FED",
    "REQUEUE_HOLD",
    "RESIZING",
    "SUSPENDED",
    "PREEMPTED",
    "SIGNALING",
    "STAGE_OUT",
}


def slurm_state(job_id: str) -> str | None:
    """The job's state from slurmctld (None once it has forgotten the job)."""
    return job_fields(job_id).get("JobState")


def wait(job: submitit.Job, timeout_s: float | None = None, poll_s: float = 2.0) -> list:
    """Every task's result (across requeues); raises naming each failed task, its error and its log.

    Unlike `job.results()` alone, this also returns when the job ended with some tasks killed before
    writing a result (a dead rank, --kill-on-bad-exit), which submitit sees only through sacct.
    """
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    ended_at = None
    while not job.done():
        fields = job_fields(job.job_id)
        state = fields.get("JobState")
        if (never := never_starts(fields)) is not None:
            subprocess.run(["scancel", str(job.job_id)], capture_output=True, timeout=60)
            raise JobFailedError(
                f"Slurm job {job.job_id} can never start ({never}); cancelled it. logs: {job.paths.folder}"
            )
        if state in _RUNNING_STATES:
            ended_at = None
        elif failed_tasks(job):  # ended, and the ranks killed after the failure left no result
            raise JobFailedError(failure_report(job, f"failed ({state})"))
        elif ended_at is None:
            ended_at = time.monotonic()  # give a shared filesystem a moment to show the result files
        elif time.monotonic() - ended_at > 10:
            raise JobFailedError(
                failure_report(job, f"ended ({job_ending(job.job_id)}) without a result from every task")
            )
        if deadline is not None and time.monotonic() > deadline:
            raise TimeoutError(
                f"Slurm job {job.job_id} still {state} after {timeout_s:.0f} s; logs: {job.paths.folder}"
            )
        time.sleep(poll_s)
    if failed_tasks(job):
        raise JobFailedError(failure_report(job, "failed"))
    return job.results()
