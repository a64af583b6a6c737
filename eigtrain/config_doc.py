"""`python -m eigtrain.config_doc [OUT]`: docs/configuration.md from the typed schema, key | type | default | doc."""

import ast
import dataclasses
import inspect
import io
import json
import sys
import textwrap
import tokenize
import typing
from importlib import resources
from pathlib import Path

import yaml
from omegaconf import MISSING

from eigtrain import engine, safe_files, schema
from eigtrain.data import augment, gpu_decode, stream, write
from eigtrain.engine import base, optim
from eigtrain.evaluate import command as evaluate
from eigtrain.export import command as rr_job
from eigtrain.export import corpus as embed_corpus
from eigtrain.export import index_config, rayleigh_ritz
from eigtrain.models import backbones
from eigtrain.objectives import OBJECTIVES, moments, nesting
from eigtrain.synthetic import config, grid, kernels, table

COMMAND = "python -m eigtrain.config_doc"
INTRO = """# Configuration reference

Generated from the typed schema by `{command}` (do not edit; a test fails when it is stale). Every key is set
as `key=value` (nested: `data.num_workers=4`). A `group` row picks a file of `configs/` (`model=resnet18`:
`configs/model/resnet18.yaml`), whose values replace the defaults below. Presets: `experiment=` {presets}.
"""

# Each command and its config dataclass: the one list to edit when a class moves.
COMMANDS = [
    ("eigtrain-train", schema.TrainConfig),
    ("eigtrain-rr", rr_job.RRJobConfig),
    ("eigtrain-eval", evaluate.EvalConfig),
    ("eigtrain-embed", embed_corpus.EmbedConfig),
    ("eigtrain-index", index_config.IndexConfig),
    ("eigtrain-shards", write.WriteArgs),
    ("eigtrain-shards index", write.IndexArgs),
    ("eigtrain-synthetic", config.SyntheticConfig),
    ("eigtrain-synthetic grid", grid.GridConfig),
    ("eigtrain-synthetic table", table.TableConfig),
]
# eigtrain-train's groups whose keys depend on the option chosen: {option: its dataclass}.
GROUP_OPTIONS = {
    "objective": {name: schema.objective_schema(name) for name in OBJECTIVES},
    "optim": schema.OPTIM_SCHEMAS,
    "launcher": schema.LAUNCHER_SCHEMAS,
}
# A key's allowed values, from the registry that checks them (a field typed Literal[...] lists its own); keys of
# eigtrain-train, -rr, -shards and -synthetic (no key names two things across commands).
ALLOWED = (
    {"nesting.mode": nesting.MODES, "data.mode": stream.MODES, "data.augment": augment.PRESETS}
    | {"data.decode": gpu_decode.DECODE_CHOICES, "engine.name": engine.ENGINES, "engine.precision": base.PRECISIONS}
    | {"model.backbone": backbones.BACKBONES, "optim.schedule": optim.SCHEDULES}
    | {"objective.reduction": moments.REDUCTIONS, "mode": rayleigh_ritz.MODES, "trivial": rayleigh_ritz.TRIVIAL}
    | {"source": write.SOURCES, "recipe": config.PRESETS, "preset": config.PRESETS, "objective": OBJECTIVES}
    | {"kernel": kernels.KERNELS, "extraction": config.EXTRACTIONS, "rr_mode": config.RR_MODES}
    | {"jn_readoff": config.JN_READOFFS, "extraction_pairs": config.EXTRACTION_PAIRS, "schedule": config.SCHEDULES}
    | {"constant_mode": config.CONSTANT_MODES, "fourier_features": config.FOURIER_FEATURES}
    | {"dtype": tuple(embed_corpus.DTYPES)}
)


def config_groups() -> dict[str, tuple[list[str], str]]:
    """Each config group: (its option files in configs/, the option configs/train.yaml picks by default)."""
    root = resources.files("eigtrain.configs")  # the repository's configs/, shipped inside the package
    defaults = yaml.safe_load((root / "train.yaml").read_text())["defaults"]
    chosen = {g: o for entry in defaults if isinstance(entry, dict) for g, o in entry.items() if (root / g).is_dir()}
    names = {g: [f.name for f in (root / g).iterdir()] for g in chosen}
    return {g: (sorted(n[:-5] for n in names[g] if n.endswith(".yaml")), o) for g, o in chosen.items()}


def field_docs(cls: type) -> dict[str, str]:
    """Field name -> the trailing `# comment` of its line; a subclass's own comment wins over its base's."""
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__[:-1]):
        try:
            source = textwrap.dedent(inspect.getsource(klass))
        except (OSError, TypeError):  # a class made in code: no source lines, no docs
            continue
        tokens = tokenize.generate_tokens(io.StringIO(source).readline)
        comments = {t.start[0]: t.string[1:].strip() for t in tokens if t.type == tokenize.COMMENT}
        class_def = ast.parse(source).body[0]
        assert isinstance(class_def, ast.ClassDef)  # the source of a class
        for node in class_def.body:
            if not (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)):
                continue
            # the trailing comment of the field's line(s): a long default wraps it onto a line of its own
            lines = range(node.end_lineno or node.lineno, node.lineno - 1, -1)
            doc = next((comments[n] for n in lines if n in comments), "")
            if doc or node.target.id not in docs:
                docs[node.target.id] = doc
    return docs


def kind(tp, choices) -> str:
    """The type column: the annotation, then the allowed values (a Literal's, else the registry's)."""
    if typing.get_origin(tp) is typing.Literal:
        tp, choices = type(typing.get_args(tp)[0]), typing.get_args(tp)
    name = str(tp).replace("typing.", "") if isinstance(tp, str) or typing.get_args(tp) else tp.__name__
    return _text(name) + (": " + " \\| ".join(f"`{v}`" for v in choices) if choices else "")


def default_of(f: dataclasses.Field) -> str:
    value = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
    if value is dataclasses.MISSING or value is MISSING:
        return "(required)"
    return f"`{_text(value if isinstance(value, str) and value else json.dumps(value))}`"


def _text(text) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def tables(title: str, cls: type, prefix: str = "", groups: dict | None = None) -> list[str]:
    """Markdown: the table of `cls`, then one per nested dataclass field (a config group of `groups` is a row)."""
    hints, docs, rows, nested, groups = typing.get_type_hints(cls), field_docs(cls), [], [], groups or {}
    for f in dataclasses.fields(cls):
        key, child = f"{prefix}{f.name}", f.default_factory() if f.default_factory is not dataclasses.MISSING else None
        nested += [(key, type(child))] if dataclasses.is_dataclass(child) else []
        if key in groups:  # a config group: its option files, the one train.yaml picks
            row = [kind("group", groups[key][0]), f"`{groups[key][1]}`"]
        elif dataclasses.is_dataclass(child):
            row = ["see below", ""]
        else:
            row = [kind(hints.get(f.name, f.type), ALLOWED.get(key)), default_of(f)]
        rows.append(f"| `{key}` | {row[0]} | {row[1]} | {_text(docs.get(f.name, ''))} |")
    doc = cls.__dict__.get("__doc__") or ""  # the class's own docstring (a dataclass without one gets a signature)
    intro = [" ".join(doc.split()), ""] if doc and not doc.startswith(cls.__name__ + "(") else []
    lines = [f"## {title}", "", *intro, "| key | type | default | doc |", "|---|---|---|---|", *rows, ""]
    for key, child in nested:
        lines += tables(f"{title.split(':')[0]}: `{key}`", child, prefix=f"{key}.")
    return lines


def render() -> str:
    groups = config_groups()
    presets = ", ".join(f"`{e}`" for e in groups["experiment"][0])
    lines = [INTRO.format(command=COMMAND, presets=presets)]
    for command, cls in COMMANDS:
        train = command == "eigtrain-train"
        lines += tables(command, cls, groups=groups if train else None)
        for group, by_name in (GROUP_OPTIONS if train else {}).items():
            for name, option in by_name.items():
                lines += tables(f"{command}: `{group}={name}`", option, prefix=f"{group}.")
    return "\n".join(lines).rstrip() + "\n"


def main() -> None:
    args = sys.argv[1:]
    if len(args) > 1 or (args and args[0].startswith("-")):  # --help must not become a file named --help
        raise SystemExit("usage: python -m eigtrain.config_doc [OUT]   (default: docs/configuration.md)")
    out = Path(args[0] if args else "docs/configuration.md")
    safe_files.write_text(out, render())
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
