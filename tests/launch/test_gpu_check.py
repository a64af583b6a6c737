"""The GPU day-one kit (tools/gpu_check.sh and friends) on a machine without CUDA.

Fast: the time boxes (each part fits one 10-minute command, all <= 20 min, in the issue's order), the offline
install's choice of image vs .whl (real wheel files), its refusals, and the report's figures and targets.
The CPU dry run's resume and rr bodies with their eigtrain commands in this process.
Slow: tools/ci_offline_install.sh (wheels for 3.12 resolve; a venv that sees only the device image's packages
installs from wheels with no index and passes the CPU dry run's host-syncs and bench steps).
"""

import json
import re
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest

from tests.support.runs import REPO, clean_env

sys.path.insert(0, str(REPO / "tools"))
import gpu_check  # noqa: E402
import offline_install  # noqa: E402


def test_gpu_steps_fit_their_time_boxes_in_the_issues_order():
    steps = gpu_check.cuda_steps("python", Path("runs"), Path("logs"))
    assert [s.name[0] for s in steps] == sorted(s.name[0] for s in steps)  # (a) first ... (g) last
    assert {s.name[0] for s in steps} == set("abcdefg")
    for part in (1, 2):
        assert gpu_check.INSTALL_BOX_S + sum(s.box_s for s in steps if s.part == part) <= gpu_check.PART_BOX_S
    assert 2 * gpu_check.INSTALL_BOX_S + sum(s.box_s for s in steps) <= gpu_check.TOTAL_BOX_S == 20 * 60


def fake_wheel(folder: Path, name: str, version: str, requires: tuple[str, ...] = ()) -> Path:
    """A real wheel file (metadata and one module) named `name`."""
    module = name.replace("-", "_")
    path = folder / f"{module}-{version}-py3-none-any.whl"
    meta = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n" + "".join(
        f"Requires-Dist: {r}\n" for r in requires
    )
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr(f"{module}/__init__.py", f"VERSION = {version!r}\n")
        zf.writestr(f"{module}-{version}.dist-info/METADATA", meta)
        zf.writestr(
            f"{module}-{version}.dist-info/WHEEL", "Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
        )
        zf.writestr(f"{module}-{version}.dist-info/RECORD", "")
    return path


def test_offline_install_takes_from_the_image_what_it_has_new_enough_and_the_rest_from_wheels(tmp_path, monkeypatch):
    import packaging

    monkeypatch.setitem(offline_install.OPTIONAL, "zz-optional", "works without it")

    have = packaging.__version__
    wheels = {
        offline_install.normalize(n): (p, v, r)
        for p in (
            fake_wheel(tmp_path, "packaging", "0.1"),  # the image's is newer and nothing asks for more: image
            fake_wheel(tmp_path, "pytest", "0.1"),  # someone needs pytest>=999: the wheel (even though older: flagged)
            fake_wheel(
                tmp_path, "zz-absent-here", "1.0", ("pytest>=999", "packaging>=1", "zz-nowhere>=2", "zz-optional")
            ),
        )
        for n, v, r in [offline_install.wheel_metadata(p)]
    }
    chosen, unmet = offline_install.plan(wheels, [])
    assert chosen["packaging"] == ("image", have)
    assert chosen["zz-absent-here"] == (".whl", "1.0")
    assert chosen["pytest"][0] == ".whl"
    assert any(u.startswith("pytest: 0.1 does not satisfy pytest>=999") for u in unmet), unmet
    assert "zz-nowhere: absent does not satisfy zz-nowhere>=2 (required)" in unmet
    assert "zz-optional: absent does not satisfy zz-optional (works without it)" in unmet


def test_offline_install_refuses_wheels_of_torch_and_foreign_targets(tmp_path, capsys):
    (tmp_path / "w").mkdir()
    fake_wheel(tmp_path / "w", "torch", "0.1")
    assert offline_install.main(["--wheels", str(tmp_path / "w"), "--target", str(tmp_path / "t")]) == 1
    assert "holds torch, which the image owns" in capsys.readouterr().out
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "mine.txt").write_text("not the tool's")
    with pytest.raises(SystemExit, match="not empty and was not made by this tool"):
        offline_install.prepare_target(foreign)
    assert (foreign / "mine.txt").exists()


def test_offline_install_unpacks_wheels_without_pip(tmp_path, monkeypatch):
    monkeypatch.setattr(offline_install, "has_pip", lambda: False)
    offline_install.prepare_target(tmp_path / "t")
    offline_install.install([fake_wheel(tmp_path, "zz-plain", "2.0")], tmp_path / "t")
    assert (tmp_path / "t" / "zz_plain" / "__init__.py").read_text() == "VERSION = '2.0'\n"


def test_report_shows_figures_spreads_same_mode_targets_and_what_needs_several_gpus(tmp_path):
    def mode(views, low, high, syncs=0.0):
        return {"views_per_s": views, "views_per_s_range": [low, high], "spread": (high - low) / views,
                "pairs_per_s": views / 2, "mfu": 0.41, "host_syncs_per_step": syncs}  # fmt: skip

    bench = {
        "device": "NVIDIA H100 80GB HBM3",
        "results": [
            {
                "model": "resnet50",
                "image_size": 224,
                "batch": 256,
                "compile": True,
                "modes": {
                    "synthetic": mode(5600.0, 5500.0, 5700.0),
                    "reference": mode(6000.0, 5900.0, 6100.0),
                    "jpeg": {
                        **mode(4800.0, 4700.0, 4900.0, 2.0),
                        "decoded_in": "nvJPEG on cuda:0, decode-ahead thread",
                    },
                    "jpeg_workers": {
                        **mode(5300.0, 5200.0, 5400.0),
                        "decoded_in": "on the CPU by the loader (8 workers)",
                    },
                    "augment_only": mode(30000.0, 29000.0, 31000.0),  # a part of the step: a row, no target
                    "presets": {"presets": {"imagenet": {"host_syncs_per_call": 0.0, "from": []}}},
                },
            }
        ],
        "skipped": ["resnet50@224 png"],
    }
    report = {
        "versions": {"device": "NVIDIA H100 80GB HBM3", "gpus": 1, "torch": "2.11"},
        "commit": "abc",
        "written": "now",
        "steps": {
            "p_r50_compiled": {
                "status": "PASS",
                "seconds": 200,
                "box_s": 270,
                "part": 3,
                "what": "bench",
                "figures": bench,
            },
            "e_deepspeed_zero3": {
                "status": "TIMEOUT",
                "seconds": 70,
                "box_s": 70,
                "part": 2,
                "what": "z3",
                "tail": ["last line of its log"],
            },
        },
    }
    gpu_check.write_report(tmp_path, report)
    text = (tmp_path / "REPORT.md").read_text()
    assert "NVIDIA H100 80GB HBM3" in text and "| e_deepspeed_zero3 | 2 | TIMEOUT | 70 | 70 |" in text
    assert "| resnet50 | 224 | 256 | yes | jpeg | 4,800 | 4,700-4,900 | 4% | 2,400 | 41.0% | 2.0 | 80% |" in text
    assert "resnet50@224 compiled synthetic >= 90% of the bare model: 93% MET" in text
    assert (
        "resnet50@224 compiled jpeg (decoded: nvJPEG on cuda:0, decode-ahead thread) >= 85% of the bare model: 80% NOT MET"
        in text
    )
    assert "jpeg_workers (decoded: on the CPU by the loader (8 workers)) >= 85% of the bare model: 88% MET" in text
    assert ">= 5,500 views/s per H100: 5,600 on NVIDIA H100 80GB HBM3 MET" in text
    assert "| augment_only | 30,000 |" in text and "augment_only >=" not in text
    assert "imagenet augmentation alone (both views): host syncs per call 0.0" in text
    assert "not measured (time budget): resnet50@224 png" in text and "last line of its log" in text
    assert "What only a multi-GPU machine can show" in text and (tmp_path / "report.json").exists()


def test_the_report_names_the_commit_of_the_files_even_when_the_git_copy_is_stale(tmp_path):
    """The GPU machine gets the working tree with an old .git copy: the report must name the files' commit, not
    that copy's HEAD."""

    def git(*args: str) -> str:
        env = {**clean_env(), "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
               "GIT_COMMITTER_EMAIL": "t@t"}  # fmt: skip
        return subprocess.run(["git", "-C", str(tmp_path), *args], check=True, capture_output=True, text=True,
                              env=env).stdout.strip()  # fmt: skip

    git("init", "-q")
    (tmp_path / ".gitignore").write_text("/.whl/\n")
    (tmp_path / "a.py").write_text("one\n")
    git("add", "-A")
    git("commit", "-qm", "old")
    old = git("rev-parse", "--short", "HEAD")
    assert gpu_check.checkout_commit(tmp_path) == old
    (tmp_path / ".whl").mkdir()
    (tmp_path / ".whl" / "x.whl").write_text("ignored files are not the tree's")
    assert gpu_check.checkout_commit(tmp_path) == old

    (tmp_path / "a.py").write_text("two\n")
    (tmp_path / "new.py").write_text("untracked but not ignored: part of what ran\n")
    git("add", "-A")
    git("commit", "-qm", "new")
    new_tree = git("rev-parse", "HEAD^{tree}")
    git("reset", "-q", "--soft", old)  # HEAD back at the old commit, the new files in place: a stale .git copy
    objects = sorted(p for p in (tmp_path / ".git" / "objects").rglob("*") if p.is_file())
    said = gpu_check.checkout_commit(tmp_path)
    assert said.startswith(f"the files of tree {new_tree[:12]} (not {old}'s") and old in said
    assert new_tree[:12] in said.split("grep ")[1]
    assert sorted(p for p in (tmp_path / ".git" / "objects").rglob("*") if p.is_file()) == objects  # .git untouched
    (tmp_path / "a.py").write_text("three\n")  # files no commit has: their tree is named, found by no commit
    assert "the files of tree" in gpu_check.checkout_commit(tmp_path)
    assert sorted(p for p in (tmp_path / ".git" / "objects").rglob("*") if p.is_file()) == objects


def test_throughput_part_clips_its_steps_to_the_deadline_and_budgets_each_bench():
    steps = gpu_check.throughput_steps("python", Path("logs"))
    # the shipped default mode first (issue 53: engine.compile_mode=auto at both image sizes)
    assert {s.part for s in steps} == {3} and [s.name for s in steps[:2]] == ["p_r18_auto", "p_r50_auto"]
    assert all(s.argv[s.argv.index("--compile-mode") + 1] == "auto" for s in steps[:2])
    step = gpu_check.clipped(steps[1], left=100.0)
    assert step.box_s == 95 and step.argv[-2:] == ["--budget-s", "50"]
    assert gpu_check.clipped(steps[0], left=None).box_s == steps[0].box_s


def test_the_cpu_dry_runs_resume_and_rr_bodies_pass_with_their_commands_run_in_process(tmp_path, monkeypatch):
    """gpu_check's CPU steps cpu_stop_resume_bitwise and cpu_rr (the bodies the GPU's steps (d) and (f) run), from
    their own argv, with the eigtrain commands they start run in this process: the stop at 2 and resume to 4 gives
    the uninterrupted run's losses bit for bit, and eigtrain-rr exports the resumed run. (ci_offline_install.sh runs
    the dry run's other steps in the image-only venv; a fresh process per training there only repeated imports.)"""
    import gpu_check_steps

    from eigtrain.export.command import main as rr_main
    from eigtrain.train.command import compose_config, run

    real_run = subprocess.run

    def in_process(cmd, *args, check=False, **kwargs):
        if cmd[:2] != [sys.executable, "-m"] or not cmd[2].startswith("eigtrain."):
            return real_run(cmd, *args, check=check, **kwargs)
        if cmd[2] == "eigtrain.train.command":
            code = 0 if run(compose_config(cmd[3:])) else 1
        else:
            assert cmd[2] == "eigtrain.export.command", cmd
            code = rr_main(cmd[3:])
        if check and code:
            raise subprocess.CalledProcessError(code, cmd)
        return subprocess.CompletedProcess(cmd, code)

    monkeypatch.setattr(gpu_check_steps.subprocess, "run", in_process)
    steps = {s.name: s for s in gpu_check.cpu_steps(sys.executable, tmp_path / "runs", tmp_path / "logs")}
    for name in ("cpu_stop_resume_bitwise", "cpu_rr"):
        argv = steps[name].argv
        monkeypatch.setenv("GPU_CHECK_FIGURES", str(tmp_path / f"{name}.json"))
        assert gpu_check_steps.run_impl(argv[argv.index("--impl") + 1 :]) == 0, name
    resume = json.loads((tmp_path / "cpu_stop_resume_bitwise.json").read_text())
    assert resume["passed"] and resume["max_relative_difference"] == 0.0
    assert resume["losses_resumed"] == resume["losses_uninterrupted"]
    assert [step for step, _ in resume["losses_resumed"]] == [1, 2, 3, 4]
    assert "rr.safetensors" in json.loads((tmp_path / "cpu_rr.json").read_text())["outputs"]


@pytest.mark.slow
def test_offline_install_in_an_image_only_venv_passes_the_cpu_dry_run():
    t0 = time.monotonic()
    done = subprocess.run(
        ["bash", str(REPO / "tools" / "ci_offline_install.sh")],
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    assert "ci_offline_install: OK" in done.stdout
    assert "no CUDA device visible" in done.stdout and "CPU dry run OK" in done.stdout
    assert "total time boxes:" in done.stdout and "limit 20 min" in done.stdout
    for step in ("install", "cpu_host_syncs_plumbing", "cpu_bench_dry_run"):
        assert re.search(rf"^PASS {step} \(", done.stdout, re.M), step
    for name in ("deepspeed", "hydra-core", "webdataset", "kornia"):  # what the image lacks came from the wheels
        assert re.search(rf"^\s+{name}\s+\S+\s+from \.whl$", done.stdout, re.M), name
    for name in ("torch", "torchvision", "numpy"):  # never replaced
        assert re.search(rf"^\s+{name}\s+\S+\s+from image$", done.stdout, re.M), name
    print(f"ci_offline_install: {time.monotonic() - t0:.0f} s")


def test_every_step_body_the_gpu_steps_name_exists():
    import gpu_check_steps

    steps = gpu_check.cuda_steps("python", Path("runs"), Path("logs")) + gpu_check.cpu_steps(
        "python", Path("r"), Path("l")
    )
    bodies = {s.argv[s.argv.index("--impl") + 1] for s in steps if "--impl" in s.argv}
    assert bodies == set(gpu_check_steps.IMPLS), bodies


def test_image_folder_shards_of_any_size_feed_the_trainer_at_a_fixed_image_size(tmp_path):
    """Step (c)'s data: PNG shards from an image folder (no fixed image_shape in the index) with data.image_size."""
    from bench_gpu import write_image_shards

    from eigtrain.data.from_config import prepare_data
    from eigtrain.schema import train_config
    from eigtrain.train.command import compose_config

    root = write_image_shards(tmp_path, 12, 8, "png")
    cfg = compose_config(["experiment=cpu_debug", f"data.root={root}", "data.image_size=[8,8]", "data.image_fit=whole"])
    assert prepare_data(train_config(cfg).data, rank=0) == ((3, 8, 8), None)


def test_device_wheels_never_empties_a_folder_it_did_not_write(tmp_path):
    (tmp_path / "theirs.whl").write_text("not ours")
    done = subprocess.run(
        ["bash", str(REPO / "tools" / "device_wheels.sh"), "--out", str(tmp_path)],
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 1 and "was not written by this script" in done.stderr, done.stderr
    assert (tmp_path / "theirs.whl").read_text() == "not ours"


def test_every_gpu_training_step_names_only_known_config_keys_and_values():
    from eigtrain.train.checks import validate
    from eigtrain.train.command import compose_config

    steps = gpu_check.cuda_steps("python", Path("runs"), Path("logs"))
    trained = [s for s in steps if "eigtrain.train.command" in s.argv]
    assert {s.name[0] for s in trained} == {"a", "e"}
    for step in trained:
        overrides = step.argv[step.argv.index("eigtrain.train.command") + 1 :]
        cfg = compose_config([o.replace("device=cuda", "device=cpu") for o in overrides])  # raises on a bad key/value
        validate(cfg, world_size=1)  # raises on a value out of its choices
        assert cfg.steps == 6, step.name


def test_bench_presets_mode_reports_every_preset_as_json_on_the_cpu(monkeypatch):
    """The presets mode's report (the compiled branch too, with torch.compile as the identity here) is plain JSON:
    the H200 run of 2026-11-27 lost the mode to a bound method in it."""
    import torch
    from bench_gpu import PRESETS, preset_checks

    from eigtrain.data import augment_batched

    monkeypatch.setattr(torch, "compile", lambda fn, **kwargs: fn)
    augment_batched.compiled_view.cache_clear()
    images = torch.randint(0, 256, (4, 3, 32, 32), dtype=torch.uint8)
    try:
        found = preset_checks(images, torch.device("cpu"), "cifar", {"compile": True})
    finally:
        augment_batched.compiled_view.cache_clear()
    report = json.loads(json.dumps(found))
    assert set(report) == set(PRESETS)
    assert report["cifar"]["compiled"] is True  # the fusable form compiled: float rounding from the eager views
    assert 0.0 <= report["cifar"]["max_abs_compiled_minus_eager"] < 1e-4


def test_every_throughput_step_runs_known_bench_modes_alone_within_the_deadline():
    from bench_gpu import MODES

    steps = {s.name: s for s in gpu_check.throughput_steps("python", Path("logs"))}
    assert "p_r50_augment" in steps  # the augmentation's two forms side by side (gpu_check --part 3 --steps ...)
    for step in steps.values():
        assert set(step.argv[step.argv.index("--modes") + 1].split(",")) <= set(MODES), step.name
        assert gpu_check.INSTALL_BOX_S + step.box_s <= gpu_check.THROUGHPUT_DEADLINE_S, step.name


def test_bench_augment_forms_mode_reports_both_forms_as_json_on_the_cpu(monkeypatch):
    """bench_gpu's augment_forms mode (its compiled branch, with torch.compile as the identity here) is plain JSON
    with both forms' times, their difference and top operations, and the report renders it."""
    import torch
    from bench_augment import compare_forms
    from bench_gpu import Timing

    from eigtrain.data import augment_batched, build_augment

    monkeypatch.setattr(torch, "compile", lambda fn, **kwargs: fn)
    augment_batched.compiled_view.cache_clear()
    augment = build_augment("imagenet", dtype=torch.bfloat16, channels_last=True)
    images = torch.randint(0, 256, (4, 3, 24, 24), dtype=torch.uint8)
    try:
        found = compare_forms(augment, images, torch.device("cpu"), Timing(1, 2, 0), compile=True)
    finally:
        augment_batched.compiled_view.cache_clear()
    report = json.loads(json.dumps(found))
    assert 0 < report["max_abs_fusable_minus_reference"] < 0.05 and report["speedup"] > 0
    for form in ("reference", "fusable"):
        assert report[form]["seconds_per_step"] > 0 and report[form]["kernels"]["top"], form
    lines = gpu_check.augment_form_lines(report)
    assert len(lines) == 3 and "fusable form" in lines[0] and lines[2].startswith("  - fusable:")


def test_docs_gpu_table_is_generated_from_the_stored_reports():
    import gpu_table

    assert gpu_table.block() in gpu_table.DOC.read_text(), "stale: run python tools/gpu_table.py"
    assert len(gpu_table.table()) > 2  # the stored reports have rows
