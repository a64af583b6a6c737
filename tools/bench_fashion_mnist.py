"""Issue 50 items 2-4: eigtrain's Fashion-MNIST recipe beside lightly's and beside raw pixels, and the paper's
table (RR, JN, FF, PCA, RS at k = 4, 8, ..., d; SCL and VICReg; seeds, paired intervals, undetermined cuts).

    python tools/fashion_mnist_data.py                       # the shards (once)
    python tools/bench_fashion_mnist.py [--layout report|select] [--steps N] [--seeds 0 1 2]
        [--cells fashion_mnist_cpu:scl fashion_mnist_cpu:vicreg_paper] [--peers simclr vicreg barlowtwins]
        [--ff 4 8 16]   # a cell: EXPERIMENT[:OBJECTIVE] (the GPU step: fashion_mnist_gpu_scl fashion_mnist_gpu_vicreg)
    # -> benchmarks/fashion_mnist.md, .json, _eigenvalues.png (layout select: benchmarks/fashion_mnist_select.*)

Every cell trains with the same backbone (eigtrain's tiny CNN), batch and steps; probes are eigtrain-eval's (the
paper's SGD probe on whitened features, and the 20-NN vote), at full dimension. eigtrain's cells are the recipe
(configs/experiment/fashion_mnist_cpu.yaml, or the GPU ones), the objective overridden where a cell names one;
the peers take the first cell's backbone, batch and steps; lightly's cells are its documentation's examples as written (its losses, projection heads, transforms, SGD lr 0.06), run on the
same images (lightly's transforms want RGB: the gray image is repeated, as lightly's dataset loader does).
samples/s: training images per second of wall time of each trainer's training call, in the same run.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import claims_table  # noqa: E402  (tools/ is no package)
import fashion_mnist_data as fmd  # noqa: E402

from eigtrain.evaluate.command import EvalConfig, evaluate  # noqa: E402
from eigtrain.evaluate.probes import pca_features, probe_accuracy  # noqa: E402
from eigtrain.export.command import main as rr_main  # noqa: E402
from eigtrain.runs.checkpoint import load_encoder  # noqa: E402
from eigtrain.train.command import compose_config, run  # noqa: E402
from eigtrain.train.knn import knn_accuracy  # noqa: E402

OUT = Path("benchmarks")
EVAL = dict(probe="sgd", retrieval="none", random_draws=20, device="auto")  # the paper's probe; RS: up to 20 draws
PEER_K = (4, 8, 16)  # small k: PCA of the peer's embedding against eigtrain's ordered export


def knn(train_x, train_y, test_x, test_y, block: int = 1000) -> float:
    """The 20-NN vote in blocks of test rows (a 10,000 x 60,000 similarity matrix at once is 2.4 GB)."""
    hits = sum(
        knn_accuracy(train_x, train_y, test_x[s : s + block], test_y[s : s + block]) * len(test_y[s : s + block])
        for s in range(0, len(test_y), block)
    )
    return hits / len(test_y)


def scores(train_x, train_y, test_x, test_y) -> dict:
    return {
        "probe": probe_accuracy(train_x, train_y, test_x, test_y).item(),
        "knn": knn(train_x, train_y, test_x, test_y),
    }


def source(args) -> dict:
    """The layout's splits as arrays; --limit: the first N images of each (the dry run)."""
    parts = fmd.splits(args.layout, fmd.load())
    return {s: (x[: args.limit or None], y[: args.limit or None]) for s, (x, y) in parts.items()}


def pixels(parts: dict) -> dict:
    """Raw pixels, 0..1 floats (N, 784), and labels, of each split."""
    return {
        s: (torch.from_numpy(x.reshape(len(x), -1).astype(np.float32) / 255), torch.from_numpy(y.astype(np.int64)))
        for s, (x, y) in parts.items()
    }


def floor(data: dict) -> dict:
    """The raw 784 pixels: the same probe (whitened, as eigtrain-eval's) and the 20-NN vote on standardized pixels."""
    (tx, ty), (vx, vy) = data["train"], data["val"]
    mean, std = tx.mean(0), tx.std(0).clamp_min(1e-6)
    return scores((tx - mean) / std, ty, (vx - mean) / std, vy)


# ---------------------------------------------------------------------------------------------- eigtrain


def cell_config(args, cell: str, *extra: str):
    """The composed config of a cell, EXPERIMENT[:OBJECTIVE], on the layout's shards and the budget's steps."""
    experiment, _, objective = cell.partition(":")
    return compose_config(
        [
            f"experiment={experiment}",
            f"data.root={args.root}",
            *([f"objective={objective}"] if objective else []),
            "logging.progress=false",
            "logging.wandb.mode=disabled",
            *([f"steps={args.steps}", f"checkpoint_every={args.steps}"] if args.steps else []),
            *extra,
        ]
    )


def train_eigtrain(run_dir: Path, args, seed: int, cell: str, *extra: str) -> float:
    """Train one cell; returns its samples/s (wall time of the training call)."""
    composed = cell_config(args, cell, f"run_dir={run_dir}", f"seed={seed}", *extra)
    start = time.perf_counter()
    run(composed)
    return composed.steps * composed.batch_size / (time.perf_counter() - start)


def eigtrain_cell(args, seed: int, cell: str, tmp: Path) -> dict:
    main = tmp / f"{cell.replace(':', '-')}-{seed}"
    rate = train_eigtrain(main, args, seed, cell)
    ffs = []
    for k in args.ff:
        train_eigtrain(Path(f"{main}-ff{k}"), args, seed, cell, "nesting=none", "nesting.prefixes=null", f"dim={k}")
        ffs.append(f"{main}-ff{k}")
    assert rr_main([f"run_dir={main}"]) == 0
    report, _ = evaluate(EvalConfig(run_dir=str(main), ff_run_dirs=ffs, out=str(main / "eval"), **EVAL))
    manifest = json.loads((main / "rr" / "manifest.json").read_text())
    report["samples_per_s"] = rate
    cfg = cell_config(args, cell)  # like for like with the peers' rows: the backbone's features, their protocol
    normalization = (cfg.data.mean, cfg.data.std)
    report["backbone"] = backbone_scores(load_encoder(main).backbone, args, torch.device("cpu"), normalization)
    report["untrained"] = untrained_scores(cfg, seed, args, normalization)
    return {"report": report, "eigenvalues": {"eigenvalues": manifest["spectrum"], "steps": args.steps}}


class _Normalized(torch.nn.Module):
    """An encoder's l2-normalized output: the space SCL's export spans (the probe whitens: its basis is moot)."""

    def __init__(self, encoder: torch.nn.Module):
        super().__init__()
        self.encoder = encoder

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.normalize(self.encoder(x), dim=1)


def untrained_scores(cfg, seed: int, args, normalization) -> dict:
    """The control: the recipe's encoder as initialized (seed), never trained; its backbone and its normalized output
    scored as the trained ones are. What training adds is the difference."""
    from eigtrain.models import build_encoder
    from eigtrain.schema import ModelConfig
    from eigtrain.schema.check import typed

    torch.manual_seed(seed)
    encoder = build_encoder(typed(ModelConfig, cfg.model), cfg.dim, (1, 28, 28)).eval()
    cpu = torch.device("cpu")
    return {
        "backbone": backbone_scores(encoder.backbone, args, cpu, normalization),
        "output": backbone_scores(_Normalized(encoder), args, cpu, normalization),
    }


# ---------------------------------------------------------------------------------------------- lightly

# lightly's examples (docs/source/examples): loss, projection head (input, hidden, output), transform
PEERS = {
    "simclr": ("NTXentLoss", "SimCLRProjectionHead", (512, 128), "SimCLRTransform"),
    "vicreg": ("VICRegLoss", "BarlowTwinsProjectionHead", (2048, 2048), "VICRegTransform"),
    "barlowtwins": ("BarlowTwinsLoss", "BarlowTwinsProjectionHead", (2048, 2048), "BYOLTransform"),
}


class _Views(torch.utils.data.Dataset):
    def __init__(self, images: np.ndarray, transform):
        self.images, self.transform = images, transform

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, i):
        from PIL import Image

        return self.transform(Image.fromarray(self.images[i]).convert("RGB"))


def lightly_transform(name: str, size: int):
    import lightly.transforms as lt

    if name == "BYOLTransform":  # the Barlow Twins example's two asymmetric views
        return lt.BYOLTransform(lt.BYOLView1Transform(input_size=size), lt.BYOLView2Transform(input_size=size))
    return getattr(lt, name)(input_size=size)


def lightly_cell(args, seed: int, peer: str) -> dict:
    """lightly's example for `peer` on eigtrain's tiny CNN (RGB input), the recipe's batch and steps."""
    import lightly.loss
    import lightly.models.modules as heads
    from omegaconf import OmegaConf

    from eigtrain.models.backbones import build_backbone

    torch.manual_seed(seed)
    cfg = cell_config(args, args.cells[0])
    loss_name, head_name, (hidden, out), transform = PEERS[peer]
    backbone = build_backbone(OmegaConf.to_object(cfg.model), (3, 28, 28))
    head = getattr(heads, head_name)(backbone.num_features, hidden, out)
    criterion = getattr(lightly.loss, loss_name)()
    params = list(backbone.parameters()) + list(head.parameters())
    optimizer = torch.optim.SGD(params, lr=0.06)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    backbone.to(device), head.to(device)
    images, labels = source(args)["train"]
    loader = torch.utils.data.DataLoader(
        _Views(images, lightly_transform(transform, 28)),
        batch_size=cfg.batch_size,
        shuffle=True,
        drop_last=True,
        num_workers=cfg.data.num_workers,
        persistent_workers=True,
    )
    step, start = 0, time.perf_counter()
    while step < cfg.steps:
        for views in loader:
            x0, x1 = (v.to(device, non_blocking=True) for v in views[:2])
            loss = criterion(head(backbone(x0)), head(backbone(x1)))
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            step += 1
            if step == cfg.steps:
                break
    rate = cfg.steps * cfg.batch_size / (time.perf_counter() - start)
    return {"samples_per_s": rate, "final_loss": float(loss), **backbone_scores(backbone, args, device)}


LIGHTLY_NORMALIZATION = ([0.485, 0.456, 0.406], [0.229, 0.224, 0.225])  # lightly's transforms' (RGB)


@torch.no_grad()
def backbone_scores(backbone, args, device, normalization=LIGHTLY_NORMALIZATION) -> dict:
    """Probe and 20-NN on the backbone's features (lightly's protocol), and PCA of them at small k; the images
    normalized as the backbone was trained (lightly: RGB, its constants; eigtrain: one channel, the recipe's)."""
    backbone.eval()
    mean, std = (torch.tensor(v, device=device).view(1, -1, 1, 1) for v in normalization)
    feats = {}
    for split, (x, y) in pixels(source(args)).items():
        images = x.view(-1, 1, 28, 28).expand(-1, mean.shape[1], -1, -1)
        feats[split] = (torch.cat([backbone((b.to(device) - mean) / std).cpu() for b in images.split(1000)]), y)
    (tz, ty), (vz, vy) = feats["train"], feats["val"]
    if not all(bool(torch.isfinite(z).all()) for z in (tz, vz)):  # the training diverged: nothing to probe
        return {"diverged": "the backbone's features are not finite", "dim": tz.shape[1]}
    result = scores(tz, ty, vz, vy)
    result["dim"] = tz.shape[1]
    try:  # a collapsed embedding (most directions dead) can leave PCA's small-k features without a whitening
        ptrain, ptest = pca_features(tz, vz)
        result["pca"] = {str(k): probe_accuracy(ptrain[:, :k], ty, ptest[:, :k], vy).item() for k in PEER_K}
    except torch.linalg.LinAlgError as error:
        result["pca_failed"] = str(error).splitlines()[0]
    return result


# ---------------------------------------------------------------------------------------------- report


def report_lines(results: dict, args, stem: Path) -> list[str]:
    floor_ = results["raw pixels"]
    head = (
        f"# Fashion-MNIST: eigtrain beside lightly and raw pixels\n\nMade by `python tools/bench_fashion_mnist.py "
        f"{' '.join(args.argv)}` at commit {results['commit']}. Layout `{args.layout}`: "
        + (
            "train on the 60,000 training images, scored on the 10,000 test images."
            if args.layout == "report"
            else "train on the first 50,000 training images, scored on the last 10,000 (the carve-out)."
        )
        + (
            ""
            if results.get("complete", True)
            else " **Partial: the run was interrupted; only the cells below were finished (seeds per row as listed).**"
        )
        + f" Budget: {results['steps']} steps of batch {results['batch']}, seeds {args.seeds}. Probe: eigtrain-eval's "
        "SGD probe (50 epochs, whitened features); kNN: 20-NN cosine vote. samples/s: both trainers in this run, "
        "side by side on the same machine.\n"
    )
    lines = [
        head,
        "## At full dimension\n",
        "| features | dim | probe % | 20-NN % | samples/s |",
        "|---|---|---|---|---|",
    ]
    lines.append(f"| raw pixels (standardized) | 784 | {100 * floor_['probe']:.1f} | {100 * floor_['knn']:.1f} | – |")
    for objective, cells in results["eigtrain"].items():
        reps = [c["report"] for c in cells.values()]
        d = max(int(k) for k in reps[0]["accuracy"]["RR"])
        lines.append(
            f"| eigtrain {objective} (RR export) | {d} | {claims_table.fmt([r['accuracy']['RR'][str(d)] for r in reps])}"
            f" | {claims_table.fmt([r['knn']['rr'] for r in reps])} | "
            f"{np.mean([r['samples_per_s'] for r in reps]):.0f} |"
        )
        named = {"backbone, as lightly's rows": lambda r: r["backbone"]}  # like for like: the layer lightly probes
        named |= {  # the control: what the same encoder gives before any training
            "untrained, its normalized output": lambda r: r["untrained"]["output"],
            "untrained, its backbone": lambda r: r["untrained"]["backbone"],
        }
        for what, pick in named.items():
            if all("untrained" in r for r in reps):
                rows = [pick(r) for r in reps]
                probes, knns = (claims_table.fmt([row[key] for row in rows]) for key in ("probe", "knn"))
                lines.append(f"| eigtrain {objective} ({what}) | {rows[0]['dim']} | {probes} | {knns} | – |")
    for peer, cells in results["lightly"].items():
        cs = [c for c in cells.values() if "diverged" not in c]  # a diverged seed is said, never averaged in
        gone = [f"seed {s}: {c['diverged']}" for s, c in cells.items() if "diverged" in c]
        lines.append(
            f"| lightly {peer} (backbone){' — diverged: ' + '; '.join(gone) if gone else ''} | "
            f"{list(cells.values())[0]['dim']} | {claims_table.fmt([c['probe'] for c in cs])} | "
            f"{claims_table.fmt([c['knn'] for c in cs])} | "
            f"{np.mean([c['samples_per_s'] for c in cells.values()]):.0f} |"
        )
    if results["lightly"]:
        lines += ["", "## Small k: PCA of lightly's embedding vs eigtrain's ordered export (probe %)", ""]
        lines += ["| features | " + " | ".join(f"k = {k}" for k in PEER_K) + " |", "|---|" + "---|" * len(PEER_K)]
        for objective, cells in results["eigtrain"].items():
            lines.append(
                f"| eigtrain {objective}, RR | "
                + " | ".join(
                    claims_table.fmt([c["report"]["accuracy"]["RR"][str(k)] for c in cells.values()]) for k in PEER_K
                )
                + " |"
            )
            backbones = [c["report"]["backbone"] for c in cells.values() if "pca" in c["report"].get("backbone", {})]
            if backbones:
                lines.append(
                    f"| eigtrain {objective}, PCA of its backbone | "
                    + " | ".join(claims_table.fmt([b["pca"][str(k)] for b in backbones]) for k in PEER_K)
                    + " |"
                )
        for peer, cells in results["lightly"].items():
            lines.append(
                f"| lightly {peer}, PCA | "
                + " | ".join(claims_table.fmt([c["pca"][str(k)] for c in cells.values() if "pca" in c]) for k in PEER_K)
                + " |"
            )
    cells = table_cells(results)
    dims = tuple(sorted({k for s in cells.values() for r, _ in s.values() for k in r["accuracy"]["RR"]}, key=int))
    lines += ["", "## The paper's table (probe %, mean ± sd over seeds)"]
    for objective, seeds in cells.items():
        lines += ["", f"### {claims_table.NAMES.get(objective, objective)}", ""]
        lines += claims_table.method_rows(seeds, ("RR", "JN", "FF", "PCA", "RS"), dims)
    lines += claims_table.paired_lines(cells, dims, compact=True)
    return lines + ["", f"![eigenvalue decay of each export, seeds overlaid]({stem.name}_eigenvalues.png)"]


def table_cells(results: dict) -> dict:
    """The shape claims_table reads: {objective: {seed: (report, eigenvalues)}}."""
    return {
        o: {int(s): (c["report"], c["eigenvalues"]) for s, c in cells.items()}
        for o, cells in results["eigtrain"].items()
    }


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layout", choices=("report", "select"), default="report")
    parser.add_argument("--steps", type=int, default=0, help="0: the recipe's")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--cells", nargs="*", default=["fashion_mnist_cpu:scl", "fashion_mnist_cpu:vicreg_paper"])
    parser.add_argument("--peers", nargs="*", default=list(PEERS), choices=list(PEERS))
    parser.add_argument("--ff", type=int, nargs="*", default=[], help="FF: a model trained at each of these k")
    parser.add_argument(
        "--out", type=Path, default=None, help="report stem (default benchmarks/fashion_mnist[_select])"
    )
    parser.add_argument("--limit", type=int, default=0, help="the first N images of each split (a dry run)")
    parser.add_argument("--no-eigtrain", action="store_true", help="the peers only (they use the first cell's setup)")
    parser.add_argument("--render", action="store_true", help="only rewrite the report from its .json (same options)")
    args = parser.parse_args(argv)
    args.argv = [a for a in argv if a != "--render"]  # the command the report names
    args.stem = args.out or OUT / ("fashion_mnist" if args.layout == "report" else "fashion_mnist_select")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse(sys.argv[1:] if argv is None else argv)
    stem = args.stem
    if args.render:  # the finished run's numbers, else those an interrupted one saved (said so in the report)
        done = stem.with_suffix(".json") if stem.with_suffix(".json").exists() else stem.with_suffix(".partial.json")
        results = json.loads(done.read_text())
        if "argv" in results:  # the report names (and is laid out by) the command that made it, not --render's
            args = parse(results["argv"])
        return write_report(results, args, stem)
    args.root = fmd.OUT[args.layout]
    cfg = cell_config(args, args.cells[0])
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    results: dict = {"commit": commit, "steps": cfg.steps, "batch": cfg.batch_size, "eigtrain": {}, "lightly": {}}
    results.update(code=code_digest(), argv=args.argv, complete=False)
    results = resumed(stem, results)  # the cells an interrupted run of the same code and command finished
    with tempfile.TemporaryDirectory() as tmp:
        if args.limit:  # the dry run's own small shards
            args.root = Path(tmp) / "shards"
            fmd.write("report", {"train": source(args)["train"], "test": source(args)["val"]}, args.root)
        elif not (args.root / "index.json").exists():  # the device script's machine starts bare
            fmd.write(args.layout, fmd.load(), args.root)
        if "raw pixels" not in results:
            results["raw pixels"] = floor(pixels(source(args)))
        print("raw pixels", results["raw pixels"], flush=True)
        for seed in args.seeds:  # eigtrain and lightly alternate: their samples/s are measured side by side
            for cell in [] if args.no_eigtrain else args.cells:
                if str(seed) not in results["eigtrain"].get(cell, {}):
                    results["eigtrain"].setdefault(cell, {})[str(seed)] = eigtrain_cell(args, seed, cell, Path(tmp))
                    save_partial(stem, results)
                print("done eigtrain", cell, seed, flush=True)
            for peer in args.peers:
                if str(seed) not in results["lightly"].get(peer, {}):
                    results["lightly"].setdefault(peer, {})[str(seed)] = lightly_cell(args, seed, peer)
                    save_partial(stem, results)
                print("done lightly", peer, seed, results["lightly"][peer][str(seed)], flush=True)
    from eigtrain.safe_files import write_text

    results["complete"] = True
    write_text(stem.with_suffix(".json"), json.dumps(results, indent=1, default=str) + "\n")
    stem.with_suffix(".partial.json").unlink(missing_ok=True)
    write_report(json.loads(stem.with_suffix(".json").read_text()), args, stem)  # the keys as the file has them


CODE = (
    "eigtrain",
    "configs",
    "launch",
    "tools/bench_fashion_mnist.py",
    "tools/fashion_mnist_data.py",
    "pyproject.toml",
)


def code_digest() -> str:
    """The committed trees of what makes the numbers (and whether they have local changes): a run resumes only
    cells made by the same code."""
    trees = subprocess.run(["git", "rev-parse", *(f"HEAD:{p}" for p in CODE)], capture_output=True, text=True)
    dirty = subprocess.run(["git", "status", "--porcelain", *CODE], capture_output=True, text=True).stdout.strip()
    return " ".join(t[:12] for t in trees.stdout.split()) + (" +local changes" if dirty else "")


def resumed(stem: Path, fresh: dict) -> dict:
    """The partial results of an interrupted run (stem.partial.json, written after every cell) when they were made
    by the same code and command; else `fresh` (a run with local changes never resumes)."""
    partial = stem.with_suffix(".partial.json")
    if not partial.exists():
        return fresh
    old = json.loads(partial.read_text())
    if old.get("code") != fresh["code"] or old.get("argv") != fresh["argv"] or "+local" in fresh["code"]:
        print(f"{partial}: made by other code or another command; starting over", flush=True)
        return fresh
    done = sum(len(v) for part in ("eigtrain", "lightly") for v in old[part].values())
    print(f"{partial}: resuming after {done} finished cell(s) of commit {old['commit']}", flush=True)
    return {**old, "commit": f"{old['commit']} (resumed at {fresh['commit']}, the same code)"}


def save_partial(stem: Path, results: dict) -> None:
    from eigtrain.safe_files import write_text

    write_text(stem.with_suffix(".partial.json"), json.dumps(results, indent=1, default=str) + "\n")


def write_report(results: dict, args, stem: Path, plot: bool = True) -> None:
    from eigtrain.safe_files import write_text, write_with

    write_text(stem.with_suffix(".md"), "\n".join(report_lines(results, args, stem)) + "\n")
    if results["eigtrain"] and plot:
        title = "eigenvalue decay on Fashion-MNIST"
        write_with(f"{stem}_eigenvalues.png", lambda path: claims_table.plot(table_cells(results), path, title))
    print(stem.with_suffix(".md").read_text())


if __name__ == "__main__":
    main()
