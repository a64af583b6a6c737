"""The schema (eigtrain/schema/) is a leaf: it imports nothing of eigtrain's, has no module-level `__getattr__`, and
each of its Literal aliases lists exactly the values of the registry that uses them."""

import ast
from pathlib import Path
from typing import get_args

import pytest

import eigtrain
from eigtrain.schema import groups, objectives

SCHEMA = Path(eigtrain.__file__).parent / "schema"


def eigtrain_imports(path: Path) -> list[str]:
    """Modules of eigtrain's that `path` imports, outside the schema package (relative imports resolved)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = "eigtrain.schema" if node.level == 1 else "eigtrain" if node.level == 2 else ""
            names = [f"{base}.{node.module}" if base and node.module else base or node.module or ""]
        else:
            continue
        found += [n for n in names if n.split(".")[0] == "eigtrain" and not n.startswith("eigtrain.schema")]
    return found


def test_the_schema_imports_nothing_of_eigtrains():
    modules = sorted(SCHEMA.glob("*.py"))
    assert modules and {p.name for p in modules} >= {"__init__.py", "groups.py", "check.py", "objectives.py"}
    assert {p.name: eigtrain_imports(p) for p in modules if eigtrain_imports(p)} == {}


def test_the_import_check_sees_an_upward_import(tmp_path):
    (tmp_path / "m.py").write_text("from ..data import stream\nfrom . import groups\nimport eigtrain.models\n")
    assert eigtrain_imports(tmp_path / "m.py") == ["eigtrain.data", "eigtrain.models"]


def test_no_module_level_getattr_in_the_schema():
    for path in SCHEMA.glob("*.py"):
        tree = ast.parse(path.read_text())
        assert not [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "__getattr__"], path


def _registries():
    from eigtrain import engine
    from eigtrain.data import augment_recipes, decode, gpu_decode, stream
    from eigtrain.engine import base, deepspeed_zero, optim
    from eigtrain.models import BACKBONES
    from eigtrain.objectives import OBJECTIVES, lora, moments, nesting
    from eigtrain.train import metrics_log

    return [
        (groups.NestingMode, nesting.MODES),
        (groups.Backbone, BACKBONES),
        (groups.DataMode, stream.MODES),
        (groups.AugmentPreset, augment_recipes.PRESETS),
        (groups.ImageFit, decode.FITS),
        (groups.Decode, gpu_decode.DECODE_CHOICES),
        (groups.Engine, engine.ENGINES),
        (groups.Precision, base.PRECISIONS),
        (groups.CompileMode, engine.COMPILE_MODES),
        (groups.ZeroStage, deepspeed_zero.ZERO_STAGES),
        (groups.Schedule, optim.SCHEDULES),
        (groups.WandbMode, metrics_log.WANDB_MODES),
        (objectives.Objective, OBJECTIVES),
        (objectives.Reduction, moments.REDUCTIONS),
        (objectives.Normalize, lora.NORMALIZE),
        (objectives.ConstantMode, lora.CONSTANT_MODES),
    ]


@pytest.mark.parametrize("index", range(16))
def test_each_literal_lists_its_registrys_values(index):
    alias, registry = _registries()[index]
    assert set(get_args(alias)) == set(registry) and len(get_args(alias)) == len(registry)


def test_every_objective_has_its_dataclass_and_reads_its_defaults_from_it():
    from eigtrain.objectives import OBJECTIVES

    assert list(objectives.OBJECTIVE_SCHEMAS) == list(OBJECTIVES)
    for name, cls in OBJECTIVES.items():
        assert cls.defaults == objectives.coefficients_of(objectives.OBJECTIVE_SCHEMAS[name])
