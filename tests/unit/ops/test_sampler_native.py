"""The native CPU sampler (torch.ops.vllm_kunlun.sample_rows, csrc/sampling_cpu.cpp).

Judged like the portable kernel (tests/unit/ops/test_sampler_portable.py): N draws of one
row (an expanded row, no copy) against the independent float64 reference
(tests/unit/sampler_reference.py) by Pearson's chi-square, failing at p < ALPHA = 1e-4,
and never a token outside the reference's kept set. Every setting runs three ways: as
shipped, with ``max_tries=0`` (every draw by the exact inverse transform instead of
rejection) and with ``rounds=0`` (a rejected top-p token goes straight to the exact
threshold), so the fallbacks are proven, not just present.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest
import torch

from tests.unit.sampler_reference import (
    ALPHA,
    binned_chi_square_pvalue,
    chi_square_pvalue,
    kept_mask,
    probs64,
    reference,
)
from vllm_kunlun.ops.sampling import native_cpu as native
from vllm_kunlun.ops.sampling import portable as sp

pytestmark = pytest.mark.skipif(
    not native.available()[0],
    reason="native extension not built (VLLM_KUNLUN_BUILD_EXT=0)",
)

N = 20000


@pytest.fixture(params=["auto", "scalar"])
def isa(request: pytest.FixtureRequest) -> Iterator[str]:
    """Both kernel sets: the vector kernels (AVX2 where the CPU has them) and the
    portable C++ ones that CPUs without AVX2 run."""
    got = native.isa(request.param)
    assert got == "scalar" or request.param == "auto"
    yield got
    native.isa("auto")


WAYS = {
    "shipped": {},
    "exact-draws": {"max_tries": 0},
    "no-rounds": {"rounds": 0},
}


def _row(vocab: int, scale: float, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(vocab, generator=g) * scale


def _draw(
    row: torch.Tensor,
    k: int | None,
    p: float | None,
    n: int = N,
    seed: int = 1,
    **options: int,
) -> np.ndarray:
    g = torch.Generator().manual_seed(seed)
    tokens = native.sample(
        row.expand(n, -1), k, p, torch.rand(n, sp.DRAWS, generator=g), **options
    )
    assert tokens.dtype == torch.int64 and tokens.shape == (n,)
    return tokens.numpy()


# (id, vocab, logit scale, top_k, top_p). Blocks are 64 tokens. A top-k of at most a
# quarter of the blocks is bounded by the block maxima (vocab 5000: 79 blocks, k <= 19),
# a larger one by a sampled quantile (vocab 700: 11 blocks).
SETTINGS = [
    ("unfiltered", 40, 1.5, None, None),
    ("unfiltered-partial-block", 1300, 1.0, None, None),
    ("unfiltered-peaked", 5000, 6.0, None, None),
    ("top_k-block-bound", 5000, 1.0, 15, None),
    ("top_k-sampled-bound", 700, 0.5, 300, None),
    ("top_k-top_p-block-bound", 5000, 2.0, 12, 0.8),
    ("top_k-top_p-sampled-bound", 700, 0.5, 400, 0.95),
    ("top_p-flat", 600, 0.3, None, 0.9),
    ("top_p-peaked", 300, 3.0, None, 0.7),
    ("top_p-small-on-flat", 600, 0.2, None, 0.15),
    ("top_p-vocab-5000", 5000, 1.0, None, 0.9),
    ("top_p-partial-block", 129, 2.0, None, 0.5),
    ("top_k-under-one-block", 50, 1.0, 10, None),
]


@pytest.mark.parametrize("way", list(WAYS))
@pytest.mark.parametrize(
    "vocab,scale,k,p", [s[1:] for s in SETTINGS], ids=[s[0] for s in SETTINGS]
)
def test_frequencies_match_filtered_distribution(
    vocab: int, scale: float, k: int | None, p: float | None, way: str, isa: str
) -> None:
    row = _row(vocab, scale, seed=vocab + int(scale * 10))
    samples = _draw(row, k, p, **WAYS[way])
    assert chi_square_pvalue(samples, reference(row, k, p)) > ALPHA


def test_a_test_of_the_wrong_distribution_fails() -> None:
    """Power check: the same draws against the unfiltered reference are rejected."""
    row = _row(600, 0.3, seed=2)
    samples = _draw(row, None, 0.5)
    assert chi_square_pvalue(samples, reference(row, None, 0.5)) > ALPHA
    with pytest.raises(AssertionError, match="outside the kept set"):
        chi_square_pvalue(samples, reference(row, None, 0.3))


def test_low_temperature_logits_keep_their_precision(isa: str) -> None:
    """Logits in the thousands (temperature 0.001): masses are computed on x - max."""
    row = _row(3000, 1.0, seed=3) * 1000 / 40 + 2000
    for k, p in ((None, None), (None, 0.9), (20, 0.95)):
        samples = _draw(row, k, p)
        assert chi_square_pvalue(samples, reference(row, k, p)) > ALPHA


def test_kept_sets_equal_the_reference_in_mixed_batches(isa: str) -> None:
    """Every draw of mixed rows lies in its row's reference kept set, and a row's token
    does not depend on the rows around it or the thread count."""
    g = torch.Generator().manual_seed(4)
    vocab, batch = 700, 64
    logits = torch.randn(batch, vocab, generator=g) * (
        torch.rand(batch, 1, generator=g) * 3 + 0.1
    )
    k = torch.randint(-1, vocab + 3, (batch,), generator=g)
    p = torch.rand(batch, generator=g) * 1.2
    keep = np.stack(
        [
            kept_mask(probs64(logits[i]), int(k[i]) if k[i] > 0 else None, float(p[i]))
            for i in range(batch)
        ]
    )
    threads = torch.get_num_threads()
    try:
        for trial in range(40):
            u = torch.rand(batch, sp.DRAWS, generator=g)
            torch.set_num_threads(1 + trial % 2)
            tokens = native.sample(logits, k, p, u)
            assert keep[np.arange(batch), tokens.numpy()].all()
            if trial % 8 == 0:
                for i in range(0, batch, 7):
                    alone = native.sample(
                        logits[i : i + 1], k[i : i + 1], p[i : i + 1], u[i : i + 1]
                    )
                    assert int(alone) == int(tokens[i])
    finally:
        torch.set_num_threads(threads)


def test_same_uniforms_same_tokens_and_logits_untouched() -> None:
    g = torch.Generator().manual_seed(5)
    logits = torch.randn(32, 2000, generator=g)
    before = logits.clone()
    u = torch.rand(32, sp.DRAWS, generator=g)
    first = native.sample(logits, 40, 0.9, u)
    assert torch.equal(native.sample(logits, 40, 0.9, u), first)
    assert torch.equal(logits, before)
    other = native.sample(logits, 40, 0.9, torch.rand(32, sp.DRAWS, generator=g))
    assert not torch.equal(other, first)


def test_peaked_rows_return_their_mode_and_top_p_zero_is_greedy(isa: str) -> None:
    g = torch.Generator().manual_seed(6)
    logits = torch.randn(16, 1000, generator=g)
    mode = torch.randint(0, 1000, (16,), generator=g)
    logits[torch.arange(16), mode] = 40.0
    for k, p in [(None, None), (50, None), (None, 0.9), (500, 0.99)]:
        assert torch.equal(native.sample(logits, k, p, torch.rand(16, 4)), mode)
    flat = torch.randn(32, 400, generator=g) * 0.05
    for top_p in (1e-7, 0.0):
        got = native.sample(flat, None, top_p, torch.rand(32, sp.DRAWS))
        assert torch.equal(got, flat.argmax(-1))


def test_minus_inf_logits_are_never_drawn(isa: str) -> None:
    g = torch.Generator().manual_seed(9)
    logits = torch.randn(4000, 300, generator=g)
    banned = torch.rand(4000, 300, generator=g) < 0.5
    logits[banned] = float("-inf")
    for k, p in [(None, None), (200, None), (None, 0.95), (5, 0.5)]:
        for way in WAYS.values():
            tokens = native.sample(
                logits, k, p, torch.rand(4000, 4, generator=g), **way
            )
            assert not banned[torch.arange(4000), tokens].any()


def test_rows_without_a_distribution_yield_token_0_and_leave_others_alone(
    isa: str,
) -> None:
    g = torch.Generator().manual_seed(10)
    logits = torch.randn(7, 300, generator=g)
    u = torch.rand(7, sp.DRAWS, generator=g)
    bad = logits.clone()
    bad[1, 17] = float("nan")
    bad[3] = float("-inf")
    bad[4] = float("nan")
    bad[6, 250] = float("inf")
    for k, p in [(None, None), (20, None), (None, 0.9), (200, 0.99)]:
        clean = native.sample(logits, k, p, u)
        got = native.sample(bad, k, p, u)
        assert got[[1, 3, 4, 6]].tolist() == [0, 0, 0, 0]
        assert torch.equal(got[[0, 2, 5]], clean[[0, 2, 5]])


def test_disabled_filters_equal_the_unfiltered_draw() -> None:
    logits = torch.randn(40, 300, generator=torch.Generator().manual_seed(8))
    u = torch.rand(40, sp.DRAWS)
    plain = native.sample(logits, None, None, u)
    for k, p in ((300, None), (301, None), (0, None), (-1, 1.0), (None, 1.5)):
        assert torch.equal(native.sample(logits, k, p, u), plain)


def test_the_kernel_set_can_be_chosen_and_is_reported() -> None:
    assert native.isa() in ("avx2", "scalar")
    try:
        assert native.isa("scalar") == "scalar" and native.isa() == "scalar"
        assert "(scalar kernels)" in native.available()[1]
    finally:
        native.isa("auto")
    with pytest.raises(RuntimeError, match="force must be 'scalar' or 'auto'"):
        native.isa("avx512")


def test_shapes_broadcasting_and_errors() -> None:
    assert native.sample(torch.randn(5, 1), 3, 0.5, torch.rand(5)).eq(0).all()
    empty = native.sample(torch.randn(0, 10), None, 0.5, torch.rand(0))
    assert empty.shape == (0,) and empty.dtype == torch.int64
    logits = torch.randn(6, 500)
    u = torch.rand(6, sp.DRAWS)
    one = native.sample(logits, torch.tensor([30]), torch.tensor([0.8]), u)
    assert torch.equal(one, native.sample(logits, torch.full((6,), 30), 0.8, u))
    # A strided view is copied; a slice with contiguous rows is read in place.
    wide = torch.randn(6, 1000)
    assert torch.equal(
        native.sample(wide[:, ::2], 7, None, u),
        native.sample(wide[:, ::2].contiguous(), 7, None, u),
    )
    assert torch.equal(
        native.sample(wide[:, :500], 7, None, u),
        native.sample(wide[:, :500].contiguous(), 7, None, u),
    )
    with pytest.raises(ValueError, match="2-D"):
        native.sample(torch.randn(10), None, None, torch.rand(1))
    with pytest.raises(ValueError, match="uniforms has shape"):
        native.sample(logits, None, None, torch.rand(5))
    with pytest.raises(ValueError, match="runs on the CPU"):
        native.sample(torch.empty(2, 3, device="meta"), None, None, torch.rand(2))
    with pytest.raises(ValueError, match="top_k has shape"):
        native.sample(logits, torch.ones(4, dtype=torch.int64), None, u)
    with pytest.raises(RuntimeError, match="float32 CPU tensor"):
        torch.ops.vllm_kunlun.sample_rows(logits.double(), None, None, u, 8, 2)


# ---- vocabulary 128K: the main paths at full scale --------------------------------

BIG = 128256


@pytest.mark.parametrize(
    "k,p,scale",
    [
        (None, None, 1.0),
        (50, None, 1.0),
        (None, 0.9, 1.0),
        (None, 0.5, 2.0),
        (None, 0.95, 5.0),
        (50, 0.9, 1.0),
        (3000, None, 1.0),
    ],
    ids=[
        "unfiltered",
        "top_k-50",
        "top_p-0.9",
        "top_p-0.5",
        "top_p-peaked",
        "top_k-top_p",
        "top_k-3000",
    ],
)
def test_vocab_128k_draws_fit_the_filtered_distribution(
    k: int | None, p: float | None, scale: float
) -> None:
    """20000 draws of one 128K row: binned chi-square (40 cells of equal expected
    mass) and never a masked token."""
    row = torch.randn(BIG, generator=torch.Generator().manual_seed(17)) * scale
    samples = _draw(row, k, p, seed=18)
    assert binned_chi_square_pvalue(samples, reference(row, k, p)) > ALPHA
