"""The paper's Table 1 (section 5.1), copied exactly: mean and standard error over 5 runs.

Methods: SCL (= LoRA with one encoder, "lora") and RQ and VICReg, each with Rayleigh-Ritz (rr) or joint
nesting (jn). The paper's budget: 3e5 steps of batch 1000 on 1e7 training pairs, 1e6 evaluation samples.
"""

PAPER_STEPS = 300_000
METHODS = ("lora-rr", "lora-jn", "rq-rr", "rq-jn", "vicreg-rr", "vicreg-jn")  # the paper's column order

# (kernel, rank) -> metric -> method -> (mean, standard error)
_RAW = {
    ("legendre", 6): {
        "ef_mse": "0.111 0.049 | 0.068 0.015 | 0.085 0.005 | 0.118 0.005 | 0.254 0.002 | 0.293 0.006",
        "ev_rae": "0.045 0.004 | 0.049 0.005 | 0.071 0.002 | 0.057 0.003 | 0.067 0.002 | 0.073 0.005",
    },
    ("legendre", 8): {
        "ef_mse": "0.222 0.031 | 0.077 0.010 | 0.122 0.003 | 0.136 0.004 | 0.397 0.007 | 0.844 0.091",
        "ev_rae": "0.068 0.017 | 0.071 0.015 | 0.080 0.002 | 0.067 0.001 | 0.131 0.007 | 0.179 0.014",
    },
    ("legendre", 10): {
        "ef_mse": "0.229 0.039 | 0.109 0.010 | 0.153 0.005 | 0.233 0.026 | 0.480 0.003 | 1.000 0.050",
        "ev_rae": "0.075 0.009 | 0.066 0.010 | 0.101 0.003 | 0.092 0.004 | 0.173 0.003 | 0.300 0.064",
    },
    ("fourier", 6): {
        "ef_mse": "0.065 0.005 | 0.058 0.003 | 0.088 0.003 | 0.091 0.002 | 0.200 0.001 | 0.218 0.001",
        "ev_rae": "0.023 0.006 | 0.028 0.007 | 0.062 0.004 | 0.046 0.003 | 0.043 0.004 | 0.052 0.004",
    },
    ("fourier", 8): {
        "ef_mse": "0.180 0.020 | 0.105 0.002 | 0.133 0.003 | 0.134 0.001 | 0.448 0.153 | 0.554 0.053",
        "ev_rae": "0.046 0.011 | 0.044 0.011 | 0.071 0.002 | 0.064 0.003 | 0.183 0.083 | 0.238 0.036",
    },
    ("fourier", 10): {
        "ef_mse": "0.195 0.016 | 0.133 0.003 | 0.179 0.005 | 0.183 0.003 | 0.454 0.039 | 0.812 0.073",
        "ev_rae": "0.054 0.010 | 0.054 0.009 | 0.077 0.003 | 0.069 0.003 | 0.218 0.035 | 0.370 0.038",
    },
}

PAPER_TABLE = {
    key: {
        metric: {method: tuple(float(x) for x in cell.split()) for method, cell in zip(METHODS, row.split("|"))}
        for metric, row in metrics.items()
    }
    for key, metrics in _RAW.items()
}


def superseded(record: dict) -> bool:
    """A VICReg result stored before its target became psi_2..psi_(d+1) (compared with psi_1..psi_d)."""
    return record["objective"].startswith("vicreg") and "target_first" not in record
