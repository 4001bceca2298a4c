"""Random numbers without Tensor.exponential_ (vllm_kunlun/ops/sampling/noise.py).

Distribution checks use a Kolmogorov-Smirnov test against Exp(1) (or U[0, 1)); a test
fails when p < ALPHA = 1e-4 (fixed seeds: deterministic).
"""

from __future__ import annotations

import math

import pytest
import torch
from scipy import stats

from tests.unit.sampler_reference import ALPHA
from vllm_kunlun.ops.sampling.noise import exponential_noise, row_uniforms


@pytest.fixture(autouse=True)
def no_exponential(monkeypatch: pytest.MonkeyPatch) -> None:
    def guard(*args, **kwargs):  # type: ignore[no-untyped-def]
        raise AssertionError("Tensor.exponential_ called")

    monkeypatch.setattr(torch.Tensor, "exponential_", guard)


def _gens(seeds: dict[int, int]) -> dict[int, torch.Generator]:
    return {i: torch.Generator().manual_seed(s) for i, s in seeds.items()}


def test_seeded_uniform_depends_only_on_its_generator() -> None:
    a = row_uniforms(5, _gens({1: 42, 3: 7}), torch.device("cpu"), draws=3)
    b = row_uniforms(9, _gens({6: 42, 0: 7}), torch.device("cpu"), draws=3)
    assert a.shape == (5, 3) and b.shape == (9, 3)
    assert torch.equal(a[1], b[6]) and torch.equal(a[3], b[0])
    c = row_uniforms(5, _gens({1: 43, 3: 8}), torch.device("cpu"), draws=3)
    assert (a[1] != c[1]).all() and (a[3] != c[3]).all()
    assert ((a >= 0) & (a < 1)).all()
    assert len(set(a[1].tolist())) == 3  # each draw of a row is a new value


def test_all_seeded_batch_leaves_the_global_rng_alone() -> None:
    torch.manual_seed(0)
    state = torch.get_rng_state()
    row_uniforms(3, _gens({0: 1, 1: 2, 2: 3}), torch.device("cpu"))
    assert torch.equal(torch.get_rng_state(), state)
    row_uniforms(3, _gens({0: 1}), torch.device("cpu"))
    assert not torch.equal(torch.get_rng_state(), state)


def test_mixed_batch_noise_is_exp1_in_every_row() -> None:
    """Seeded and batched rows are each Exp(1): no row is transformed twice."""
    torch.manual_seed(1)
    rows, cols = 6, 20000
    q = exponential_noise(rows, cols, _gens({1: 5, 4: 6}), torch.device("cpu"))
    assert q.shape == (rows, cols) and q.dtype == torch.float32
    assert torch.isfinite(q).all() and (q > 0).all()
    for i in range(rows):
        assert stats.kstest(q[i].double().numpy(), "expon").pvalue > ALPHA, i


def test_seeded_noise_rows_reproduce_and_unlisted_generators_are_untouched() -> None:
    gens = _gens({0: 11, 2: 12})
    state = gens[2].get_state()
    q = exponential_noise(3, 100, gens, torch.device("cpu"), seeded_rows={0})
    assert torch.equal(gens[2].get_state(), state)  # row 2 has no draft tokens
    again = exponential_noise(1, 100, _gens({0: 11}), torch.device("cpu"))
    assert torch.equal(q[0], again[0])


def test_uniform_zero_gives_finite_noise(monkeypatch: pytest.MonkeyPatch) -> None:
    """uniform_ can return exactly 0: -log(0) would be inf (and 0/inf scores NaN-prone)."""
    monkeypatch.setattr(torch.Tensor, "uniform_", lambda self, *a, **k: self.zero_())
    q = exponential_noise(2, 8, _gens({1: 3}), torch.device("cpu"))
    tiny = torch.finfo(torch.float32).tiny
    assert torch.isfinite(q).all()
    assert torch.allclose(q, torch.full_like(q, -math.log(tiny)))
    u = row_uniforms(4, _gens({2: 3}), torch.device("cpu"))
    assert torch.equal(u, torch.zeros(4, 1))  # inverse transform handles U = 0 itself
