"""Install eigtrain on a machine without network: wheels from .whl/ (tools/device_wheels.sh) on top of the image.

    python tools/offline_install.py --wheels .whl --target DIR [--tree REPO] [--json FILE]

For every wheel in --wheels: when this Python (the image) already holds that distribution at a version every wheel
here accepts, the image's is used; otherwise the wheel is installed with
`pip install --no-index --no-deps --target DIR` (DIR then goes first on PYTHONPATH). torch, torchvision, numpy and
the other packages the image owns are never installed from here (a wheel for one of them is an error). eigtrain
itself is built from --tree (the sources that travelled) when it can be, else taken from its wheel in --wheels.
Prints one line per package with where it came from, the requirements nothing satisfies (wandb is optional), and
checks that every eigtrain module imports with torch still the image's. Standard library only (it runs before
anything is installed); without pip the wheels are unpacked directly. Exit 1 when eigtrain does not import.
"""

from __future__ import annotations

import argparse
import email.parser
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from importlib import metadata
from pathlib import Path

IMAGE_OWNED = ("torch", "torchvision", "numpy", "triton", "pillow", "scipy")  # never shadowed from .whl
OPTIONAL = {"wandb": "eigtrain logs to metrics.jsonl without it"}
MODULES = (
    "eigtrain.train.command",
    "eigtrain.export.command",
    "eigtrain.evaluate.command",
    "eigtrain.engine.deepspeed_zero",
    "hydra",
    "omegaconf",
    "webdataset",
    "kornia",
    "deepspeed",
    "submitit",
)
MARKER = ".eigtrain-offline-target"  # a target directory we made (and so may empty)
TREE_FILES = ("pyproject.toml", "setup.py", "README.md", "eigtrain", "configs", "launch")


def normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _packaging():
    try:
        from packaging.requirements import Requirement
        from packaging.version import Version
    except ImportError:  # the image may lack it; pip vendors it
        from pip._vendor.packaging.requirements import Requirement
        from pip._vendor.packaging.version import Version
    return Requirement, Version


def wheel_metadata(path: Path) -> tuple[str, str, list[str]]:
    """(name, version, Requires-Dist) read from the wheel's METADATA."""
    with zipfile.ZipFile(path) as zf:
        name = next(n for n in zf.namelist() if re.fullmatch(r"[^/]+\.dist-info/METADATA", n))
        meta = email.parser.Parser().parsestr(zf.read(name).decode())
    return meta["Name"], meta["Version"], meta.get_all("Requires-Dist") or []


def image_version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def plan(wheels: dict[str, tuple[str, str, list[str]]], extra_requires: list[str]) -> tuple[dict, list[str]]:
    """{name: (source, version)} with source 'image' or '.whl', and the lines of requirements left unmet."""
    Requirement, Version = _packaging()
    requires: dict[str, list] = {}
    texts = sorted({text for _, _, reqs in wheels.values() for text in reqs} | set(extra_requires))
    for req in map(Requirement, texts):
        if req.marker is None or req.marker.evaluate({"extra": ""}):
            requires.setdefault(normalize(req.name), []).append(req)
    chosen, unmet = {}, []
    for name, (_, version, _) in sorted(wheels.items()):
        have = image_version(name)
        ok = have is not None and all(
            r.specifier.contains(Version(have), prereleases=True) for r in requires.get(name, [])
        )
        chosen[name] = ("image", have) if ok else (".whl", version)
    for name, reqs in sorted(requires.items()):
        version = chosen[name][1] if name in chosen else image_version(name)
        bad = [str(r) for r in reqs if version is None or not r.specifier.contains(Version(version), prereleases=True)]
        if bad:
            why = OPTIONAL.get(name, "required")
            unmet.append(
                f"{name}: {'absent' if version is None else version} does not satisfy {', '.join(bad)} ({why})"
            )
    return chosen, unmet


def prepare_target(target: Path) -> None:
    if target.exists() and any(target.iterdir()) and not (target / MARKER).exists():
        sys.exit(f"offline_install: {target} is not empty and was not made by this tool: choose another --target")
    shutil.rmtree(target, ignore_errors=True)
    target.mkdir(parents=True)
    (target / MARKER).write_text("packages installed by tools/offline_install.py\n")


def has_pip() -> bool:
    return subprocess.run([sys.executable, "-m", "pip", "--version"], capture_output=True).returncode == 0


def install(files: list[Path], target: Path) -> None:
    if not files:
        return
    if has_pip():
        cmd = [
            sys.executable,
            "-m",
            "pip",
            "install",
            "-q",
            "--disable-pip-version-check",
            "--no-index",
            "--no-deps",
            "--no-warn-script-location",
            "--target",
            str(target),
            *map(str, files),
        ]
        subprocess.run(cmd, check=True)
        return
    for path in files:  # no pip in the image: a wheel is a zip of its import tree (+ NAME.data/{purelib,platlib})
        with zipfile.ZipFile(path) as zf:
            zf.extractall(target)
        for data in target.glob("*.data"):
            for lib in ("purelib", "platlib"):
                if (data / lib).is_dir():
                    shutil.copytree(data / lib, target, dirs_exist_ok=True)
            shutil.rmtree(data)


def build_from_tree(tree: Path, out: Path, setuptools: Path | None) -> Path | None:
    """eigtrain's wheel built (offline) from a copy of the tree's sources, or None when that fails; with
    `setuptools` (a wheel) when the image's is missing or too old (unpacked: a pure-Python wheel imports as is)."""
    src = out / "src"
    src.mkdir()
    for name in TREE_FILES:
        if (tree / name).is_dir():
            shutil.copytree(tree / name, src / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(tree / name, src / name)
    env = dict(os.environ)
    if setuptools:
        with zipfile.ZipFile(setuptools) as zf:
            zf.extractall(out / "build-tools")
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(out / "build-tools"), os.environ.get("PYTHONPATH")]))
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "wheel",
        "-q",
        "--disable-pip-version-check",
        "--no-index",
        "--no-deps",
        "--no-build-isolation",
        "-w",
        str(out),
        str(src),
    ]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        print(f"offline_install: building eigtrain from {tree} failed ({done.stderr.strip().splitlines()[-1:]})")
        return None
    return next(out.glob("eigtrain-*.whl"), None)


def check_imports(target: Path) -> dict[str, str]:
    """{module: 'ok' | error line}, imported in a fresh interpreter with the target first on the path."""
    code = (
        "import importlib, json, sys\nres = {}\nfor m in sys.argv[2:]:\n    try:\n        importlib.import_module(m)"
        "\n        res[m] = 'ok'\n    except BaseException as e:\n        res[m] = f'{type(e).__name__}: {e}'"
        "\nimport torch\nres['torch from image'] = 'ok' if not torch.__file__.startswith(sys.argv[1]) else torch.__file__"
        "\nimport eigtrain, importlib.resources as r\nres['eigtrain with its configs'] = 'ok' if "
        "(r.files('eigtrain.configs') / 'train.yaml').is_file() else f'no configs in {eigtrain.__file__}'"
        "\nprint(json.dumps(res))"
    )
    env = {**os.environ, "PYTHONPATH": str(target)}
    done = subprocess.run(
        [sys.executable, "-c", code, str(target.resolve()), *MODULES],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        cwd=target,
    )  # not a source tree's cwd: it would shadow the install
    lines = done.stdout.strip().splitlines()
    return json.loads(lines[-1]) if done.returncode == 0 and lines else {"(import check)": done.stderr.strip()[-300:]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--wheels", type=Path, required=True)
    parser.add_argument("--target", type=Path, required=True)
    parser.add_argument("--tree", type=Path, default=None, help="build eigtrain from these sources (else its wheel)")
    parser.add_argument("--json", type=Path, default=None, help="write the plan and the import check here")
    args = parser.parse_args(argv)
    files = sorted(args.wheels.glob("*.whl"))
    if not files:
        print(f"offline_install: no wheels in {args.wheels}: run tools/device_wheels.sh where PyPI is reachable")
        return 1
    wheels = {normalize(n): (f, v, r) for f in files for n, v, r in [wheel_metadata(f)]}
    owned = [n for n in wheels if n in IMAGE_OWNED]
    if owned:
        print(f"offline_install: {args.wheels} holds {', '.join(owned)}, which the image owns: remove them")
        return 1
    eigtrain = wheels.pop("eigtrain", None)
    extra = list(eigtrain[2]) + ["setuptools>=68"] if eigtrain else ["setuptools>=68"]  # setuptools: eigtrain's build
    chosen, unmet = plan(wheels, extra)
    prepare_target(args.target)
    files = [wheels[n][0] for n, (src, _) in chosen.items() if src == ".whl"]
    with tempfile.TemporaryDirectory() as tmp:  # one pip call for all (a second one trips over the first's bin/)
        setuptools = wheels["setuptools"][0] if chosen.get("setuptools", ("image",))[0] == ".whl" else None
        built = build_from_tree(args.tree, Path(tmp), setuptools) if args.tree else None
        if built:
            chosen["eigtrain"] = (f"tree {args.tree}", wheel_metadata(built)[1])
        elif eigtrain:
            chosen["eigtrain"] = (".whl", eigtrain[1])
        install(files + [p for p in (built or (eigtrain and eigtrain[0]),) if p], args.target)
    for pkg in ("torch", "torchvision", "numpy", "timm", "safetensors", "scikit-learn", "pillow"):
        chosen.setdefault(pkg, ("image", image_version(pkg) or "absent"))
    width = max(map(len, chosen))
    for name, (src, version) in sorted(chosen.items(), key=lambda kv: (kv[1][0], kv[0])):
        print(f"  {name:<{width}}  {version:<14} from {src}")
    for line in unmet:
        print(f"  unmet: {line}")
    imports = check_imports(args.target)
    failed = {m: e for m, e in imports.items() if e != "ok"}
    for module, error in failed.items():
        print(f"  import {module}: {error}")
    print(
        f"offline_install: {sum(s == '.whl' for s, _ in chosen.values())} packages from {args.wheels}, "
        f"the rest from the image; target {args.target}; imports {'OK' if not failed else 'FAILED: ' + ', '.join(failed)}"
    )
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "packages": {n: {"from": s, "version": v} for n, (s, v) in chosen.items()},
                    "unmet": unmet,
                    "imports": imports,
                },
                indent=1,
            )
        )
    return 0 if imports.get("eigtrain.train.command") == "ok" else 1


if __name__ == "__main__":
    sys.exit(main())
