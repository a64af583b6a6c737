"""Adaptive-dimension evaluation: probes, parallel random-subset probes, the report files."""

import torch
from PIL import Image

from eigtrain.evaluate.command import adaptive_dimension_table
from eigtrain.evaluate.probes import paired_difference, probe_accuracy, probe_correct
from eigtrain.evaluate.report import write_report
from eigtrain.train.knn import dims_for, knn_accuracy
from tests.support.finite_kernels import blobs


def test_dims_for():
    assert dims_for(64) == [4, 8, 16, 32, 64] and dims_for(10) == [4, 8, 10]


def test_probes_learn_and_parallel_probes_match_single_ones():
    x, y = blobs()
    for probe in ("sgd", "closed_form"):
        assert probe_accuracy(x[:400], y[:400], x[400:], y[400:], probe=probe).item() > 0.9
        assert probe_accuracy(x[:400, 8:], y[:400], x[400:, 8:], y[400:], probe=probe).item() < 0.45  # noise only
    stacked = torch.stack([x[:, :4], x[:, 8:12]])
    together = probe_accuracy(stacked[:, :400], y[:400], stacked[:, 400:], y[400:])
    alone = [probe_accuracy(s[:400], y[:400], s[400:], y[400:]).item() for s in stacked]
    torch.testing.assert_close(together, torch.tensor(alone), atol=1e-6, rtol=0)
    assert knn_accuracy(x[:400], y[:400], x[400:], y[400:]) > 0.7


def test_paired_difference_is_the_bootstrap_over_test_samples():
    """The multinomial shortcut gives the interval a bootstrap over the test samples gives; equal rows give 0."""
    x, y = blobs()
    first, second = (probe_correct(x[:400, cols], y[:400], x[400:, cols], y[400:])[0] for cols in ([0, 1], [0, 8]))
    cell = paired_difference(first, second)
    n = len(first)
    assert cell["difference"] == (cell["first_only"] - cell["second_only"]) / n and cell["n"] == n == 200
    assert abs(cell["difference"] - (first.mean() - second.mean()).item()) < 1e-6 and cell["first_only"] > 0
    gen = torch.Generator().manual_seed(0)
    rows = torch.randint(0, n, (10000, n), generator=gen)
    brute = torch.quantile((first - second)[rows].mean(1).double(), torch.tensor([0.025, 0.975], dtype=torch.float64))
    assert abs(cell["low"] - brute[0].item()) <= 0.011 and abs(cell["high"] - brute[1].item()) <= 0.011
    assert cell["high"] - cell["low"] > 0.05  # a real interval, not a point
    same = paired_difference(first, first.clone())
    assert (same["difference"], same["low"], same["high"]) == (0.0, 0.0, 0.0)
    assert paired_difference(first, second) == cell  # seeded: the report is reproducible


def test_table_orders_methods_and_writes_readable_report(tmp_path):
    x, y = blobs()
    ordered = x  # informative coordinates first, like Rayleigh-Ritz features
    shuffled = x[:, torch.randperm(16, generator=torch.Generator().manual_seed(1))]
    report = adaptive_dimension_table(
        {"rr": ordered[:400], "raw": shuffled[:400]},
        {"rr": ordered[400:], "raw": shuffled[400:]},
        y[:400],
        y[400:],
        dims=[4, 8, 16],
        random_draws=10,
        probe="closed_form",
    )
    acc = report["accuracy"]
    assert acc["RR"][4] > acc["RS"][4] + 0.2
    used = report["random_subsets"]  # RS says what it averaged: k = d is one subset (all coordinates)
    assert 5 <= used[4]["draws"] <= 10 and used[16] == {"draws": 1, "stderr": 0.0}
    assert report["ordering"][4]["top"] > report["ordering"][4]["bottom"] + 0.4
    # PCA of the same (shuffled) embedding finds the informative directions; retrieval follows the ordering
    assert acc["PCA"][4] > acc["RS"][4] + 0.2
    ret = report["retrieval"]
    assert set(ret) == {"RR", "PCA", "RS"} and set(ret["RR"][4]) == {"1nn", "hit@1", "hit@10"}
    assert ret["RR"][4]["1nn"] > ret["RS"][4]["1nn"] + 0.2
    assert report["storage"][8]["fp16"] == 16 and report["storage"][8]["search_us_per_query"] > 0
    assert (
        report["smallest_k"]["RR"]["accuracy_within_5pt"] == 4
        and report["smallest_k"]["RS"]["accuracy_within_1pt"] == 16
    )
    # the differences are paired: on the same test samples, so they equal the accuracies' differences
    paired = report["paired"]
    assert set(paired) == {"RR vs PCA"}
    for k in (4, 8, 16):
        cell = paired["RR vs PCA"][k]
        assert abs(cell["difference"] - (acc["RR"][k] - acc["PCA"][k])) < 1e-6
        assert cell["low"] <= cell["difference"] <= cell["high"] and cell["n"] == 200
    paths = write_report(report, tmp_path, name="blobs")
    md = paths["markdown"].read_text()
    assert "Differences (points) on the same 200 test samples" in md and "| RR vs PCA | " in md
    assert "| RR |" in md and "closed-form" in md and "| PCA |" in md and "| RR 1-NN |" in md and "| PCA hit@10 |" in md
    assert "| bytes/vector int8 | 4 | 8 | 16 |" in md and "Smallest k within X points" in md
    csv_rows = paths["csv"].read_text().splitlines()
    assert csv_rows[0] == "method,4,8,16" and "bytes/vector fp32,16,32,64" in csv_rows
    assert any(r.startswith("RS hit@1,") for r in csv_rows) and any(r.startswith("search µs/query,") for r in csv_rows)
    # one name per measure (issue 55): hit@k is a same-class item among the k nearest; recall@10 is the funnels'
    assert "R@" not in md and "recall" not in "".join(csv_rows) and "hit@k: among its k nearest" in md
    for plot in ("plot", "retrieval_plot"):
        image = Image.open(paths[plot])
        assert (
            image.size[0] > 300 and len(image.convert("L").getcolors(maxcolors=256 * 256)) > 10
        )  # a real plot, not blank


def test_each_plot_is_titled_with_what_it_shows(tmp_path, monkeypatch):
    """Issue 55: retrieval_vs_dim.png was titled with accuracy and its axis said "accuracy / recall" for probe
    accuracy, 1-NN accuracy and hit@1; each plot's title and y axis now name its measures."""
    from matplotlib.axes import Axes

    x, y = blobs()
    train, test = {"rr": x[:400], "raw": x[:400]}, {"rr": x[400:], "raw": x[400:]}
    report = adaptive_dimension_table(train, test, y[:400], y[400:], dims=[4, 16], random_draws=2, probe="closed_form")
    seen: list[tuple[str, str]] = []
    monkeypatch.setattr(Axes, "set_title", lambda ax, text, **kw: seen.append(("title", text)))
    monkeypatch.setattr(Axes, "set_ylabel", lambda ax, text, **kw: seen.append(("y", text)))
    write_report(report, tmp_path, name="blobs")
    accuracy, retrieval = seen[: len(seen) // 2], seen[len(seen) // 2 :]
    assert dict(accuracy) == {"title": "Linear probe accuracy (%) by representation size — blobs",
                              "y": "linear probe accuracy (%)"}  # fmt: skip
    assert dict(retrieval)["title"].startswith("Probe accuracy, 1-NN accuracy and hit@1 (%)")
    assert dict(retrieval)["y"] == "probe accuracy, 1-NN accuracy, hit@1 (%)"


def test_eval_command_on_stored_features_with_retrieval_options(tmp_path, capsys):
    import json

    import numpy as np

    from eigtrain.evaluate.command import main as eval_main
    from eigtrain.export.files import save_export
    from eigtrain.export.moments import RRAccumulator
    from eigtrain.export.rayleigh_ritz import solve

    x, y = blobs(d=8)
    acc = RRAccumulator(8)
    acc.update(x[:400], x[:400] + 0.3 * torch.randn(400, 8, generator=torch.Generator().manual_seed(2)))
    save_export(solve(acc), tmp_path / "rr", {"kind": "test"}, plot=False)
    np.savez(
        tmp_path / "f.npz",
        train_z=x[:400].numpy(),
        train_y=y[:400].numpy(),
        test_z=x[400:].numpy(),
        test_y=y[400:].numpy(),
    )
    args = [
        f"features={tmp_path / 'f.npz'}",
        f"rr={tmp_path / 'rr'}",
        f"out={tmp_path / 'ev'}",
        "probe=closed_form",
        "random_draws=3",
        "dims=[4,8]",
    ]
    assert eval_main([*args, "retrieval=torch", "retrieval_draws=2"]) == 0
    report = json.loads((tmp_path / "ev" / "report.json").read_text())
    assert report["retrieval_setup"] == {"backend": "torch", "database": 400, "queries": 200, "rs_draws": 2}
    assert set(report["accuracy"]) == {"RR", "PCA", "RS"} and (tmp_path / "ev" / "retrieval_vs_dim.png").exists()
    assert eval_main([*args, f"out={tmp_path / 'ev2'}", "retrieval=none", "pca=false"]) == 0
    report = json.loads((tmp_path / "ev2" / "report.json").read_text())
    assert (
        "retrieval" not in report
        and "PCA" not in report["accuracy"]
        and not (tmp_path / "ev2" / "retrieval_vs_dim.png").exists()
    )
    capsys.readouterr()
    assert eval_main([*args, "retrieval=annoy"]) == 2
    assert "retrieval='annoy' is unknown" in capsys.readouterr().err


def test_eval_refuses_to_score_probes_on_the_split_they_are_fitted_on(tmp_path, capsys):
    """test_split=train with train_split=train would print training accuracy as if it were held out: one line, no
    work, nothing written."""
    from eigtrain.evaluate.command import main as eval_main

    out = tmp_path / "ev"
    assert eval_main([f"run_dir={tmp_path / 'run'}", "test_split=train", f"out={out}"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "train_split and test_split are both 'train'" in err
    assert not out.exists()
