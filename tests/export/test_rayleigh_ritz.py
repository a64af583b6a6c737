"""Rayleigh-Ritz core: exact streaming merges, exact recovery on finite kernels, the paper's algorithms."""

import os

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from eigtrain.export.moments import RRAccumulator
from eigtrain.export.rayleigh_ritz import solve
from tests.support.finite_kernels import assert_same_functions, empirical_eigenfunctions, stream, symmetric_pairs
from tests.support.runs import free_port

F64 = torch.float64


def held(acc) -> dict:
    """What one encoder's accumulator holds (RRAccumulator): means, c_ff + c_gg and c_fg + c_fg^T (an accumulator
    or its state_dict)."""
    get = acc.__getitem__ if isinstance(acc, dict) else lambda key: getattr(acc, key)
    ff, fg = get("c_ff") + get("c_gg"), get("c_fg") + get("c_fg").T
    return {"mean_f": get("mean_f"), "mean_g": get("mean_g"), "c_ff + c_gg": ff, "c_fg + c_fg^T": fg}


def test_streaming_and_merge_are_exact():
    gen = torch.Generator().manual_seed(0)
    z1 = torch.randn(1000, 5, generator=gen, dtype=F64) * 3 + 100.0  # large mean: centered sums keep precision
    z2 = z1 @ torch.randn(5, 5, generator=gen, dtype=F64) + 7.0
    whole = RRAccumulator(5)
    whole.update(z1, z2)
    streamed = stream(RRAccumulator(5), z1, z2, batch=37)
    left, right = stream(RRAccumulator(5), z1[:611], z2[:611]), stream(RRAccumulator(5), z1[611:], z2[611:])
    left.merge(right)
    for acc in (streamed, left):
        assert acc.n == 1000
        for key, value in held(whole).items():
            torch.testing.assert_close(held(acc)[key], value, rtol=1e-11, atol=1e-8, msg=key)
    f, g = z1 - z1.mean(0), z2 - z2.mean(0)
    torch.testing.assert_close(held(whole)["c_ff + c_gg"], f.T @ f + g.T @ g, rtol=1e-11, atol=1e-8)
    torch.testing.assert_close(held(whole)["c_fg + c_fg^T"], f.T @ g + g.T @ f, rtol=1e-11, atol=1e-8)


@pytest.mark.parametrize("center", [False, True])
def test_generalized_recovers_eigenpairs_from_any_invertible_mix(center):
    states, d = 7, 3
    a, b = symmetric_pairs(states)
    lam, psi = empirical_eigenfunctions(a, b, states)
    first = 1 if center else 0  # centering removes the constant mode, so give it the next d modes
    rng = np.random.default_rng(1)
    mix = rng.normal(size=(d, d)) + 2 * np.eye(d)
    offset = rng.normal(size=d) if center else np.zeros(d)
    table = psi[:, first : first + d] @ mix + offset  # an arbitrary embedding of each state
    acc = stream(RRAccumulator(d), torch.from_numpy(table[a]), torch.from_numpy(table[b]))
    res = solve(acc, "generalized", center=center, trivial="keep")  # keep: the paper's convention
    np.testing.assert_allclose(res.eigenvalues.numpy(), lam[first : first + d], atol=1e-10)
    features = res.apply(torch.from_numpy(table)).numpy()
    assert_same_functions(features, psi[:, first : first + d], atol=1e-9)
    if not center:
        assert abs(res.eigenvalues[0].item() - 1.0) < 1e-12  # the constant mode, kept


def test_svd_recovers_singular_pairs():
    rng = np.random.default_rng(2)
    nx, na, d = 6, 5, 3
    p = rng.random((nx, na)) ** 2
    p /= p.sum()
    idx = rng.choice(nx * na, size=6000, p=p.ravel())
    x, y = idx // na, idx % na
    joint = np.zeros((nx, na))
    np.add.at(joint, (x, y), 1.0)
    joint /= joint.sum()
    px, pa = joint.sum(1), joint.sum(0)
    u, s, vh = np.linalg.svd(joint / np.sqrt(np.outer(px, pa)))
    phi, psi = u[:, :d] / np.sqrt(px)[:, None], vh[:d].T / np.sqrt(pa)[:, None]
    tx, ta = phi @ rng.normal(size=(d, d)), psi @ rng.normal(size=(d, d))
    acc = stream(RRAccumulator(d, pairs=True), torch.from_numpy(tx[x]), torch.from_numpy(ta[y]))
    res = solve(acc, "svd", trivial="keep")
    np.testing.assert_allclose(res.eigenvalues.numpy(), s[:d], atol=1e-10)
    fx, fa = res.apply(torch.from_numpy(tx)).numpy(), res.apply_right(torch.from_numpy(ta)).numpy()
    signs = np.sign((fx * phi).sum(0))
    np.testing.assert_allclose(fx * signs, phi, atol=1e-9)
    np.testing.assert_allclose(fa * signs, psi, atol=1e-9)  # left and right signs agree


def _paper_reference(z1, z2, mode, batch=333):
    """Appendix F, Algorithms F.1 (RQ), F.2 (VICReg), F.3 (SCL), as streaming numpy loops."""
    d = z1.shape[1]
    cnt, bmat, mean = 0, np.zeros((d, d)), np.zeros(d)
    for s in range(0, len(z1), batch):
        f, g = z1[s : s + batch], z2[s : s + batch]
        m = len(f)
        if mode == "paper-rq":
            bmat = (cnt * bmat + f.T @ g) / (cnt + m)
        elif mode == "paper-lora":
            bmat = (2 * cnt * bmat + f.T @ f + g.T @ g) / (2 * cnt + 2 * m)
        else:  # F.2 estimates the centered cross moment; computed here in closed form at the end
            mean = (cnt * mean + 0.5 * (f + g).sum(0)) / (cnt + m)
        cnt += m
    if mode == "paper-vicreg":
        bmat = (z1 - mean).T @ (z2 - mean) / len(z1)
    lam, u = np.linalg.eigh((bmat + bmat.T) / 2)
    lam, u = lam[::-1], u[:, ::-1]
    if mode == "paper-lora":
        return lam, u / np.sqrt(lam), np.zeros(d)
    return lam, u, mean


@pytest.mark.parametrize("mode", ["paper-rq", "paper-vicreg", "paper-lora"])
def test_paper_modes_reproduce_appendix_f(mode):
    a, b = symmetric_pairs(seed=3)
    rng = np.random.default_rng(4)
    table = rng.normal(size=(7, 4)) + 0.5
    z1, z2 = table[a], table[b]
    lam, transform, mean = _paper_reference(z1, z2, mode)
    res = solve(stream(RRAccumulator(4), torch.from_numpy(z1), torch.from_numpy(z2)), mode, trivial="keep")
    np.testing.assert_allclose(res.eigenvalues.numpy(), lam, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(res.mean.numpy(), mean, atol=1e-12)
    assert_same_functions(res.transform.numpy(), transform, atol=1e-9)


def test_singular_gram_is_solved_on_its_range_or_ridge_regularized():
    z1 = torch.randn(200, 3, dtype=F64)
    z2 = z1 + 0.1 * torch.randn_like(z1)
    duplicate = lambda z: torch.cat([z, z[:, :1]], 1)  # noqa: E731  (a repeated dimension)
    acc = RRAccumulator(4)
    acc.update(duplicate(z1), duplicate(z2))
    assert solve(acc).dims["dependent"] == 1 and solve(acc).transform.shape == (4, 3)
    res = solve(acc, ridge=1e-6)
    assert torch.isfinite(res.eigenvalues).all() and torch.isfinite(res.transform).all()
    with pytest.raises(ValueError, match="every dimension of the embedding is constant"):
        zero = RRAccumulator(2)
        zero.update(torch.ones(5, 2, dtype=F64), torch.ones(5, 2, dtype=F64))
        solve(zero)


def test_paper_lora_honours_the_ridge_on_a_singular_gram():
    z1 = torch.randn(200, 3, dtype=F64)
    z2 = z1 + 0.1 * torch.randn_like(z1)
    acc = RRAccumulator(4)
    acc.update(*(torch.cat([z, z[:, :1]], 1) for z in (z1, z2)))  # a repeated dimension: Gram singular
    assert solve(acc, "paper-lora", trivial="keep").transform.shape == (4, 3)  # solved on the range
    res = solve(acc, "paper-lora", ridge=1e-6, trivial="keep")
    assert torch.isfinite(res.eigenvalues).all() and torch.isfinite(res.transform).all()
    gram = (acc.second_moments(False)[0] + acc.second_moments(False)[1]) / 2
    ridged = gram + 1e-6 * torch.trace(gram) / 4 * torch.eye(4, dtype=F64)
    torch.testing.assert_close(res.eigenvalues, torch.linalg.eigvalsh(ridged).flip(0), rtol=1e-10, atol=1e-14)
    # F.3's features are whitened by the ridged Gram: transform^T (G + ridge) transform = I
    torch.testing.assert_close(res.transform.T @ ridged @ res.transform, torch.eye(4, dtype=F64), rtol=0, atol=1e-8)


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: solve(RRAccumulator(3), "pca"), "mode='pca' is unknown"),
        (lambda: solve(RRAccumulator(3), "svd"), "use 'svd' for two encoders"),
        (lambda: solve(RRAccumulator(3)), "at least 2 pairs"),
        (lambda: RRAccumulator(3).update(torch.zeros(4, 2), torch.zeros(4, 3)), "expected z1 (batch, 3)"),
        (lambda: RRAccumulator(2).update(torch.full((4, 2), float("nan")), torch.zeros(4, 2)), "non-finite"),
    ],
)
def test_bad_input_raises(call, message):
    with pytest.raises(ValueError) as info:
        call()
    assert message in str(info.value)


def _reduce_worker(rank, port, out_dir):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    gen = torch.Generator().manual_seed(5)
    z1 = torch.randn(301, 4, generator=gen, dtype=F64) + 3.0
    z2 = z1 + torch.randn(301, 4, generator=gen, dtype=F64)
    rows = slice(0, 120) if rank == 0 else slice(120, 301)  # uneven shares
    acc = stream(RRAccumulator(4), z1[rows], z2[rows], batch=50)
    acc.all_reduce()
    torch.save(acc.state_dict(), os.path.join(out_dir, f"rank{rank}.pt"))
    dist.destroy_process_group()


@pytest.mark.slow
def test_two_rank_all_reduce_equals_single_process(tmp_path):
    port = free_port()
    mp.spawn(_reduce_worker, args=(port, str(tmp_path)), nprocs=2, join=True)
    gen = torch.Generator().manual_seed(5)
    z1 = torch.randn(301, 4, generator=gen, dtype=F64) + 3.0
    z2 = z1 + torch.randn(301, 4, generator=gen, dtype=F64)
    single = RRAccumulator(4)
    single.update(z1, z2)
    for rank in range(2):
        state = torch.load(tmp_path / f"rank{rank}.pt")
        assert state["n"] == 301
        for key, value in held(single).items():
            torch.testing.assert_close(held(state)[key], value, rtol=1e-12, atol=1e-10, msg=key)
