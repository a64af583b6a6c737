"""No config is read with a default in code (issue 35): every default is the schema's (eigtrain/schema), written
once. An AST scan of the package for `<config>.get("key", default)` (and `<config>.get("key")`, whose default is
None), `getattr(<config>, "key", default)` and `OmegaConf.select(..., default=...)`, where <config> is an expression that names a config (cfg, config, data,
run.cfg, model_cfg, ...)."""

import ast
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PACKAGE = (REPO / "eigtrain", REPO / "launch")  # launch/ ships as eigtrain.launch
# A name that holds a config: cfg, config, conf, data, or one with cfg/config as a word of it (model_cfg, cfg_data).
CONFIG_NAME = re.compile(r"^(cfg|config|conf|data)$|(^|_)(cfg|config)(_|$)")


def _names(node: ast.AST) -> list[str]:
    """The identifiers along an expression such as `run.cfg.data` or `self.cfg` (calls and subscripts included)."""
    names = []
    while True:
        if isinstance(node, ast.Attribute):
            names.append(node.attr)
            node = node.value
        elif isinstance(node, (ast.Call, ast.Subscript)):
            node = node.func if isinstance(node, ast.Call) else node.value
        elif isinstance(node, ast.Name):
            return [*names, node.id]
        else:
            return names


def _is_config(node: ast.AST) -> bool:
    return any(CONFIG_NAME.search(name) for name in _names(node))


def _is_key(node: ast.AST) -> bool:
    return isinstance(node, ast.Constant) and isinstance(node.value, str)


def config_defaults(source: str) -> list[int]:
    """Line numbers of `source` where a config is read with a default."""
    lines = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Call):
            continue
        func, args = node.func, node.args
        get = isinstance(func, ast.Attribute) and func.attr == "get" and len(args) in (1, 2) and _is_key(args[0])
        getattr_ = isinstance(func, ast.Name) and func.id == "getattr" and len(args) == 3 and _is_key(args[1])
        select = isinstance(func, ast.Attribute) and func.attr == "select" and _names(func.value) == ["OmegaConf"]
        if (
            (get and _is_config(func.value))  # type: ignore[union-attr]
            or (getattr_ and _is_config(args[0]))
            or (select and any(k.arg == "default" for k in node.keywords))
        ):
            lines.append(node.lineno)
    return lines


def test_no_config_is_read_with_a_default_in_the_package():
    hits = [
        f"{path.relative_to(REPO)}:{line}"
        for root in PACKAGE
        for path in sorted(root.rglob("*.py"))
        for line in config_defaults(path.read_text())
    ]
    assert not hits, f"a config read with a default in code (the schema holds every default): {hits}"


def test_the_scan_finds_each_kind_of_read_with_a_default():
    planted = """
steps = run.cfg.get("steps", 100)
width = getattr(model_cfg, "width", 8)
lr = OmegaConf.select(cfg, "optim.lr", default=0.1)
workers = cfg.data.get("num_workers", 0)
size = self.config.get("image_size", None)
total = run.cfg.get("steps")
"""
    assert config_defaults(planted) == [2, 3, 4, 5, 6, 7]
    allowed = """
steps = run.cfg.steps
name = cfg.objective.name
classifier = getattr(backbone, "pretrained_cfg", {})
value = os.environ.get("EIGTRAIN_X", "")
"""
    assert config_defaults(allowed) == []
