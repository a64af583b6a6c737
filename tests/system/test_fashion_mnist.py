"""Issue 50's recipes and report (tools/bench_fashion_mnist.py): the GPU recipes follow the paper's CIFAR-10
protocol and run >= 100 epochs; each device-script step fits one 8-minute command and names real recipes; the idx
reader refuses a truncated file; the committed report is what its .json says (not stale)."""

import sys

import pytest

from eigtrain.schema import train_config
from eigtrain.train.command import compose_config
from tests.support.runs import REPO

sys.path.insert(0, str(REPO / "tools"))
import bench_fashion_mnist  # noqa: E402
import fashion_mnist_data  # noqa: E402
import gpu_check  # noqa: E402

TRAIN_IMAGES = 60_000


@pytest.mark.parametrize(
    "name, objective", [("fashion_mnist_gpu_scl", "scl"), ("fashion_mnist_gpu_vicreg", "vicreg_paper")]
)
def test_gpu_recipes_follow_the_papers_protocol_for_at_least_100_epochs(name, objective):
    cfg = train_config(compose_config([f"experiment={name}"]))
    assert (cfg.model.backbone, cfg.model.cifar_stem, cfg.dim, cfg.objective.name) == ("resnet18", True, 512, objective)
    assert (cfg.optim.name, cfg.optim.lr, cfg.optim.momentum, cfg.optim.weight_decay) == ("sgd", 0.1, 0.9, 5e-4)
    assert cfg.optim.schedule == "cosine" and 0 < cfg.optim.warmup_steps < cfg.steps // 10
    assert cfg.steps * cfg.batch_size >= 100 * TRAIN_IMAGES * 0.99  # 117 full batches an epoch (drop_last)
    assert cfg.nesting.mode == "joint" and cfg.model.projector_hidden == 2048
    if objective == "scl":
        assert cfg.objective.normalize == "prefix"  # the paper's l2 normalization, per nested prefix


def test_cpu_recipe_composes_on_one_channel_images_with_its_own_normalization():
    cfg = train_config(compose_config(["experiment=fashion_mnist_cpu"]))
    assert cfg.data.mean == [0.2860] and cfg.data.std == [0.3530] and cfg.data.root == "data/fashion_mnist"
    assert cfg.cpu_threads == 2


def test_each_fashion_step_of_the_device_script_fits_8_minutes_and_runs_real_recipes(tmp_path):
    steps = gpu_check.fashion_steps("python", tmp_path)
    assert {s.name for s in steps} == {"q_fashion_scl", "q_fashion_vicreg", "q_fashion_lightly"}
    for step in steps:
        assert step.part == 4 and step.box_s <= 8 * 60
        args = bench_fashion_mnist.parse(step.argv[2:])
        for cell in args.cells:
            bench_fashion_mnist.cell_config(argparse_root(args), cell)  # composes: the experiment exists
        assert args.stem.name.startswith("fashion_mnist_gpu_")  # never over the committed CPU report


def argparse_root(args):
    args.root = fashion_mnist_data.OUT[args.layout]
    return args


def test_the_committed_report_is_what_its_json_says_and_the_readme_links_it():
    """benchmarks/fashion_mnist.md is rendered from its .json (or, for an interrupted run, .partial.json, and then
    says so) by tools/bench_fashion_mnist.py: rerender with --render after any change to either."""
    import json

    stem = REPO / "benchmarks" / "fashion_mnist"
    data = stem.with_suffix(".json") if stem.with_suffix(".json").exists() else stem.with_suffix(".partial.json")
    results = json.loads(data.read_text())
    args = bench_fashion_mnist.parse(results["argv"])
    expected = "\n".join(bench_fashion_mnist.report_lines(results, args, stem)) + "\n"
    assert stem.with_suffix(".md").read_text() == expected, "stale: python tools/bench_fashion_mnist.py --render"
    assert results.get("complete", True) or "**Partial" in expected
    assert "(benchmarks/fashion_mnist.md)" in (REPO / "README.md").read_text()
