"""The grid behind Table 1: for each (kernel, rank), the six methods x seeds of one recipe train as one
batched ensemble, and one compact JSON per cell (recipe, kernel, rank) keeps every run's numbers.

  eigtrain-synthetic grid recipe=paper kernels=legendre,fourier ranks=6,8,10 seeds=0,1,2,3,4 \\
      dir=benchmarks/synthetic/paper steps=700 [run keys; KERNEL.key=value for one kernel]
"""

import dataclasses
import json
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from eigtrain import safe_files
from eigtrain.cli import compose_dataclass
from eigtrain.synthetic.config import PRESETS, SyntheticConfig, parse_run_args, stored_with_defaults
from eigtrain.synthetic.kernels import KERNELS
from eigtrain.synthetic.paper import METHODS, superseded
from eigtrain.synthetic.run import run_ensemble

# eigtrain objective per method family: LoRA with one encoder on two views is SCL (unnormalized);
# VICReg is the paper's equation (vicreg_paper, lam = 1, mu = 10, nu = 30 in the synthetic runs).
FAMILY_OBJECTIVE = {"lora": "scl", "rq": "rq", "vicreg": "vicreg_paper"}
EXTRACTION = {"jn": "joint", "rr": "rr"}
DECIMALS = 5


@dataclass
class GridConfig:
    """The grid's own keys. Every other argument is a run key of eigtrain-synthetic for every cell, or
    KERNEL.key=value for that kernel's cells only (e.g. fourier.lr=3e-3)."""

    recipe: str = "eigtrain"  # the preset every run starts from: paper | eigtrain
    kernels: list[str] = field(default_factory=lambda: ["legendre", "fourier"])  # e.g. kernels=legendre,fourier
    ranks: list[int] = field(default_factory=lambda: [8, 6, 10])  # kernel ranks r; one cell per (kernel, rank)
    methods: list[str] = field(default_factory=lambda: list(METHODS))  # the paper's columns, family-extraction
    seeds: list[int] = field(default_factory=lambda: [0, 1, 2, 3, 4])  # one run per method and seed
    dir: str = "benchmarks/synthetic/eigtrain"  # one cell file per (kernel, rank): DIR/KERNEL_rRANK.json


@dataclass
class Grid(GridConfig):
    run_overrides: list[str] = field(default_factory=list)  # run keys for every cell; KERNEL.key=value for one

    def validate(self) -> "Grid":
        for key, values, allowed in (
            ("recipe", [self.recipe], PRESETS),
            ("kernels", self.kernels, KERNELS),
            ("methods", self.methods, METHODS),
        ):
            for value in values:
                if value not in allowed:
                    raise ValueError(f"{key}={value!r} is not allowed; allowed: {', '.join(allowed)}")
        for arg in self.run_overrides:  # KERNEL.key=value: a typo in KERNEL would silently apply nowhere
            kernel = arg.partition("=")[0].partition(".")[0]
            if "." in arg.partition("=")[0] and kernel not in KERNELS:
                raise ValueError(f"{arg}: {kernel!r} is no kernel; KERNEL.key=value takes one of {', '.join(KERNELS)}")
        for kernel in self.kernels:  # every cell's run keys compose and validate before any training
            for rank in self.ranks:
                cell_configs(self, kernel, rank)
        return self


def parse_grid_args(args: list[str]) -> Grid:
    """The grid's own keys compose GridConfig; every other argument is a run key of each cell's runs."""
    keys = {f.name for f in dataclasses.fields(GridConfig)}
    grid = compose_dataclass(GridConfig, [a for a in args if a.partition("=")[0] in keys])
    run_overrides = [a for a in args if a.partition("=")[0] not in keys]
    return Grid(**dataclasses.asdict(grid), run_overrides=run_overrides).validate()


def cell_configs(grid: Grid, kernel: str, rank: int) -> list[SyntheticConfig]:
    """The runs of one cell: the recipe, shared run keys, then KERNEL.key=value keys for this kernel."""
    shared = [a for a in grid.run_overrides if "." not in a.partition("=")[0]]
    own = [a.partition(".")[2] for a in grid.run_overrides if a.startswith(f"{kernel}.")]
    by_key = {a.partition("=")[0]: a for a in [f"preset={grid.recipe}", *shared, *own]}  # a kernel's own key wins
    base = parse_run_args(list(by_key.values()))
    return [
        dataclasses.replace(
            base,
            kernel=kernel,
            rank=rank,
            objective=FAMILY_OBJECTIVE[m.split("-")[0]],
            extraction=EXTRACTION[m.split("-")[1]],
            seed=s,
        ).validate()
        for m in grid.methods
        for s in grid.seeds
    ]


def _round(x):
    if isinstance(x, float):
        return round(x, DECIMALS)
    if isinstance(x, list):
        return [_round(v) for v in x]
    return x


def shared_config(cfgs: list[SyntheticConfig]) -> dict:
    """The keys every run of a cell shares (all but objective, extraction, seed, out)."""
    return {k: v for k, v in dataclasses.asdict(cfgs[0]).items() if k not in ("objective", "extraction", "seed", "out")}


def compact(
    recipe: str, methods: list[str], seeds: list[int], cfgs: list[SyntheticConfig], results: list[dict], seconds: float
) -> dict:
    """Every run's metrics (per seed, per function, every extraction), seed 0's curves; no histories."""
    # the cell's truth is psi_1..psi_d (a method's own target, e.g. VICReg's psi_2.., is stored with it)
    out = {
        "recipe": recipe,
        "config": shared_config(cfgs),
        "seeds": seeds,
        "wall_seconds": round(seconds, 1),
        "eigenvalues_true": _round(results[0]["eigenvalues_top"]),
        "curve_grid": results[0]["curve_grid"],
        "curve_true": results[0]["curve_true_top"],
        "methods": {},
    }
    for i, method in enumerate(methods):
        runs = results[i * len(seeds) : (i + 1) * len(seeds)]
        out["methods"][method] = {
            "objective": runs[0]["objective"],
            "extraction": runs[0]["extraction"],
            "target_first": runs[0]["target_first"],
            "eigenvalues_true": _round(runs[0]["eigenvalues_true"]),
            **{
                k: _round([r[k] for r in runs])
                for k in (
                    "ef_mse",
                    "ev_rae",
                    "ef_mse_per_function",
                    "ev_rae_per_function",
                    "eigenvalues_estimated",
                    "rr_pairs",
                )
            },
            "final_loss": _round([r["history"][-1]["loss"] for r in runs]),
            "extractions": {
                name: {m: _round([r["extractions"][name][m] for r in runs]) for m in ("ef_mse", "ev_rae")}
                for name in runs[0]["extractions"]
            },
            "curve_seed0": runs[0]["curve"],
            "curve_true": runs[0]["curve_true"],
        }
    return out


# Keys that do not change a run's numbers: a stored cell that differs only in these is still up to date.
NOT_RESULT_KEYS = ("log_every",)


def stored_cell(path: Path, cfgs: list[SyntheticConfig], seeds: list[int]) -> dict | None:
    """The cell file at path if it was run with the same shared config and seeds (else None: retrain all)."""
    if not path.exists():
        return None
    stored = json.loads(path.read_text())
    current, stored_config = shared_config(cfgs), stored_with_defaults(stored["config"])
    same = set(stored["config"]) <= set(current) and all(
        stored_config[k] == v for k, v in current.items() if k not in NOT_RESULT_KEYS
    )
    return stored if same and stored["seeds"] == seeds else None


def run_grid(grid: Grid) -> list[Path]:
    """Train each cell's methods that its file lacks (or holds in a superseded form); methods already
    stored with the same config and seeds are kept, so a cell can be filled a few methods at a time."""
    methods, seeds = grid.methods, grid.seeds
    written = []
    for rank in grid.ranks:
        for kernel in grid.kernels:
            path = Path(grid.dir) / f"{kernel}_r{rank}.json"
            cfgs = cell_configs(grid, kernel, rank)
            stored = stored_cell(path, cfgs, seeds)
            kept = {m: r for m, r in stored["methods"].items() if not superseded(r)} if stored else {}
            todo = [m for m in methods if m not in kept]
            if not todo:
                print(f"grid: {path} is up to date", file=sys.stderr)
                written.append(path)
                continue
            todo_cfgs = [c for i, c in enumerate(cfgs) if methods[i // len(seeds)] in todo]
            print(
                f"grid: training {path}: {', '.join(todo)} ({len(todo_cfgs)} runs as one ensemble)",
                file=sys.stderr,
                flush=True,
            )
            start = time.perf_counter()
            results = run_ensemble(todo_cfgs)
            cell = compact(grid.recipe, todo, seeds, todo_cfgs, results, time.perf_counter() - start)
            if kept:  # merge: the stored methods first, in the paper's column order
                assert stored is not None  # kept comes from it
                cell["wall_seconds"] = round(cell["wall_seconds"] + stored["wall_seconds"], 1)
                merged = {**kept, **cell["methods"]}
                cell["methods"] = {m: merged[m] for m in METHODS if m in merged}
                cell["config"] = {
                    **cell["config"],
                    **{k: stored["config"][k] for k in NOT_RESULT_KEYS if k in stored["config"]},
                }
            path.parent.mkdir(parents=True, exist_ok=True)
            safe_files.write_text(path, json.dumps(cell))  # a cell file is complete or absent
            written.append(path)
    return written
