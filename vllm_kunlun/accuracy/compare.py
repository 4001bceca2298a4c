"""The numbers and the verdict: the server's teacher-forced logprobs against the
reference's, position by position.

Per prompt: the token ids must be equal (else nothing below is comparable); top-1
agreement, the fraction of positions where the server's rank-1 token is the
reference's argmax; and the absolute gap between the two logprobs of the actual next
token, its largest and its mean. The verdict applies the thresholds of the served
precision to all positions of all prompts together (agreement, mean gap) and to every
single position (largest gap). docs/accuracy.md says why these thresholds.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from vllm_kunlun.accuracy.endpoint import ServedConfig, ServerPrompt
from vllm_kunlun.accuracy.reference import ReferencePrompt


@dataclass(frozen=True)
class Thresholds:
    min_agreement: float
    max_gap: float  # at any position, nats
    max_mean_gap: float  # over all positions, nats


THRESHOLDS: dict[str, Thresholds] = {
    # Same math in float32 on both sides: only summation order differs (~1e-6).
    "float32": Thresholds(min_agreement=0.99, max_gap=1e-2, max_mean_gap=1e-3),
    # fp16 keeps 11 significant bits; its noise reaches ~0.1 nats at a few positions.
    "float16": Thresholds(min_agreement=0.95, max_gap=0.5, max_mean_gap=0.02),
    # bf16 keeps 8: ~8x fp16's rounding. A correct tiny hybrid measured a 0.047 mean
    # (GDN's recurrent state accumulates it), so the mean allows 0.1; a broken weight
    # is at 0.45 (docs/accuracy.md).
    "bfloat16": Thresholds(min_agreement=0.90, max_gap=1.0, max_mean_gap=0.1),
    # int8 activations (absmax/127 in vLLM, /127.5 in compressed-tensors' fake
    # quantization) round differently on top of the float dtype's noise.
    "w8a8": Thresholds(min_agreement=0.85, max_gap=2.0, max_mean_gap=0.15),
}


def thresholds_for(dtype: str, quant: str) -> tuple[str, Thresholds]:
    """The served precision's key and thresholds (W8A8 dominates the float dtype)."""
    key = "w8a8" if quant == "w8a8" else dtype
    return key, THRESHOLDS[key]


# vLLM's quantization method of the checkpoints the reference knows, by ours.
SERVED_QUANT = {"compressed-tensors": "w8a8", None: "none"}
_QUANT_WORDS = {
    "w8a8": "a compressed-tensors W8A8 checkpoint",
    "none": "an unquantized checkpoint",
}


class ServedMismatch(ValueError):
    """The server computes with another precision than the checkpoint's (exit 1)."""


class DtypeConflict(ValueError):
    """--dtype contradicts what the server reports (exit 2)."""


def served_precision(
    served: ServedConfig,
    checkpoint_quant: str,
    checkpoint_dtype: str,
    dtype_flag: str,
    model_dir: str,
    name: str,
) -> tuple[str, str]:
    """(dtype, quantization) to judge by: what the server reports, when it reports it;
    the checkpoint's (and ``--dtype``) otherwise. ServedMismatch when the server
    serves another quantization than the checkpoint's, naming both."""
    if not served.known:
        dtype = checkpoint_dtype if dtype_flag == "auto" else dtype_flag
        return dtype, checkpoint_quant
    quant = SERVED_QUANT.get(served.quantization, str(served.quantization))
    if quant != checkpoint_quant:
        how = (
            f"quantized with {served.quantization}"
            if served.quantization
            else "unquantized"
        )
        loaded = f" (it loaded {served.model})" if served.model else ""
        raise ServedMismatch(
            f"the server serves {name!r} {how} in {served.dtype}{loaded}, but --model "
            f"{model_dir} is {_QUANT_WORDS.get(checkpoint_quant, checkpoint_quant)}: "
            "it does not serve this checkpoint. Start the server on this checkpoint, "
            "or give --model the directory it serves"
        )
    if served.dtype not in THRESHOLDS:
        raise DtypeConflict(
            f"the server reports it computes in {served.dtype} ({served.source}): "
            f"no thresholds for it (known: {', '.join(t for t in THRESHOLDS if t != 'w8a8')})"
        )
    if dtype_flag not in ("auto", served.dtype):
        raise DtypeConflict(
            f"--dtype {dtype_flag}, but the server reports it computes in "
            f"{served.dtype} ({served.source}); leave --dtype at auto"
        )
    return str(served.dtype), quant


class TokenizationMismatch(ValueError):
    """The server tokenized a prompt differently from the checkpoint's tokenizer."""


@dataclass(frozen=True)
class PromptResult:
    prompt: str
    tokens: int
    positions: int
    agreement: float
    max_gap: float
    mean_gap: float
    worst_position: int  # the prompt token index t of the largest gap
    worst_token: int
    server_logprob: float
    reference_logprob: float
    disagreements: list[dict[str, Any]] = field(default_factory=list)


def check_tokens(prompt: str, server: Sequence[int], reference: Sequence[int]) -> None:
    """TokenizationMismatch naming the first differing position."""
    if list(server) == list(reference):
        return
    n = next(
        (i for i, (a, b) in enumerate(zip(server, reference, strict=False)) if a != b),
        min(len(server), len(reference)),
    )
    raise TokenizationMismatch(
        f"prompt {prompt!r}: the server's token ids differ from the checkpoint "
        f"tokenizer's at position {n} (server {list(server)[n : n + 5]}, "
        f"reference {list(reference)[n : n + 5]}; {len(server)} vs {len(reference)} "
        "tokens): the server serves another tokenizer than --model's, or --model is "
        "not the served checkpoint"
    )


def _gap(a: float, b: float) -> float:
    if a == b:  # both -inf included
        return 0.0
    return abs(a - b) if math.isfinite(a) and math.isfinite(b) else math.inf


def compare_prompt(
    prompt: str,
    server: ServerPrompt,
    reference_ids: Sequence[int],
    ref: ReferencePrompt,
) -> PromptResult:
    """One prompt's agreement and gaps; TokenizationMismatch first."""
    check_tokens(prompt, server.token_ids, reference_ids)
    n = len(server.positions)
    if n == 0 or len(ref.logprob) != n:
        raise ValueError(
            f"prompt {prompt!r}: {n} server vs {len(ref.logprob)} positions"
        )
    gaps = [
        _gap(s.logprob, r) for s, r in zip(server.positions, ref.logprob, strict=True)
    ]
    agree = 0
    disagreements = []
    for i, s in enumerate(server.positions):
        if s.top1_id == ref.argmax[i]:
            agree += 1
        else:
            disagreements.append(
                {
                    "position": i + 1,
                    "server_top1": s.top1_id,
                    "reference_top1": ref.argmax[i],
                    # How close to a tie the reference had them: >= 0, in nats.
                    "reference_margin": ref.argmax_logprob[i] - ref.at_server_top1[i],
                }
            )
    worst = max(range(n), key=lambda i: gaps[i])
    return PromptResult(
        prompt=prompt,
        tokens=len(server.token_ids),
        positions=n,
        agreement=agree / n,
        max_gap=gaps[worst],
        mean_gap=sum(gaps) / n,
        worst_position=worst + 1,
        worst_token=server.token_ids[worst + 1],
        server_logprob=server.positions[worst].logprob,
        reference_logprob=ref.logprob[worst],
        disagreements=disagreements,
    )


@dataclass(frozen=True)
class Verdict:
    passed: bool
    precision: str
    thresholds: Thresholds
    agreement: float
    max_gap: float
    mean_gap: float
    worst_prompt: str
    failures: list[str]


def judge(results: Sequence[PromptResult], precision: str, th: Thresholds) -> Verdict:
    """Pass when every threshold holds over all positions of all prompts."""
    total = sum(r.positions for r in results)
    agreement = sum(r.agreement * r.positions for r in results) / total
    mean_gap = sum(r.mean_gap * r.positions for r in results) / total
    worst = max(results, key=lambda r: r.max_gap)
    failures = []
    if agreement < th.min_agreement:
        failures.append(
            f"top-1 agreement {agreement:.4f} < {th.min_agreement} ({precision})"
        )
    if not worst.max_gap <= th.max_gap:
        failures.append(
            f"largest logprob gap {worst.max_gap:.3g} > {th.max_gap:g} ({precision}), "
            f"prompt {worst.prompt!r} position {worst.worst_position}"
        )
    if not mean_gap <= th.max_mean_gap:
        failures.append(
            f"mean logprob gap {mean_gap:.3g} > {th.max_mean_gap:g} ({precision})"
        )
    return Verdict(
        passed=not failures,
        precision=precision,
        thresholds=th,
        agreement=agreement,
        max_gap=worst.max_gap,
        mean_gap=mean_gap,
        worst_prompt=worst.prompt,
        failures=failures,
    )


def _finite(x: Any) -> Any:
    """JSON has no infinity: an infinite gap is written as a string."""
    if isinstance(x, float) and not math.isfinite(x):
        return str(x)
    if isinstance(x, dict):
        return {k: _finite(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_finite(v) for v in x]
    return x


def report(verdict: Verdict, results: Sequence[PromptResult], **extra: Any) -> dict:
    """The JSON document ``--json`` prints."""
    return _finite(
        {
            "passed": verdict.passed,
            **extra,
            "precision": verdict.precision,
            "thresholds": asdict(verdict.thresholds),
            "agreement": verdict.agreement,
            "max_gap": verdict.max_gap,
            "mean_gap": verdict.mean_gap,
            "worst_prompt": verdict.worst_prompt,
            "failures": verdict.failures,
            "prompts": [asdict(r) for r in results],
        }
    )
