"""eigtrain-eval features=: what it cannot use is refused in one line naming the file and the array, before any
work (issue 52: an .npy, 1-D features, rows that do not match the labels, negative labels, complex or text arrays
and dims larger than d were tracebacks or silent; a label of 10**12 tried to allocate 11.5 PB)."""

from __future__ import annotations

import io
import json

import numpy as np
import pytest

from eigtrain.evaluate.command import main as eval_main
from tests.safety import test_bad_input as bad_input
from tests.safety.test_bad_input import _last_line, _redirect_stderr
from tests.safety.test_run_dir_safety import template  # noqa: F401  (a fixture)

world = bad_input.world


def arrays(n: int = 60, d: int = 6, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 3, 2 * n)
    z = rng.standard_normal((2 * n, d)) + np.eye(d)[y] * 3
    return {"train_z": z[:n], "train_y": y[:n], "test_z": z[n:], "test_y": y[n:]}


def run(tmp_path, *extra, **replace) -> tuple[int, str]:
    data = {**arrays(), **replace}
    np.savez(tmp_path / "f.npz", **data)
    stderr = io.StringIO()
    with _redirect_stderr(stderr):
        code = eval_main(
            [
                f"features={tmp_path / 'f.npz'}",
                f"out={tmp_path / 'ev'}",
                "probe=closed_form",
                "random_draws=2",
                "retrieval=none",
                *extra,
            ]
        )
    return code, _last_line(stderr.getvalue())


@pytest.mark.parametrize(
    "replace, says",
    [
        ({"train_z": np.zeros(60)}, "train_z must be a 2-D array"),
        ({"test_z": np.zeros((60, 6), dtype=complex)}, "test_z must be a 2-D array of real numbers"),
        ({"train_y": np.zeros(59, dtype=int)}, "train_y must hold one label per row"),
        ({"test_y": np.full(60, -3)}, "test_y must hold class indices"),
        ({"train_y": np.array(["a"] * 60)}, "train_y must hold class indices"),
        ({"test_z": np.zeros((60, 5))}, "different widths"),
        ({"train_z": np.full((60, 6), np.nan)}, "NaN"),
    ],
)
def test_unusable_feature_arrays_are_refused_in_one_line(tmp_path, replace, says):
    code, line = run(tmp_path, **replace)
    assert code != 0 and "f.npz" in line and says in line, line
    assert not (tmp_path / "ev").exists()


def test_an_npy_and_sizes_beyond_d_are_refused(tmp_path):
    np.save(tmp_path / "one.npy", np.zeros((4, 4)))
    stderr = io.StringIO()
    with _redirect_stderr(stderr):
        code = eval_main([f"features={tmp_path / 'one.npy'}", f"out={tmp_path / 'ev'}"])
    assert code != 0 and "not an .npz archive" in _last_line(stderr.getvalue())
    code, line = run(tmp_path, "dims=[4,1000]")
    assert code != 0 and "1000 is not a size of these 6-dimensional features" in line, line


def test_labels_are_class_ids_whatever_their_values(tmp_path):
    """10**12 and 7 are two classes, as 0 and 1 are: the same accuracy, no allocation of 10**12 rows."""
    base = arrays()
    (tmp_path / "a").mkdir(), (tmp_path / "b").mkdir()
    assert run(tmp_path / "a", "dims=[6]")[0] == 0
    big = {k: np.where(base[k] == 2, 10**12, base[k]) for k in ("train_y", "test_y")}
    assert run(tmp_path / "b", "dims=[6]", **big)[0] == 0
    accuracy = [json.loads((tmp_path / x / "ev" / "report.json").read_text())["accuracy"] for x in "ab"]
    assert accuracy[0] == accuracy[1]


def test_a_run_whose_shards_hold_negative_or_huge_labels(world, template):  # noqa: F811
    """The run_dir= path: labels come with the images. Some samples unlabelled (-1) beside labelled ones is one line
    naming each split's data (one_hot's traceback before; all unlabelled: tests/evaluate/test_label_free.py); labels
    of 10**12 are one class like the features= path's."""
    from tests.safety.test_run_dir_safety import eval_, trained
    from tests.support.foreign_shards import good_samples

    run = trained(world, template)
    samples = good_samples("v0", 6)
    for sample in samples[:2]:
        sample["cls"] = -1
    code, message = eval_(
        world, f"run_dir={run}", f"out={world.tmp / 'ev'}", f"data.val_shards={world.shard('neg.tar', samples)}"
    )
    assert code == 2 and "labels are mixed" in message and "2 of 6 in the test split" in message, message
    for sample in samples:
        sample["cls"] = 10**12 + sample["cls"] % 3
    code, message = eval_(
        world, f"run_dir={run}", f"out={world.tmp / 'ev'}", f"data.val_shards={world.shard('big.tar', samples)}"
    )
    assert code == 0, message
