"""Issue 55: eigtrain-eval on unlabelled data (the usual self-supervised case) was sklearn's "Class values must be
non-negative", later a refusal: it now says in one line that it is label-free and reports what needs no labels
(neighbour recall@10 of each cut against exact search at full size, storage, search time, the spectrum). A mixture
of labelled and unlabelled samples stays refused in one line."""

from __future__ import annotations

import io
import json

import numpy as np
import pytest
import torch

from eigtrain.evaluate.command import main as eval_main
from eigtrain.evaluate.label_free import neighbour_recall
from tests.safety.test_bad_input import World, _redirect_stderr, local, rr, train_small
from tests.support.foreign_shards import good_samples

pytestmark = [
    pytest.mark.timeout(300),
    pytest.mark.filterwarnings("ignore:The image decoding and encoding capabilities:DeprecationWarning"),
]


def unlabelled(prefix: str, n: int, seed: int) -> list[dict]:
    """JPEG samples with no label member at all."""
    samples = good_samples(prefix, n, np.random.default_rng(seed))
    return [{k: v for k, v in s.items() if k != "cls"} for s in samples]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A 2-step run trained on shards without labels (data.label_key unset), its Rayleigh-Ritz export in rr/, and
    unlabelled validation shards."""
    tmp = tmp_path_factory.mktemp("unlabelled")
    (tmp / "shards").mkdir()
    world = World(tmp, tmp / "shards", server=None)  # type: ignore[arg-type]  (no HTTP here)
    for i in range(2):
        world.shard(f"u-{i}.tar", unlabelled(f"u{i}", 6, seed=i))
    world.shard("val.tar", unlabelled("v", 12, seed=5))
    outcome = train_small(world, tmp / "run", local(world, "u-{0..1}.tar"), "dim=4", "data.label_key=null")
    assert outcome.code == 0, outcome
    assert rr(world, f"run_dir={tmp / 'run'}", f"out={tmp / 'run' / 'rr'}").code == 0
    return world, tmp / "run"


def evaluate(*args: str) -> tuple[int, list[str]]:
    stderr = io.StringIO()
    with _redirect_stderr(stderr):
        code = eval_main(["probe=closed_form", "random_draws=2", "retrieval_draws=2", *args])
    return code, stderr.getvalue().strip().splitlines()


def test_a_run_on_unlabelled_shards_is_evaluated_label_free(run, capsys):
    world, run_dir = run
    out = world.tmp / "ev"
    code, err = evaluate(f"run_dir={run_dir}", f"out={out}", f"data.val_shards={world.shards / 'val.tar'}",
                         "dims=[2,4]", "retrieval_funnels=true")  # fmt: skip
    assert code == 0, err
    assert err[0].startswith("eigtrain-eval: label-free evaluation: no sample of the train split"), err
    assert "no probes and no class-based retrieval" in err[0] and "val.tar" in err[0]
    report = json.loads((out / "report.json").read_text())
    assert "accuracy" not in report and "retrieval" not in report and report["label_free"] in err[0]
    recall = report["neighbour_recall"]
    assert set(recall) == {"RR", "RR (paper)", "PCA", "RS"} and recall["RR"]["4"] == recall["PCA"]["4"] == 1.0
    assert all(0 <= v <= 1 for row in recall.values() for v in row.values())
    assert len(report["eigenvalues"]) == 4 and report["storage"]["4"]["fp32"] == 16
    assert report["neighbour_recall_setup"]["queries"] == 12 and report["neighbour_recall_setup"]["database"] == 12
    table = (out / "table.md").read_text()
    assert "| RR recall@10 |" in table and "Rayleigh–Ritz eigenvalues" in table and "| bound early stop |" in table
    assert "hit@" not in table and "Probe:" not in table
    assert "RR recall@10," in (out / "table.csv").read_text()
    assert {p.name for p in out.iterdir()} == {
        "report.json", "table.md", "table.csv", "retrieval_vs_dim.png", "retrieval_funnels.png"
    }  # fmt: skip
    assert "| RR recall@10 |" in capsys.readouterr().out  # the table is printed


def test_stored_features_without_labels_or_with_every_label_minus_one(tmp_path):
    rng = np.random.default_rng(0)
    z = rng.standard_normal((90, 6)) * np.linspace(3, 0.5, 6)
    np.savez(tmp_path / "none.npz", train_z=z[:60], test_z=z[60:])
    np.savez(tmp_path / "minus.npz", train_z=z[:60], test_z=z[60:], train_y=np.full(60, -1), test_y=np.full(30, -1))
    reports = []
    for name in ("none", "minus"):
        code, err = evaluate(f"features={tmp_path / name}.npz", f"out={tmp_path / name}", "dims=[2,6]")
        assert code == 0 and err[0].startswith("eigtrain-eval: label-free evaluation"), err
        reports.append(json.loads((tmp_path / name / "report.json").read_text()))
    assert reports[0]["neighbour_recall"] == reports[1]["neighbour_recall"]
    assert reports[0]["neighbour_recall"]["PCA"]["6"] == 1.0 and reports[0]["neighbour_recall"]["PCA"]["2"] < 1.0


@pytest.mark.parametrize("train_y, test_y", [(np.full(60, -1), np.zeros(30)), (np.r_[np.zeros(59), -1], np.zeros(30))])
def test_labelled_and_unlabelled_samples_mixed_are_refused_in_one_line(tmp_path, train_y, test_y):
    z = np.random.default_rng(0).standard_normal((90, 6))
    np.savez(tmp_path / "f.npz", train_z=z[:60], test_z=z[60:], train_y=train_y.astype(int), test_y=test_y.astype(int))
    code, err = evaluate(f"features={tmp_path / 'f.npz'}", f"out={tmp_path / 'ev'}")
    assert code == 2 and len(err) == 1 and "labels are mixed" in err[0] and "f.npz: train_z" in err[0], err
    assert not (tmp_path / "ev").exists()


def test_neighbour_recall_is_the_share_of_the_full_size_top_ten_found():
    """Against a brute-force count: cosine top-10 on the first k coordinates vs on all of them."""
    gen = torch.Generator().manual_seed(0)
    db, q = torch.randn(200, 8, generator=gen), torch.randn(30, 8, generator=gen)
    unit = lambda x: x / x.norm(dim=1, keepdim=True)  # noqa: E731
    top = lambda k: (unit(q[:, :k]) @ unit(db[:, :k]).T).topk(10).indices  # noqa: E731
    want = {
        k: np.mean([len(set(top(k)[i].tolist()) & set(top(8)[i].tolist())) / 10 for i in range(30)]) for k in (2, 5)
    }
    got = neighbour_recall(db, q, [2, 5, 8], "torch")
    assert got[2] == pytest.approx(want[2]) and got[5] == pytest.approx(want[5]) and got[8] == 1.0
    assert got[2] < got[5] < 1.0
