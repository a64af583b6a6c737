"""Why a Slurm job failed, in a few lines: each failed task's last error line and its log, and for a task
killed before it wrote a result (OOM, a signal, a node failure, --kill-on-bad-exit), how srun says it ended.

Kept apart from launch/slurm.py (submission and waiting): reading logs and slurmctld's answers is its own job.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import submitit


class JobFailedError(RuntimeError):
    """A Slurm job failed; the message names each failed task, its last error line and its log."""


def job_fields(job_id: str) -> dict[str, str]:
    """`scontrol show job` as key -> value ({} once slurmctld has forgotten the job); needs no accounting DB."""
    out = subprocess.run(["scontrol", "show", "job", "-o", str(job_id)], capture_output=True, text=True)
    return dict(field.split("=", 1) for field in out.stdout.split() if "=" in field)


def failed_tasks(job: submitit.Job) -> list[tuple[int, str, Path]]:
    """(task, traceback, log) of each task whose result says it raised; killed tasks left no result at all."""
    failed = []
    for i in range(job.num_tasks):
        task = job.task(i) if job.num_tasks > 1 else job
        if task.paths.result_pickle.exists():
            outcome, payload = submitit.core.utils.pickle_load(task.paths.result_pickle)
            if outcome == "error":
                failed.append((i, payload, task.paths.stderr))
    return failed


def job_ending(job_id: str) -> str:
    """State, reason and exit code as slurmctld tells them, e.g. 'FAILED, NonZeroExitCode, exit 137:0'."""
    fields = job_fields(job_id)
    if not fields:
        return "forgotten by slurmctld"
    parts = [fields.get("JobState", "?")]
    if fields.get("Reason", "None") != "None":
        parts.append(fields["Reason"])
    if fields.get("ExitCode", "0:0") != "0:0":
        parts.append(f"exit {fields['ExitCode']}")
    return ", ".join(parts)


_SRUN_TASK_END = re.compile(r"srun: error: \S+: tasks? ([\d,\-]+): (.+)")


def _how_task_ended(job: submitit.Job, task: int) -> str:
    """srun's last word on this task in the batch log (e.g. 'Killed', 'Exited with exit code 1'),
    else the task log's last line. The logs are appended across requeues, so the last line is the latest run."""

    def lines(path: Path) -> list[str]:
        try:
            return [line.strip() for line in path.read_text(errors="replace").splitlines() if line.strip()]
        except OSError:
            return []

    for line in reversed(lines(job.paths.stderr)):  # the batch step's stderr: srun writes there
        match = _SRUN_TASK_END.search(line)
        if match and task in _task_set(match.group(1)):
            return f"srun: {match.group(2)}"
    own = lines((job.task(task) if job.num_tasks > 1 else job).paths.stderr)
    return f"its log ends: {own[-1]}" if own else "its log is empty"


def _task_set(spec: str) -> set[int]:
    """srun's task ranges as it writes them, e.g. "0-1,3" -> {0, 1, 3}."""
    tasks = set()
    for part in spec.split(","):
        low, _, high = part.partition("-")
        tasks.update(range(int(low), int(high or low) + 1))
    return tasks


def failure_report(job: submitit.Job, what: str) -> str:
    # Every failed task's last line: the rank that died first is among them, next to the ranks
    # that only saw their peer disappear. A task with no result at all (killed: OOM, a signal, a
    # node failure) is named with how srun says it ended.
    lines = [f"Slurm job {job.job_id} {what}"]
    failed = failed_tasks(job)
    for i, trace, log in failed:
        last = trace.strip().splitlines()[-1] if trace.strip() else "(no traceback)"
        lines.append(f"  task {i}: {last}  (log: {log})")
    failed_ids = {i for i, _, _ in failed}
    for i in range(job.num_tasks):
        task = job.task(i) if job.num_tasks > 1 else job
        if i not in failed_ids and not task.paths.result_pickle.exists():
            lines.append(f"  task {i}: no result; {_how_task_ended(job, i)}  (log: {task.paths.stderr})")
    lines.append(f"logs: {job.paths.folder}")
    return "\n".join(lines)
