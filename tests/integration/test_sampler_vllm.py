"""Device-side sampling inside real vLLM 0.15.1 (CPU): Sampler, rejection sampler,
spec-decode helper, through the runtime patches of
vllm_kunlun/ops/sampling/sampler_patches.py.

Goodness of fit: Pearson chi-square, fails when p < ALPHA = 1e-4 (fixed seeds).
"""

from __future__ import annotations

import inspect
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from vllm.platforms import current_platform  # noqa: F401  (resolves the platform)
from vllm.v1.sample import rejection_sampler, sampler
from vllm.v1.sample.logits_processor import LogitsProcessors
from vllm.v1.sample.metadata import SamplingMetadata
from vllm.v1.sample.ops import topk_topp_sampler as upstream_topk_topp

from tests.unit.sampler_reference import (
    ALPHA,
    chi_square_pvalue,
    kept_mask,
    probs64,
    reference,
)
from vllm_kunlun.ops.sampling import sampler_patches
from vllm_kunlun.ops.sampling.topk_topp import KunlunTopKTopPSampler
from vllm_kunlun.patching.attribute import PatchMismatch
from vllm_kunlun.patching.phases import Phase

ORIGINAL = {
    "sampler": sampler.TopKTopPSampler,
    "recovered": rejection_sampler.sample_recovered_tokens,
    "rejection": rejection_sampler.rejection_sample,
}


def apply_sampling_patches() -> list[str]:
    """The sampling entries through their RUNTIME_PATCHES hooks (the model-process
    phase applies other entries too); the names applied now."""
    return [
        p.name
        for p in sampler_patches.PATCHES
        if sampler_patches.RUNTIME_PATCHES[p.name](Phase.MODEL_PROCESS)
    ]


@pytest.fixture(scope="module", autouse=True)
def installed() -> Iterator[None]:
    before = set(sampler_patches.applied())
    apply_sampling_patches()
    yield
    for patch in sampler_patches.PATCHES:
        if patch.name not in before:
            patch.revert()


@pytest.fixture
def no_exponential(monkeypatch: pytest.MonkeyPatch) -> None:
    def guard(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("Tensor.exponential_ called on a sampling path")

    monkeypatch.setattr(torch.Tensor, "exponential_", guard)


def metadata(
    batch: int,
    *,
    temperature: float | torch.Tensor = 1.0,
    top_k: torch.Tensor | None = None,
    top_p: torch.Tensor | None = None,
    generators: dict[int, torch.Generator] | None = None,
    max_num_logprobs: int | None = None,
) -> SamplingMetadata:
    if not isinstance(temperature, torch.Tensor):
        temperature = torch.full((batch,), float(temperature))
    greedy = temperature < 1e-5
    return SamplingMetadata(
        temperature=temperature,
        all_greedy=bool(greedy.all()),
        all_random=not bool(greedy.any()),
        top_p=top_p,
        top_k=top_k,
        generators=generators or {},
        max_num_logprobs=max_num_logprobs,
        no_penalties=True,
        prompt_token_ids=None,
        frequency_penalties=torch.zeros(batch),
        presence_penalties=torch.zeros(batch),
        repetition_penalties=torch.ones(batch),
        output_token_ids=[[] for _ in range(batch)],
        allowed_token_ids_mask=None,
        bad_words_token_ids={},
        logitsprocs=LogitsProcessors(),
    )


def tokens_of(out: Any) -> torch.Tensor:
    return out.sampled_token_ids.view(-1).long()


def seeded(seeds: list[int]) -> dict[int, torch.Generator]:
    return {i: torch.Generator().manual_seed(s) for i, s in enumerate(seeds)}


# ---- the patches ------------------------------------------------------------------


def test_sampler_builds_ours_and_revert_restores_vllms() -> None:
    # (the rejection kernels are their own registry entry: applied or not, by phase)
    applied = set(sampler_patches.applied()) - {sampler_patches.REJECTION_KERNELS}
    assert applied == {p.name for p in sampler_patches.PATCHES}
    assert isinstance(sampler.Sampler().topk_topp_sampler, KunlunTopKTopPSampler)
    assert apply_sampling_patches() == []  # idempotent
    patch = sampler_patches.PATCHES[0]
    patch.revert()
    try:
        built = sampler.Sampler().topk_topp_sampler
        assert type(built) is upstream_topk_topp.TopKTopPSampler
        assert sampler.TopKTopPSampler is ORIGINAL["sampler"]
    finally:
        patch.apply()
    assert rejection_sampler.sample_recovered_tokens is not ORIGINAL["recovered"]
    assert rejection_sampler.rejection_sample.__wrapped__ is ORIGINAL["rejection"]


def test_a_changed_upstream_is_named_not_patched(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    class Other:
        def forward_native(self, logits, generators, k, p, extra):  # type: ignore[no-untyped-def]
            raise NotImplementedError

    patch = sampler_patches.AttributePatch(
        "probe",
        "vllm.v1.sample.sampler",
        "TopKTopPSampler",
        lambda o: o,
        sampler_patches.PATCHES[0].check,
    )
    monkeypatch.setattr(sampler, "TopKTopPSampler", Other)
    assert patch.mismatch() == (
        "TopKTopPSampler.forward_native takes ('self', 'logits', 'generators', 'k', "
        "'p', 'extra'), expected ('self', 'logits', 'generators', 'k', 'p')"
    )
    with pytest.raises(PatchMismatch, match=r"pip install --no-deps vllm==0\.15\.1"):
        patch.apply()
    assert sampler.TopKTopPSampler is Other and not patch.applied()


def test_patches_wait_for_the_platform(monkeypatch: pytest.MonkeyPatch) -> None:
    import vllm.platforms

    for patch in (*sampler_patches.PATCHES, *sampler_patches.KERNEL_PATCHES):
        monkeypatch.setattr(patch, "_active", False)  # look unapplied
    monkeypatch.setattr(vllm.platforms, "_current_platform", None)
    assert apply_sampling_patches() == []
    assert not sampler_patches.applied()


# ---- statistics inside vLLM's Sampler ------------------------------------------------

N = 20000


def test_sampler_frequencies_with_temperature_top_k_top_p() -> None:
    row = torch.randn(300, generator=torch.Generator().manual_seed(21))
    logits = row.expand(N, -1).contiguous()
    k = torch.full((N,), 40, dtype=torch.int32)
    p = torch.full((N,), 0.9)
    out = sampler.Sampler()(logits, metadata(N, temperature=0.7, top_k=k, top_p=p))
    expected = reference(row / 0.7, 40, 0.9)
    assert chi_square_pvalue(tokens_of(out).numpy(), expected) > ALPHA


def test_mixed_batch_samples_each_row_from_its_own_distribution(
    no_exponential: None,
) -> None:
    """Seeded rows (one generator each) next to unseeded rows, different filters."""
    half = 8000
    g = torch.Generator().manual_seed(22)
    row_a = torch.randn(200, generator=g) * 2
    row_b = torch.randn(200, generator=g) * 0.3
    logits = torch.cat([row_a.expand(half, -1), row_b.expand(half, -1)]).contiguous()
    k = torch.tensor([20] * half + [200] * half, dtype=torch.int32)
    p = torch.tensor([1.0] * half + [0.8] * half)
    gens = seeded(list(range(1000, 1000 + half)))
    out = sampler.Sampler()(
        logits, metadata(2 * half, top_k=k, top_p=p, generators=gens)
    )
    tokens = tokens_of(out).numpy()
    assert chi_square_pvalue(tokens[:half], reference(row_a, 20, None)) > ALPHA
    assert chi_square_pvalue(tokens[half:], reference(row_b, None, 0.8)) > ALPHA


def test_seeded_request_repeats_whatever_shares_its_batch(no_exponential: None) -> None:
    vocab, steps = 1000, 8
    g = torch.Generator().manual_seed(23)
    mine = [torch.randn(vocab, generator=g) * 0.5 for _ in range(steps)]

    def run(seed: int, position: int, batch: int, k_mine: int, salt: int) -> list[int]:
        rng = torch.Generator().manual_seed(salt)
        gens = {position: torch.Generator().manual_seed(seed)}
        drawn = []
        for step in range(steps):
            logits = torch.randn(batch, vocab, generator=rng) * 2
            logits[position] = mine[step]
            k = torch.randint(1, vocab + 1, (batch,), generator=rng, dtype=torch.int32)
            p = torch.rand(batch, generator=rng).clamp(min=0.3)
            k[position], p[position] = k_mine, 0.9
            out = sampler.Sampler()(
                logits, metadata(batch, top_k=k, top_p=p, generators=gens)
            )
            drawn.append(int(tokens_of(out)[position]))
        return drawn

    for k_mine in (vocab, 50):  # radix path and candidate path
        first = run(1234, 0, 3, k_mine, salt=1)
        assert run(1234, 4, 6, k_mine, salt=2) == first
        assert run(1234, 1, 2, k_mine, salt=3) == first
        assert run(4321, 0, 3, k_mine, salt=1) != first


def test_greedy_rows_in_a_random_batch() -> None:
    logits = torch.randn(6, 100)
    temperature = torch.tensor([0.0, 1.0, 0.0, 0.8, 0.0, 1.2])
    out = sampler.Sampler()(logits.clone(), metadata(6, temperature=temperature))
    tokens = tokens_of(out)
    greedy = temperature == 0
    assert torch.equal(tokens[greedy], logits.argmax(-1)[greedy])


@pytest.mark.parametrize("mode", ["processed_logits", "processed_logprobs"])
def test_processed_logprob_modes_return_the_filtered_distribution(
    mode: str, no_exponential: None
) -> None:
    g = torch.Generator().manual_seed(24)
    batch, vocab = 5, 400
    logits = torch.randn(batch, vocab, generator=g)
    k = torch.tensor([10, 400, 300, 400, 1], dtype=torch.int32)
    p = torch.tensor([0.9, 0.5, 0.95, 1.0, 0.3])
    gens = seeded([7]) if mode == "processed_logits" else {}
    out = sampler.Sampler(logprobs_mode=mode)(
        logits.clone(),
        metadata(
            batch,
            temperature=0.5,
            top_k=k,
            top_p=p,
            generators=gens,
            max_num_logprobs=-1,
        ),
    )
    returned = out.logprobs_tensors.logprobs
    scaled = logits / 0.5
    tokens = tokens_of(out)
    for i in range(batch):
        keep = torch.from_numpy(kept_mask(probs64(scaled[i]), int(k[i]), float(p[i])))
        assert torch.equal(torch.isfinite(returned[i]), keep)
        expected = scaled[i].masked_fill(~keep, float("-inf"))
        if mode == "processed_logprobs":
            expected = expected.log_softmax(-1)
        assert torch.allclose(returned[i][keep], expected[keep], atol=1e-5)
        assert keep[tokens[i]]


# ---- apply_top_k_top_p: vLLM's contract ---------------------------------------------


def test_apply_top_k_top_p_has_vllms_signature() -> None:
    ours = KunlunTopKTopPSampler().apply_top_k_top_p
    theirs = upstream_topk_topp.TopKTopPSampler().apply_top_k_top_p

    def params(fn: Any) -> list[tuple[str, Any, Any]]:
        sig = inspect.signature(fn)
        return [(q.name, q.kind, q.default) for q in sig.parameters.values()]

    assert params(ours) == params(theirs) != []
    logits = torch.randn(3, 50)
    k = torch.tensor([5, 50, 1])
    out = ours(logits=logits.clone(), k=k, p=None)  # vLLM's keywords
    assert torch.isfinite(out).sum(-1).tolist() == [5, 50, 1]


def test_apply_top_k_top_p_keeps_what_vllm_keeps() -> None:
    """Row by row the same kept set as vLLM's own sort-based apply_top_k_top_p
    (random logits without ties), also for k / p tensors of a single value.

    A single p broadcasts in vLLM too. A single k is compared with vLLM given that k
    for every row: vLLM's own code gathers row 0's k-th value from a (1,) k and uses it
    as every row's threshold, which is not "k for every row".
    """
    g = torch.Generator().manual_seed(31)
    batch, vocab = 16, 600
    logits = torch.randn(batch, vocab, generator=g) * (
        torch.rand(batch, 1, generator=g) * 3 + 0.2
    )
    k = torch.randint(1, vocab + 1, (batch,), generator=g)
    p = torch.rand(batch, generator=g) * 0.9 + 0.05
    ours = KunlunTopKTopPSampler().apply_top_k_top_p
    cases = [
        (k, p),
        (k, None),
        (None, p),
        (torch.tensor([37]), None),
        (None, torch.tensor([0.6])),
        (torch.tensor([200]), torch.tensor([0.7])),
    ]
    for kk, pp in cases:
        k_rows = None if kk is None else kk.expand(batch)
        theirs = upstream_topk_topp.apply_top_k_top_p(logits.clone(), k_rows, pp)
        got = ours(logits.clone(), kk, pp)
        assert torch.equal(torch.isfinite(got), torch.isfinite(theirs)), (kk, pp)
        assert torch.equal(got[torch.isfinite(got)], logits[torch.isfinite(got)])


# ---- the vendor kernel through the fake -------------------------------------------


@pytest.fixture
def vendor_fake(fake_vendor_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.setenv("VLLM_KUNLUN_SAMPLER", "vendor")
    import kunlun_ops

    kunlun_ops.reset()
    return kunlun_ops


def test_sampler_calls_the_vendor_kernel_for_every_unseeded_batch(
    vendor_fake: Any, no_exponential: None
) -> None:
    s = sampler.Sampler()
    # Flat logits: argmax equals the kernel's draw in all four rows with probability
    # ~(1/64)^4, so a sampler answering greedily instead of passing the draw on fails.
    logits = torch.randn(4, 64, generator=torch.Generator().manual_seed(8)) * 0.1
    out = s(logits.clone(), metadata(4))  # no top-k, no top-p
    assert len(vendor_fake.CALLS) == 1
    call = vendor_fake.CALLS[0]
    assert call.name == "top_k_top_p_sampling_from_probs"
    assert call.tensors["top_k"].dtype == torch.int32
    assert call.tensors["top_k"].tolist() == [64] * 4
    assert call.tensors["top_p"].dtype == torch.float32
    assert call.tensors["top_p"].tolist() == [1.0] * 4
    assert call.contiguous["probs"] and call.tensors["probs"].dtype == torch.float32
    assert torch.allclose(call.tensors["probs"], logits.softmax(-1))
    assert torch.equal(tokens_of(out), call.out.long())  # the kernel's draw

    k = torch.tensor([5, 64, 2, 64], dtype=torch.int32)
    s(logits.clone(), metadata(4, temperature=0.5, top_k=k))
    assert vendor_fake.CALLS[1].tensors["top_k"].tolist() == [5, 64, 2, 64]
    assert torch.allclose(
        vendor_fake.CALLS[1].tensors["probs"], (logits / 0.5).softmax(-1)
    )

    s(logits.clone(), metadata(4, generators=seeded([3])))  # seeded: portable path
    assert len(vendor_fake.CALLS) == 2


def test_processed_mode_masks_then_calls_the_kernel_unfiltered(
    vendor_fake: Any,
) -> None:
    logits = torch.randn(3, 50)
    k = torch.tensor([3, 50, 10], dtype=torch.int32)
    sampler.Sampler(logprobs_mode="processed_logprobs")(
        logits.clone(), metadata(3, top_k=k, max_num_logprobs=-1)
    )
    (call,) = vendor_fake.CALLS
    assert call.tensors["top_k"].tolist() == [50, 50, 50]
    assert call.tensors["top_p"].tolist() == [1.0, 1.0, 1.0]
    kept = call.tensors["probs"] > 0
    assert kept.sum(-1).tolist() == [3, 50, 10]


# ---- nothing calls exponential_ -----------------------------------------------------


def _spec_inputs(batch: int, vocab: int, seed: int) -> dict[str, Any]:
    g = torch.Generator().manual_seed(seed)
    target = torch.randn(batch, vocab, generator=g).softmax(-1)
    draft = torch.randn(batch, vocab, generator=g).softmax(-1)
    return {
        "max_spec_len": 1,
        "num_draft_tokens": [1] * batch,
        "cu_num_draft_tokens": torch.arange(1, batch + 1, dtype=torch.int32),
        "draft_token_ids": torch.randint(
            0, vocab, (batch,), generator=g, dtype=torch.int32
        ),
        "target_probs": target,
        "draft_probs": draft,
    }


def test_no_exponential_on_any_sampling_path(no_exponential: None) -> None:
    batch, vocab = 6, 300
    logits = torch.randn(batch, vocab)
    k = torch.tensor([5, 300, 200, 300, 50, 1], dtype=torch.int32)
    p = torch.tensor([1.0, 0.9, 0.95, 1.0, 0.5, 1.0])
    for mode in ("raw_logprobs", "processed_logits", "processed_logprobs"):
        s = sampler.Sampler(logprobs_mode=mode)
        for md in (
            metadata(batch),
            metadata(batch, top_k=k, top_p=p),
            metadata(batch, top_p=p, generators=seeded([1, 2, 3, 4, 5, 6])),
            metadata(batch, top_k=k, generators={2: torch.Generator().manual_seed(9)}),
            metadata(batch, temperature=torch.tensor([0.0, 1, 0, 1, 1, 0.5])),
        ):
            s(logits.clone(), md)
    md = metadata(batch, generators={0: torch.Generator().manual_seed(1)})
    for draft_probs in (True, False):
        inputs = _spec_inputs(batch, vocab, seed=25)
        if not draft_probs:
            inputs["draft_probs"] = None
        rejection_sampler.generate_uniform_probs(
            batch, [1] * batch, md.generators, "cpu"
        )
        out = rejection_sampler.sample_recovered_tokens(
            sampling_metadata=md, device=torch.device("cpu"), **inputs
        )
        assert out.shape == (batch,)


def test_the_guard_catches_vllms_own_paths(no_exponential: None) -> None:
    """Negative control: without the patches the same calls hit exponential_."""
    native = upstream_topk_topp.TopKTopPSampler()
    with pytest.raises(AssertionError, match="exponential_"):
        native.forward_native(torch.randn(2, 10), {}, None, None)
    inputs = _spec_inputs(2, 10, seed=26)
    with pytest.raises(AssertionError, match="exponential_"):
        ORIGINAL["recovered"](
            sampling_metadata=metadata(2), device=torch.device("cpu"), **inputs
        )


# ---- distributions of the spec-decode helpers --------------------------------------


@pytest.mark.parametrize("with_draft_probs", [True, False])
def test_recovered_tokens_follow_the_residual_distribution(
    with_draft_probs: bool,
) -> None:
    vocab = 60
    g = torch.Generator().manual_seed(27)
    target = torch.randn(vocab, generator=g).softmax(-1)
    draft = torch.randn(vocab, generator=g).softmax(-1)
    draft_token = 7
    inputs = {
        "max_spec_len": 1,
        "num_draft_tokens": [1] * N,
        "cu_num_draft_tokens": torch.arange(1, N + 1, dtype=torch.int32),
        "draft_token_ids": torch.full((N,), draft_token, dtype=torch.int32),
        "target_probs": target.expand(N, -1).contiguous(),
        "draft_probs": draft.expand(N, -1).contiguous() if with_draft_probs else None,
    }
    torch.manual_seed(28)
    out = rejection_sampler.sample_recovered_tokens(
        sampling_metadata=metadata(N), device=torch.device("cpu"), **inputs
    )
    if with_draft_probs:
        residual = (target - draft).clamp(min=0).double().numpy()
    else:
        residual = target.double().numpy().copy()
        residual[draft_token] = 0.0
    residual /= residual.sum()
    assert chi_square_pvalue(out.long().numpy(), residual) > ALPHA


def test_sampler_benchmark_runs_every_mode_small() -> None:
    """benchmarks/sampler.py end to end on a tiny batch: every mode, ours and native."""
    from tests.bench_module import load_benchmark

    bench = load_benchmark("sampler")
    args = bench.parse_args(["--batch", "4", "--vocab", "300", "--iters", "1"])
    report = bench.run(args)
    assert [r["mode"] for r in report["results"]] == [m[0] for m in bench.MODES]
    for r in report["results"]:
        assert r["ours_ms"] > 0 and r["native_ms"] > 0 and r["read_ms"] > 0
        assert r["ours_cpu_ms"] >= 0 and "ours_cpu_reads" in r
    assert "x one read" in bench.markdown(report)
