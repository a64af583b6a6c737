"""The console scripts (pyproject's [project.scripts]). Each answers -h / --help and checks its command line -- every
key, type and value its configuration knows without reading data -- before the command's own module is imported:
torch, torchvision and DeepSpeed take seconds to import, and a typo should cost a fraction of one. The command then
checks the rest (paths, shards, devices) itself, as when it is called directly (`python -m eigtrain.export.command`,
tests, tools). The configuration modules these use import no torch (tests/config/test_config_before_torch.py).
"""

from __future__ import annotations

import sys
from typing import Any, Callable

from eigtrain.cli import asks_for_help


def _run(
    name: str,
    usage: str,
    check: Callable[[list[str]], Any],
    module: str,
    argv: list[str] | None,
    ahead: Callable[[Any], None] | None = None,
    pass_checked: bool = False,
) -> Any:
    """`module`'s main(args) once the arguments pass `check`; else the exit status (0 after -h, 2 after one error
    line). `module` (torch and all) is imported only then; `ahead(checked)` starts work that needs no torch first.
    pass_checked: main(args, checked), for a main that takes the checked configuration rather than compose it again."""
    import importlib

    from eigtrain.redact import redact_url

    args = sys.argv[1:] if argv is None else list(argv)
    if asks_for_help(args, usage):
        return 0
    try:
        checked = check(args)
    except ValueError as error:  # ConfigError and every one-line configuration refusal are ValueErrors
        print(redact_url(f"{name}: {error}"), file=sys.stderr)
        return 2
    if ahead is not None:
        ahead(checked)
    main = importlib.import_module(module).main
    try:
        return main(args, checked) if pass_checked else main(args)
    finally:
        if argv is None:  # a console script: its process ends next
            _skip_the_last_collections()


def _skip_the_last_collections() -> None:
    """The interpreter's collections at exit walk every object torch made: 0.35 s of a 1.5-s `import torch` process
    on 2 cores, ~0.4 s after eigtrain-rr. Frozen objects are never collected: what they hold goes back to the
    system with the process (exit handlers still run: logging, wandb, multiprocessing)."""
    import gc

    gc.freeze()


def _validated(schema: type) -> Callable[[list[str]], Any]:
    """The check of a command whose configuration is one dataclass with a validate() method."""
    from eigtrain.cli import compose_dataclass

    return lambda args: compose_dataclass(schema, args).validate()


def rr(argv: list[str] | None = None) -> int:
    from eigtrain.export import rr_config as c

    return _run("eigtrain-rr", c.USAGE, c.parse_args, "eigtrain.export.command", argv, _hash_embeddings_ahead, True)


def _hash_embeddings_ahead(cfg: Any) -> None:
    """eigtrain-rr embeddings=: the files' hash (the manifest's provenance, a second of CPU per 650 MB) runs while
    torch is imported, on the core the import leaves idle, in the process that records it (rank 0: RANK, else
    SLURM_PROCID, else a single process)."""
    import os

    from eigtrain.runs.checksums import hash_ahead

    rank = os.environ.get("RANK", os.environ.get("SLURM_PROCID", "0"))
    if cfg.embeddings and rank == "0" and os.path.exists(cfg.embeddings):
        hash_ahead(cfg.embeddings)


def evaluate(argv: list[str] | None = None) -> int:
    from eigtrain.evaluate import eval_config as c

    return _run("eigtrain-eval", c.USAGE, _validated(c.EvalConfig), "eigtrain.evaluate.command", argv)


def embed(argv: list[str] | None = None) -> int:
    from eigtrain.export import embed_config as c

    return _run("eigtrain-embed", c.USAGE, _validated(c.EmbedConfig), "eigtrain.export.corpus", argv)


def export(argv: list[str] | None = None) -> int:
    from eigtrain.export import export_config as c

    return _run("eigtrain-export", c.USAGE, _validated(c.ExportConfig), "eigtrain.export.standalone", argv)


def index(argv: list[str] | None = None) -> int:
    from eigtrain.export import index_config as c

    return _run("eigtrain-index", c.USAGE, _validated(c.IndexConfig), "eigtrain.export.index_build", argv)


def shards(argv: list[str] | None = None) -> None:
    from eigtrain.data import shards_config as c

    args = sys.argv[1:] if argv is None else list(argv)
    if asks_for_help(args, c.USAGE):
        return None
    index = args[:1] == ["index"]
    try:
        c.check_index_args(args[1:]) if index else c.parse_args(args)
    except ValueError as error:  # the command's own form of the refusal (exit status 1)
        raise SystemExit(f"eigtrain-shards{' index' if index else ''}: error: {error}") from None
    from eigtrain.data.write import main

    return main(args)


def synthetic(argv: list[str] | None = None) -> int:
    from eigtrain.synthetic import config as c

    def check(args: list[str]) -> None:
        if not args or args[0] not in ("grid", "table"):  # a run (grid and table check theirs in the command)
            c.parse_run_args(args).validate()

    return _run("eigtrain-synthetic", c.USAGE, check, "eigtrain.synthetic.cli", argv)


def train() -> None:
    """eigtrain-train (Hydra reads sys.argv): each point of the command line against the schema, then the trainer."""
    from eigtrain.cli import check_hydra_command_line, hydra_overrides
    from eigtrain.redact import redact_url
    from eigtrain.schema import ConfigError
    from eigtrain.train import compose

    args = sys.argv[1:]
    if hydra_overrides(args) is None and any(a in ("-h", "--help", "--hydra-help") for a in args):
        compose.hydra_app_help()  # Hydra prints the app's help and exits
    try:
        check_hydra_command_line(args, compose.check_schema)
    except (ConfigError, ValueError) as error:
        raise SystemExit(redact_url(f"eigtrain-train: config error: {error}")) from None
    from eigtrain.train.command import main

    main()
