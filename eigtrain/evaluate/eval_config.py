"""eigtrain-eval's configuration and usage: read, and checked, before torch is imported (eigtrain.commands)."""

from __future__ import annotations

from dataclasses import dataclass, field

from eigtrain.export.run_data import RunDataConfig

USAGE = """eigtrain-eval: adaptive-dimension evaluation of a trained run or of stored features.

    eigtrain-eval run_dir=DIR [rr=DIR] [jn_run_dir=DIR] [ff_run_dirs=[DIR4,DIR8]] [probe=sgd|closed_form]
                  [random_draws=50] [random_se=0.1] [dims=[4,8,16]] [train_split=train] [test_split=val] [out=DIR]
                  [pca=true] [retrieval=auto|torch|faiss|none] [retrieval_draws=5]
                  [data.val_shards=PATTERN] [data.shards=PATTERN] [data.allow_pipe=true]
                  [retrieval_funnels=true]
    eigtrain-eval features=FILE.npz rr=DIR out=DIR     # arrays train_z, train_y, test_z, test_y (no _y: unlabelled)

RR uses the Rayleigh-Ritz export (default run_dir/rr, written by eigtrain-rr); JN is the run's own
coordinates when it was trained with joint nesting, or those of jn_run_dir; FF are runs trained at each
smaller dimension; RS are random subsets of the run's coordinates; PCA the principal components of the
same embedding. At every size: retrieval (1-NN; hit@1/10: a same-class item among the nearest), bytes per
vector, search time per query. Writes table.md, table.csv, report.json, accuracy_vs_dim.png and
retrieval_vs_dim.png (and retrieval_funnels.png with retrieval_funnels=true); they name the data each split
came from. Unlabelled data (every label -1: no data.label_key; or no train_y/test_y) are evaluated label-free:
recall@10 of each cut against exact search at full size, storage, search time and the spectrum, no probes.
A run trained on data.shards has a validation split only with data.val_shards (its config's, or given here);
the training shards are never scored as validation. data.shards / data.val_shards given here replace the
run's; a pipe: source in the run's saved config runs only with data.allow_pipe=true.
"""


@dataclass
class EvalConfig:
    run_dir: str | None = None  # the run evaluated (its newest verified weights, its data)
    features: str | None = None  # instead of a run: an .npz of train_z, train_y, test_z, test_y
    rr: str | None = None  # the Rayleigh-Ritz export (null: run_dir/rr, written by eigtrain-rr)
    jn_run_dir: str | None = None  # a joint-nesting run whose coordinates are JN (null: the run's own, if nested)
    ff_run_dirs: list[str] = field(default_factory=list)  # runs trained at each smaller dimension (FF)
    train_split: str = "train"  # the split the probes train on
    test_split: str = "val"  # the split scored
    probe: str = "sgd"  # sgd (the paper's protocol, on whitened features) | closed_form (ridge least squares)
    random_draws: int = 50  # at most this many random coordinate subsets averaged for RS at each dimension
    random_se: float = 0.1  # RS stops drawing once its mean's standard error is at most this (points; 0: every draw)
    dims: list[int] | None = None  # the dimensions scored (null: 4, 8, ..., d)
    out: str | None = None  # where the report goes (null: run_dir/eval, or the features file without .npz)
    device: str = "cpu"  # auto | cpu | cuda
    seed: int = 0  # the probes' and the random subsets' seed
    pca: bool = True  # score PCA of the same embedding (the unsupervised baseline)
    retrieval: str = "auto"  # auto (= torch: as fast or faster for exact search here) | torch | faiss | none
    retrieval_draws: int = 5  # random subsets averaged for RS retrieval
    allow_foreign_export: bool = False  # score through an export solved on other weights (stated in the report)
    retrieval_funnels: bool = (
        False  # adaptive retrieval over RR (eigtrain.evaluate.funnels): table.md/csv rows, retrieval_funnels.png
    )
    data: RunDataConfig = field(default_factory=RunDataConfig)  # data sources replacing the run's saved ones

    def validate(self) -> "EvalConfig":
        """The checks that need no data and no torch: one line naming the key."""
        if bool(self.run_dir) == bool(self.features):
            raise ValueError("give exactly one of run_dir= or features=")
        if self.run_dir and self.train_split == self.test_split:  # a training accuracy is not a held-out score
            raise ValueError(
                f"train_split and test_split are both {self.test_split!r}: the probes would be scored on the samples "
                f"they were fitted on; choose another test_split (a run on data.shards: split 'val' with "
                f"data.val_shards)"
            )
        if self.probe not in PROBES:
            raise ValueError(f"probe={self.probe!r} is unknown; allowed: {', '.join(PROBES)}")
        if self.retrieval not in RETRIEVAL:
            raise ValueError(f"retrieval={self.retrieval!r} is unknown; allowed: {', '.join(RETRIEVAL)}")
        if self.random_draws < 0 or self.retrieval_draws < 0 or self.random_se < 0:
            raise ValueError("random_draws, retrieval_draws and random_se must be >= 0")
        if self.dims is not None and (not self.dims or min(self.dims) < 1):
            raise ValueError(f"dims={self.dims}: give sizes >= 1 (or null: 4, 8, ..., d)")
        return self


PROBES = ("sgd", "closed_form")
RETRIEVAL = ("auto", "torch", "faiss", "none")
