"""Adaptive-dimension evaluation: probes, parallel random-subset probes, the report files."""

import torch
from PIL import Image

from eigtrain.evaluate import adaptive_dimension_table, dims_for, knn_accuracy, probe_accuracy, write_report


def _blobs(n=600, d=16, informative=4, seed=0):
    gen = torch.Generator().manual_seed(seed)
    y = torch.randint(0, 4, (n,), generator=gen)
    x = torch.randn(n, d, generator=gen)
    x[:, :informative] += 3.0 * torch.nn.functional.one_hot(y, 4).float()  # only the first coordinates carry the class
    return x, y


def test_dims_for():
    assert dims_for(64) == [4, 8, 16, 32, 64] and dims_for(10) == [4, 8, 10]


def test_probes_learn_and_parallel_probes_match_single_ones():
    x, y = _blobs()
    for probe in ("sgd", "closed_form"):
        assert probe_accuracy(x[:400], y[:400], x[400:], y[400:], probe=probe).item() > 0.9
        assert probe_accuracy(x[:400, 8:], y[:400], x[400:, 8:], y[400:], probe=probe).item() < 0.45  # noise only
    stacked = torch.stack([x[:, :4], x[:, 8:12]])
    together = probe_accuracy(stacked[:, :400], y[:400], stacked[:, 400:], y[400:])
    alone = [probe_accuracy(s[:400], y[:400], s[400:], y[400:]).item() for s in stacked]
    torch.testing.assert_close(together, torch.tensor(alone), atol=1e-6, rtol=0)
    assert knn_accuracy(x[:400], y[:400], x[400:], y[400:]) > 0.7


def test_table_orders_methods_and_writes_readable_report(tmp_path):
    x, y = _blobs()
    ordered = x  # informative coordinates first, like Rayleigh-Ritz features
    shuffled = x[:, torch.randperm(16, generator=torch.Generator().manual_seed(1))]
    report = adaptive_dimension_table(
        {"rr": ordered[:400], "raw": shuffled[:400]}, {"rr": ordered[400:], "raw": shuffled[400:]},
        y[:400], y[400:], dims=[4, 8, 16], random_draws=10, probe="closed_form",
    )
    acc = report["accuracy"]
    assert acc["RR"][4] > acc["RS"][4] + 0.2
    assert report["ordering"][4]["top"] > report["ordering"][4]["bottom"] + 0.4
    paths = write_report(report, tmp_path, title="blobs")
    assert "| RR |" in paths["markdown"].read_text() and "closed-form" in paths["markdown"].read_text()
    assert paths["csv"].read_text().splitlines()[0] == "method,4,8,16"
    image = Image.open(paths["plot"])
    assert image.size[0] > 300 and len(image.convert("L").getcolors(maxcolors=256 * 256)) > 10  # a real plot, not blank
