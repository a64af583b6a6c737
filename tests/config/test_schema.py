"""The typed config schema (eigtrain/schema/) and the Hydra-composed command lines (eigtrain/cli.py)."""

import dataclasses
import importlib.resources
from pathlib import Path

import pytest
from hydra import compose, initialize_config_module
from hydra.core.global_hydra import GlobalHydra
from hydra.errors import ConfigCompositionException
from omegaconf import OmegaConf

from eigtrain.cli import compose_dataclass, sweep_points
from eigtrain.schema import ConfigError, TrainConfig, check
from eigtrain.train.checks import validate
from eigtrain.train.command import compose_config
from eigtrain.train.sweep_naming import sweep_point

CONFIGS = importlib.resources.files("eigtrain.configs")


def options(group: str) -> list[str]:
    return sorted(p.name.removesuffix(".yaml") for p in (CONFIGS / group).iterdir() if p.name.endswith(".yaml"))


GROUP_OPTIONS = [
    (g, o) for g in ("objective", "nesting", "model", "data", "engine", "optim", "launcher") for o in options(g)
]


def test_every_group_and_experiment_is_found():
    assert {g for g, _ in GROUP_OPTIONS} == {"objective", "nesting", "model", "data", "engine", "optim", "launcher"}
    assert len(GROUP_OPTIONS) >= 25 and len(options("experiment")) >= 6


@pytest.mark.parametrize("group, option", GROUP_OPTIONS)
def test_every_group_option_fits_the_schema(group, option):
    cfg = compose_config([f"{group}={option}"])
    check(cfg)
    written = OmegaConf.to_container(OmegaConf.load(str(CONFIGS / group / f"{option}.yaml")), resolve=False)
    composed = OmegaConf.to_container(cfg[group], resolve=False)
    written.pop("defaults", None)  # Hydra's defaults list: the option's dataclass the file starts from
    for key, value in written.items():  # every key of the file arrived, with its value
        assert composed[key] == value, (group, option, key)


@pytest.mark.parametrize("experiment", options("experiment"))
def test_every_experiment_fits_the_schema_and_the_checks(experiment):
    cfg = compose_config([f"experiment={experiment}"])
    assert cfg.name == experiment
    assert validate(cfg, world_size=8)[0] >= 1


def test_data_and_model_keys_are_typed():
    with pytest.raises(ConfigCompositionException):
        compose_config(["data.num_workers=two"])
    with pytest.raises(ConfigCompositionException):
        compose_config(["model.sync_batch_norm=maybe"])
    cfg = compose_config(["data.image_size=[32,32]", "optim.lr=1"])
    assert list(cfg.data.image_size) == [32, 32] and cfg.optim.lr == 1


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["+stepz=1"], r"^unknown key 'stepz'; allowed: .*\bsteps\b"),
        (["+data.pin_memry=true"], r"^unknown key 'data.pin_memry'; allowed: .*pin_memory"),
        (
            ["+objective.mu=3"],
            r"^unknown key 'objective.mu'; allowed: name, reduction, reduction_flops_per_byte, center, normalize, constant_mode$",
        ),
        (
            ["objective=rq", "+objective.lam=3"],
            r"^unknown key 'objective.lam'; allowed: name, reduction, reduction_flops_per_byte, mu, nu, center$",
        ),
        (["optim=adamw", "+optim.momentum=0.5"], r"^unknown key 'optim.momentum'; allowed: .*betas, eps$"),
        (["launcher=slurm", "+launcher.gpus=8"], r"^unknown key 'launcher.gpus'; allowed: .*gpus_per_node"),
        (["objective.name=simclr"], r"^objective.name='simclr' is not allowed; allowed: lora, .*vicreg_paper"),
    ],
)
def test_schema_rejects_unknown_keys_per_option_in_one_line(overrides, message):
    cfg = compose_config(overrides)
    with pytest.raises(ConfigError, match=message) as error:
        check(cfg)
    assert "\n" not in str(error.value)


def test_a_config_built_in_code_is_checked_too():
    def untyped():
        return OmegaConf.create(OmegaConf.to_container(compose_config([]), resolve=False))

    cfg = untyped()
    cfg.model.widht = 3
    with pytest.raises(ConfigError, match="unknown key 'model.widht'"):
        check(cfg)
    cfg = untyped()
    cfg.objective.center = "sometimes"
    with pytest.raises(ConfigError, match="bad value for objective.center"):
        check(cfg)


def test_option_files_added_through_the_searchpath_are_accepted_and_checked(tmp_path):
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "wide_mlp.yaml").write_text("backbone: mlp\nwidth: 256\nprojector_layers: 0\n")
    (tmp_path / "objective").mkdir()
    (tmp_path / "objective" / "rq_strong.yaml").write_text("name: rq\nmu: 100.0\nnu: 300.0\n")
    (tmp_path / "objective" / "typo.yaml").write_text("name: scl\nnormalise: full\n")
    searchpath = f"hydra.searchpath=[file://{tmp_path}]"

    cfg = compose_config([searchpath, "model=wide_mlp", "objective=rq_strong", "batch_size=64"])
    assert validate(cfg, world_size=1) == (64, 1)
    assert (cfg.model.backbone, cfg.model.width, cfg.model.depth) == ("mlp", 256, 4)  # depth: the schema's default
    assert (cfg.objective.name, cfg.objective.mu) == ("rq", 100.0)
    with pytest.raises(
        ConfigError,
        match="unknown key 'objective.normalise'; allowed: name, reduction, reduction_flops_per_byte, center, normalize",
    ):
        check(compose_config([searchpath, "objective=typo"]))
    (tmp_path / "model" / "typo.yaml").write_text("backbone: mlp\nwidht: 256\n")
    with pytest.raises(ConfigCompositionException, match="widht"):
        compose_config([searchpath, "model=typo"])


def test_schema_is_registered_as_the_base_of_train_yaml():
    with initialize_config_module(config_module="eigtrain.configs", version_base="1.3"):
        cfg = compose("train")
    assert OmegaConf.get_type(cfg) is TrainConfig
    assert OmegaConf.get_type(cfg.data).__name__ == "DataConfig"


# ------------------------------------------------------------------------------------- sweeps


def test_sweep_point_directory_is_a_function_of_the_point_only():
    a = sweep_point(["optim.lr=0.05", "experiment=cpu_debug", "launcher.time=30", "run_dir=/x", "stop_after=3"])
    b = sweep_point(["experiment=cpu_debug", "optim.lr=0.05", "logging.progress=false"])
    assert a == b == "experiment=cpu_debug,optim.lr=0.05"  # order, where and how it runs do not matter
    assert sweep_point(["optim.lr=0.1", "experiment=cpu_debug"]) != a
    assert sweep_point(["data.root=/data/x"]).startswith("data.root=x-")  # one directory level
    assert sweep_point(["data.root=/data/x"]) != sweep_point(["data.root=/other/x"])
    long = sweep_point([f"k{i}=value{i}" for i in range(40)])
    assert len(long) <= 160 and long != sweep_point([f"k{i}=value{i}" for i in range(39)])
    assert sweep_point([]) == "default"


def test_sweep_points_check_every_value():
    points = sweep_points(["experiment=cpu_debug", "optim.lr=0.05,0.1", "seed=range(3)"])
    assert points == [
        ["experiment=cpu_debug", "optim.lr=0.05", "seed=0"],
        ["experiment=cpu_debug", "optim.lr=0.1", "seed=0"],
        ["experiment=cpu_debug", "optim.lr=0.05", "seed=1"],
        ["experiment=cpu_debug", "optim.lr=0.05", "seed=2"],
    ]


# ---------------------------------------------------------------------- small commands' schemas


@dataclasses.dataclass
class Inner:
    size: int = 1
    kwargs: dict = dataclasses.field(default_factory=dict)


@dataclasses.dataclass
class Args:
    path: str | None = None
    names: str = "a"
    steps: int = 10
    rate: float = 0.5
    flag: bool = False
    dims: list[int] | None = None
    preset: str = ""
    inner: Inner = dataclasses.field(default_factory=Inner)


PRESETS = {"big": {"steps": 1000, "rate": 0.1}}


def test_compose_dataclass_keeps_the_command_line_syntax():
    args = compose_dataclass(
        Args,
        [
            "path=/d/{000..009}.tar",
            "names=a,b",
            "steps=3e5",
            "flag=true",
            "dims=[4,16]",
            "inner.size=300_000",
            "inner.kwargs.num_classes=0",
            "inner.kwargs.name=x",
        ],
    )
    assert args == Args(
        path="/d/{000..009}.tar",
        names="a,b",
        steps=300_000,
        flag=True,
        dims=[4, 16],
        inner=Inner(size=300_000, kwargs={"num_classes": 0, "name": "x"}),
    )
    assert compose_dataclass(Args, ["path=null"]).path is None
    assert compose_dataclass(Args, ["path=it's"]).path == "it's"


@dataclasses.dataclass
class ListArgs:
    dirs: list[str] = dataclasses.field(default_factory=list)


def test_compose_dataclass_reads_a_list_of_strings_as_a_list():  # eigtrain-eval ff_run_dirs=[DIR4,DIR8]
    assert compose_dataclass(ListArgs, ["dirs=[/runs/ff4,/runs/ff8]"]).dirs == ["/runs/ff4", "/runs/ff8"]


def test_compose_dataclass_presets_are_a_config_group_and_explicit_keys_win():
    args = compose_dataclass(Args, ["steps=5", "preset=big"], groups={"preset": PRESETS})
    assert (args.preset, args.steps, args.rate) == ("big", 5, 0.1)
    with pytest.raises(ValueError, match=r"^preset='huge' is unknown; allowed: big$"):
        compose_dataclass(Args, ["preset=huge"], groups={"preset": PRESETS})


@pytest.mark.parametrize(
    "argv, message",
    [
        (["stepz=3"], r"^unknown key 'stepz'; allowed: path, names, steps"),
        (["inner.sise=3"], r"^unknown key 'inner.sise'; allowed: size, kwargs$"),
        (["steps=ten"], r"^bad value for steps: Value 'ten' of type 'str' could not be converted to Integer$"),
        (["steps=1.5"], r"^bad value for steps"),
        (["flag=maybe"], r"^bad value for flag"),
        (["steps"], r"^arguments are key=value, got 'steps'"),
    ],
)
def test_compose_dataclass_errors_are_one_line_naming_the_key(argv, message):
    with pytest.raises(ValueError, match=message) as error:
        compose_dataclass(Args, argv)
    assert "\n" not in str(error.value)


def test_compose_dataclass_inside_a_running_hydra_app():
    # eigtrain-train writes the demo shards through eigtrain-shards' parser while Hydra runs it
    with initialize_config_module(config_module="eigtrain.configs", version_base="1.3"):
        outer = GlobalHydra.instance().hydra
        assert compose_dataclass(Args, ["steps=2"]).steps == 2
        assert GlobalHydra.instance().hydra is outer
        assert compose("train", overrides=["steps=7"]).steps == 7


def test_every_command_parses_through_the_helper():
    from eigtrain.data.write import parse_args as shards_args
    from eigtrain.export.command import parse_args as rr_args

    assert shards_args(["source=digits", f"out={Path('x')}", "seed=3"])["seed"] == 3
    rr = rr_args(["encoder=timm:resnet18", "encoder.kwargs.num_classes=0", "data.root=/d", "out=/o"])
    assert (rr.encoder.name, rr.encoder.kwargs, rr.data.root) == ("timm:resnet18", {"num_classes": 0}, "/d")
    with pytest.raises(ValueError, match="unknown key 'modee'"):
        rr_args(["run_dir=r", "modee=svd"])
