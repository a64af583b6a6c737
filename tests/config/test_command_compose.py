"""Every command's key=value line composes through eigtrain.cli.compose_dataclass (issue 23, item 1): list keys
take `[a,b]`, `a,b` or `a` on every dataclass command, and the synthetic run/grid/table commands share the path's
one-line errors (their own override parser is retired)."""

import ast
from pathlib import Path

import pytest

from eigtrain.cli import compose_dataclass
from eigtrain.evaluate.command import EvalConfig
from eigtrain.evaluate.command import main as eval_main
from eigtrain.objectives import OBJECTIVES as OBJECTIVE_REGISTRY
from eigtrain.synthetic import config as synthetic_config
from eigtrain.synthetic.cli import main as synthetic_main
from eigtrain.synthetic.extract import PAPER_RR_MODE
from eigtrain.synthetic.grid import cell_configs, parse_grid_args
from eigtrain.synthetic.table import parse_table_args

SYNTHETIC = Path(synthetic_config.__file__).parent


@pytest.mark.parametrize(
    "value, dirs",
    [
        ("[/r/ff4,/r/ff8]", ["/r/ff4", "/r/ff8"]),
        ("/r/ff4,/r/ff8", ["/r/ff4", "/r/ff8"]),  # the synthetic grid's comma lists
        ("/r/ff4", ["/r/ff4"]),
        ("[]", []),
        ("[/sweep/dim=4,/sweep/dim=8]", ["/sweep/dim=4", "/sweep/dim=8"]),  # a sweep point's directory name
        ("[~/runs/ff(4),s3://b/x?y=1]", ["~/runs/ff(4)", "s3://b/x?y=1"]),
        ("[/d/train-{000..009}.tar,/d/{a,b}.tar]", ["/d/train-{000..009}.tar", "/d/{a,b}.tar"]),
        ("['/sweep/dim=4,nesting=none','/r/a b']", ["/sweep/dim=4,nesting=none", "/r/a b"]),  # quoted: commas inside
    ],
)
def test_a_list_of_strings_takes_every_list_form(value, dirs):
    assert compose_dataclass(EvalConfig, [f"ff_run_dirs={value}"]).ff_run_dirs == dirs


@pytest.mark.parametrize(
    "value, dims", [("[4,8]", [4, 8]), ("4,8", [4, 8]), ("16", [16]), ("[3e1]", [30]), ("null", None)]
)
def test_a_list_of_integers_takes_every_list_form(value, dims):
    assert compose_dataclass(EvalConfig, [f"dims={value}"]).dims == dims


@pytest.mark.parametrize(
    "argv, message",
    [
        (["dims=[4,x]"], r"^bad value for dims\[1\]: Value 'x'"),
        (["dims=4,8.5"], r"^bad value for dims\[1\]"),
        (["ff_run_dirz=[a]"], r"^unknown key 'ff_run_dirz'; allowed: run_dir"),
    ],
)
def test_a_bad_list_is_one_line_naming_the_key_and_item(argv, message):
    with pytest.raises(ValueError, match=message) as error:
        compose_dataclass(EvalConfig, argv)
    assert "\n" not in str(error.value)


# -- eigtrain-synthetic: run, grid and table compose their dataclasses like eval and rr -------------------------


def test_synthetic_objectives_are_the_registry():
    assert synthetic_config.OBJECTIVES == tuple(OBJECTIVE_REGISTRY)
    assert set(PAPER_RR_MODE) == set(OBJECTIVE_REGISTRY)  # appendix F's estimator of each
    with pytest.raises(
        ValueError, match=f"objective='simclr' is not allowed; allowed: {', '.join(OBJECTIVE_REGISTRY)}$"
    ):
        synthetic_config.parse_run_args(["objective=simclr"]).validate()


def test_the_synthetic_override_parser_is_retired():
    assert not hasattr(synthetic_config, "apply_overrides") and not hasattr(synthetic_config, "convert")
    for path in SYNTHETIC.glob("*.py"):  # no default read at a call site: the dataclasses hold them
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "getattr":
                assert len(node.args) == 2, f"{path.name}:{node.lineno}: getattr with a default"
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get":
                target = ast.unparse(node.func.value)
                assert "cfg" not in target and "config" not in target, f"{path.name}:{node.lineno}: {target}.get"


def test_grid_keys_are_typed_lists_in_the_documented_comma_syntax():
    grid = parse_grid_args(
        [
            "recipe=paper",
            "kernels=legendre,fourier",
            "ranks=8,6",
            "methods=lora-jn,rq-rr",
            "seeds=0,1",
            "steps=1000",
            "fourier.steps=1500",
            "fourier.lr=3e-3",
        ]
    )
    assert (grid.kernels, grid.ranks, grid.methods, grid.seeds) == (
        ["legendre", "fourier"],
        [8, 6],
        ["lora-jn", "rq-rr"],
        [0, 1],
    )
    legendre, fourier = cell_configs(grid, "legendre", 8), cell_configs(grid, "fourier", 6)
    assert len(legendre) == 4 and {c.steps for c in legendre} == {1000} and {c.lr for c in legendre} == {1e-3}
    assert {c.steps for c in fourier} == {1500} and {c.lr for c in fourier} == {3e-3}  # the kernel's own keys win
    assert {c.preset for c in fourier} == {"paper"} and {c.train_samples for c in fourier} == {10_000_000}


@pytest.mark.parametrize(
    "argv, message",
    [
        (["ranks=8,x"], r"^bad value for ranks\[1\]: Value 'x'"),
        (["methods=lora-jn,simclr-jn"], r"^methods='simclr-jn' is not allowed; allowed: lora-rr, lora-jn"),
        (["kernels=legendre,bessel"], r"^kernels='bessel' is not allowed; allowed: legendre, fourier"),
        (["recipe=mine"], r"^recipe='mine' is not allowed; allowed: paper, eigtrain$"),
        (["stepz=4"], r"^unknown key 'stepz'; allowed: preset, kernel"),  # a run key: checked before any training
        (["steps=four"], r"^bad value for steps: Value 'four'"),
        (["legendr.lr=1e-3"], r"^legendr.lr=1e-3: 'legendr' is no kernel; KERNEL.key=value takes one of legendre"),
        (["ranks=7"], r"^rank=7: must be an even number"),
    ],
)
def test_a_bad_grid_line_is_one_line_before_any_training(argv, message, tmp_path, capsys):
    with pytest.raises(ValueError, match=message):
        parse_grid_args([*argv, f"dir={tmp_path}"])
    assert synthetic_main(["grid", *argv, f"dir={tmp_path}"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("eigtrain-synthetic: ") and err.count("\n") == 1 and not list(tmp_path.iterdir())


def test_table_keys_are_typed_lists():
    table = parse_table_args(["recipes=paper,paper_4k", "goal=[]", "union=eigtrain_4k,eigtrain_12k", "ranks=6"])
    assert (table.recipes, table.goal, table.union, table.ranks) == (
        ["paper", "paper_4k"],
        [],
        ["eigtrain_4k", "eigtrain_12k"],
        [6],
    )
    assert parse_table_args([]).union == [] and parse_table_args(["kernels=fourier"]).kernels == ["fourier"]
    with pytest.raises(ValueError, match=r"^bad value for ranks\[0\]"):
        parse_table_args(["ranks=six"])


# -- eigtrain-eval ff_run_dirs=[...] on the command line (tools/bench_claims.py called evaluate() around it) ------


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A joint-nesting run and fixed-size runs at k = 4, 8 in directories named as a sweep names its points."""
    from eigtrain.data.write import main as write_shards
    from eigtrain.export.command import main as rr_main
    from eigtrain.train.command import compose_config, run

    tmp = tmp_path_factory.mktemp("ff")
    write_shards(["source=digits", f"out={tmp / 'digits'}", "shard_size=200"])

    def train(run_dir, *extra):  # quoted: eigtrain-train's own Hydra grammar refuses a bare `=` in a value
        run(
            compose_config(
                [
                    "experiment=cpu_debug",
                    f"run_dir='{run_dir}'",
                    f"data.root={tmp / 'digits'}",
                    "steps=2",
                    "checkpoint_every=2",
                    "logging.wandb.mode=disabled",
                    "logging.progress=false",
                    *extra,
                ]
            )
        )

    train(tmp / "main")
    for k in (4, 8):
        train(tmp / "sweep" / f"dim={k}", "nesting=none", f"dim={k}")
    assert rr_main([f"run_dir={tmp / 'main'}", "num_workers=0"]) == 0
    return tmp


@pytest.mark.slow
def test_eval_command_line_takes_ff_run_dirs(trained, capsys):
    ffs = [trained / "sweep" / "dim=4", trained / "sweep" / "dim=8"]
    args = [f"run_dir={trained / 'main'}", "probe=closed_form", "retrieval=none", "random_draws=2", "pca=false"]
    assert eval_main([*args, f"ff_run_dirs=[{ffs[0]},{ffs[1]}]", "dims=[4,8]", f"out={trained / 'eval'}"]) == 0, (
        capsys.readouterr().err
    )
    assert "| FF |" in (trained / "eval" / "table.md").read_text()
    assert eval_main([*args, f"ff_run_dirs={ffs[1]}", "dims=8", f"out={trained / 'eval8'}"]) == 0  # one item, no []
    assert "| FF |" in (trained / "eval8" / "table.md").read_text()


def test_eigtrain_train_says_how_to_quote_a_value_its_grammar_cannot_read(monkeypatch, tmp_path):
    from eigtrain.train.command import main as train_main

    point = tmp_path / "sweep" / "dim=4"  # as a sweep names its points: the value holds a second `=`
    monkeypatch.setattr("sys.argv", ["eigtrain-train", "experiment=cpu_debug", f"run_dir={point}"])
    with pytest.raises(SystemExit) as exit_:
        train_main()
    assert str(exit_.value.code) == (
        f"eigtrain-train: config error: run_dir={point}: Hydra's override grammar cannot "
        f"read this value; quote it as \"run_dir='{point}'\" (the single quotes reach "
        f"Hydra, the double quotes the shell)"
    )
    assert not point.exists()


def test_python_dash_m_eigtrain_train_is_the_trainer_again():
    """`python -m eigtrain.train` (older docs and scripts) runs eigtrain-train: its config error, one line."""
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-m", "eigtrain.train", "experiment=nope"], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert done.stderr.strip().startswith("eigtrain-train: config error: experiment=nope is not an option")
