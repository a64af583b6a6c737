"""A config typed by an objective's dataclass crosses a process boundary (submitit cloudpickles the config into each
Slurm task) and still merges with the same dataclass there: the classes are plain module-level dataclasses."""

import subprocess
import sys

import cloudpickle
from omegaconf import OmegaConf

from eigtrain.schema import OBJECTIVE_SCHEMAS

MERGE = (
    "import pickle, sys\n"
    "from omegaconf import OmegaConf\n"
    "from eigtrain.schema import OBJECTIVE_SCHEMAS\n"
    "node = pickle.loads(sys.stdin.buffer.read())\n"
    "OmegaConf.merge(OmegaConf.structured(OBJECTIVE_SCHEMAS['scl']), node)\n"
    "assert OmegaConf.get_type(node) is OBJECTIVE_SCHEMAS['scl']\n"
)


def test_an_objective_config_unpickled_in_another_process_merges_with_its_schema():
    node = OmegaConf.structured(OBJECTIVE_SCHEMAS["scl"])
    blob = cloudpickle.dumps(node)
    done = subprocess.run([sys.executable, "-c", MERGE], input=blob, capture_output=True)
    assert done.returncode == 0, done.stderr.decode()[-600:]
