"""Package list for setuptools (everything else is in pyproject.toml): eigtrain's own packages, plus the
top-level configs/ (with one package per config group, for its yaml files) and launch/ mapped into it."""

from pathlib import Path

from setuptools import find_packages, setup

config_groups = [
    f"eigtrain.configs.{d.name}" for d in sorted(Path("configs").iterdir()) if d.is_dir() and d.name != "__pycache__"
]
setup(
    packages=[*find_packages(include=["eigtrain", "eigtrain.*"]), "eigtrain.configs", *config_groups, "eigtrain.launch"]
)
