"""Masked nesting equals the brute-force sum over prefixes; sequential nesting has stop-gradient
gradients; bad input raises clear errors."""

import pytest
import torch
import torch.nn.functional as F

from eigtrain.objectives import build_objective, mrl_prefixes
from tests.support import objective_reference as ref

DIM, BATCH = 8, 12


def _center_pooled(f, g):
    mean = torch.cat([f, g]).mean(0)
    return f - mean, g - mean


# name, build kwargs, reference on one prefix, transform of the full features before truncation
CASES = {
    # lora/scl without the constant held outside (its own brute force: tests/objectives/test_constant_mode.py)
    "lora": ("lora", {"constant_mode": "none"}, ref.lora, None),
    "lora-center": (
        "lora",
        {"center": True, "constant_mode": "none"},
        ref.lora,
        lambda f, g: (f - f.mean(0), g - g.mean(0)),
    ),
    "scl": ("scl", {"constant_mode": "none"}, ref.lora, None),
    "scl-normalize": (
        "scl",
        {"normalize": True, "constant_mode": "none"},
        ref.lora,
        lambda f, g: (F.normalize(f, dim=1), F.normalize(g, dim=1)),
    ),
    "scl-center": ("scl", {"center": True, "constant_mode": "none"}, ref.lora, _center_pooled),
    "rq": ("rq", {"mu": 3.0, "nu": 7.0}, lambda f, g: ref.rq(f, g, 3.0, 7.0), None),
    "rq-pairs": ("rq", {"pairs": True}, lambda f, g: ref.rq(f, g, pairs=True), None),
    "rq-center": ("rq", {"center": True}, ref.rq, _center_pooled),
    "rq_direct": ("rq_direct", {}, ref.rq_direct, None),
    "vicreg": ("vicreg", {}, ref.vicreg, None),
    "vicreg-coef": (
        "vicreg",
        {"sim_coeff": 2.0, "std_coeff": 3.0, "cov_coeff": 5.0},
        lambda f, g: ref.vicreg(f, g, 2.0, 3.0, 5.0),
        None,
    ),
    "vicreg_paper": ("vicreg_paper", {}, ref.vicreg_paper, None),
    "vicreg_paper-coef": (
        "vicreg_paper",
        {"lam": 2.0, "mu": 3.0, "nu": 5.0, "eps": 1e-3},
        lambda f, g: ref.vicreg_paper(f, g, 2.0, 3.0, 5.0, 1e-3),
        None,
    ),
}

PREFIX_SETS = {
    "all-uniform": (None, None),
    "sparse-weighted": ([1, 3, 6, 8], [0.5, 2.0, 1.0, 0.25]),
    "mrl": ("mrl", None),
}


def _features(seed=0):
    gen = torch.Generator().manual_seed(seed)
    f = torch.randn(BATCH, DIM, generator=gen, dtype=torch.float64) * 0.7 + 0.3
    g = f + 0.5 * torch.randn(BATCH, DIM, generator=gen, dtype=torch.float64)
    return f.requires_grad_(), g.requires_grad_()


def _prefixes_weights(prefixes, weights):
    if prefixes is None:
        prefixes = list(range(1, DIM + 1))
    elif prefixes == "mrl":
        prefixes = mrl_prefixes(DIM)
    if weights is None:
        weights = [1.0 / len(prefixes)] * len(prefixes)
    return prefixes, weights


def _brute_force(reference, transform, f, g, prefixes, weights, sequential=False):
    if transform is not None:
        f, g = transform(f, g)
    total = 0.0
    for k, w in zip(prefixes, weights):
        fk, gk = f[:, :k], g[:, :k]
        if sequential:  # mode k sees modes < k as constants
            fk = torch.cat([fk[:, :-1].detach(), fk[:, -1:]], 1)
            gk = torch.cat([gk[:, :-1].detach(), gk[:, -1:]], 1)
        total = total + w * reference(fk, gk)
    return total


@pytest.mark.parametrize("prefix_set", PREFIX_SETS)
@pytest.mark.parametrize("case", CASES)
def test_joint_nesting_mask_equals_bruteforce(case, prefix_set):
    name, kwargs, reference, transform = CASES[case]
    prefixes, weights = PREFIX_SETS[prefix_set]
    objective = build_objective(name, DIM, nesting="joint", prefixes=prefixes, weights=weights, **kwargs)
    f, g = _features()
    loss, terms = objective(f, g)
    expected = _brute_force(reference, transform, f, g, *_prefixes_weights(prefixes, weights))
    assert loss.dtype == torch.float64
    torch.testing.assert_close(loss, expected, rtol=1e-12, atol=1e-12)
    grads = torch.autograd.grad(loss, (f, g))
    expected_grads = torch.autograd.grad(expected, (f, g))
    for got, want in zip(grads, expected_grads):
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)
    assert terms["eigenvalues"].shape == (DIM,)
    assert sum(v for k, v in terms.items() if k != "eigenvalues").item() == pytest.approx(loss.item(), rel=1e-12)


@pytest.mark.parametrize("case", CASES)
def test_unnested_equals_reference(case):
    name, kwargs, reference, transform = CASES[case]
    f, g = _features(1)
    loss, _ = build_objective(name, DIM, **kwargs)(f, g)
    expected = _brute_force(reference, transform, f, g, [DIM], [1.0])
    torch.testing.assert_close(loss, expected, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("case", [c for c in CASES if "normalize" not in c])
def test_sequential_nesting_value_and_stop_gradient(case):
    name, kwargs, reference, transform = CASES[case]
    prefixes, weights = list(range(1, DIM + 1)), [float(k) for k in range(1, DIM + 1)]
    objective = build_objective(name, DIM, nesting="sequential", weights=weights, **kwargs)
    f, g = _features(2)
    loss, _ = objective(f, g)
    joint = _brute_force(reference, transform, f, g, prefixes, weights)
    torch.testing.assert_close(loss, joint, rtol=1e-12, atol=1e-12)
    expected = _brute_force(reference, transform, f, g, prefixes, weights, sequential=True)
    for got, want in zip(torch.autograd.grad(loss, (f, g)), torch.autograd.grad(expected, (f, g))):
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)
    # and the stop-gradient really differs from joint nesting
    joint_grad = torch.autograd.grad(joint, f)[0]
    assert not torch.allclose(torch.autograd.grad(objective(f, g)[0], f)[0], joint_grad)


def test_prefix_normalized_scl_equals_bruteforce():
    prefixes = mrl_prefixes(DIM)
    objective = build_objective("scl", DIM, nesting="joint", prefixes="mrl", normalize="prefix", constant_mode="none")
    f, g = _features(3)
    loss, _ = objective(f, g)
    expected = sum(
        ref.lora(F.normalize(f[:, :k], dim=1), F.normalize(g[:, :k], dim=1)) / len(prefixes) for k in prefixes
    )
    torch.testing.assert_close(loss, expected, rtol=1e-12, atol=1e-12)


def test_fp32_and_autocast_inputs_compute_in_fp32():
    objective = build_objective("rq", DIM, nesting="joint")
    f, g = (z.detach().to(torch.bfloat16) for z in _features(4))
    loss, terms = objective(f, g)
    assert loss.dtype == torch.float32 and terms["eigenvalues"].dtype == torch.float32


def test_eigenvalue_estimate_is_normalized_cross_moment():
    f, g = (z.detach() for z in _features(5))
    _, terms = build_objective("scl", DIM)(f, g)
    expected = (f * g).sum(0) / ((f * f).sum(0) * (g * g).sum(0)).sqrt()
    torch.testing.assert_close(terms["eigenvalues"], expected)


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: build_objective("simclr", 4), "objective='simclr' is unknown"),
        (lambda: build_objective("rq", 4, lam=1.0), "unknown coefficient(s) ['lam']"),
        (lambda: build_objective("rq", 4, nesting="prefix"), "nesting='prefix' is unknown"),
        (lambda: build_objective("lora", 4, nesting="joint", prefixes=[0, 2]), "outside 1..dim=4"),
        (lambda: build_objective("lora", 4, nesting="joint", prefixes=[2, 5]), "outside 1..dim=4"),
        (lambda: build_objective("lora", 4, nesting="joint", prefixes=[2, 4], weights=[1.0, 0.0]), "must be positive"),
        (lambda: build_objective("lora", 4, nesting="joint", prefixes=[2, 4], weights=[1.0]), "1 weights given for 2"),
        (lambda: build_objective("lora", 4, nesting="sequential", prefixes=[2, 4]), "needs all prefixes"),
        (lambda: build_objective("lora", 4, prefixes=[2, 4]), "takes no prefixes"),
        (lambda: build_objective("scl", 4, normalize="sphere"), "normalize='sphere' is unknown"),
        (lambda: build_objective("scl", 4, nesting="sequential", normalize=True), "not a stop-gradient"),
        (lambda: build_objective("rq_direct", 4, pairs=True), "one encoder on two views"),
        (lambda: build_objective("rq", 4)(torch.zeros(5, 4), torch.zeros(5, 4)), "even local batch size, got 5"),
        (lambda: build_objective("rq", 4)(torch.zeros(6, 4), torch.zeros(6, 3)), "z2 must have shape (batch, 4)"),
        (lambda: build_objective("lora", 4)(torch.zeros(6, 4), torch.zeros(4, 4)), "same batch size"),
        (lambda: build_objective("lora", 4)(torch.zeros(1, 4), torch.zeros(1, 4)), "at least 2"),
    ],
)
def test_bad_input_raises_clear_value_error(call, message):
    with pytest.raises(ValueError) as info:
        call()
    assert message in str(info.value)
