"""Is what an engine sampled distributed as transformers' softmax of the same logits?

The seeded-sampling e2e tests check that a seed repeats its draws in any batch; that
says nothing about whether the draws follow the model's distribution (a sampler that
keeps every speculative draft, or samples at the wrong temperature, repeats just as
well). This helper backs them with an independent reference.

How: a job of many seeded requests at one temperature (``distribution_job``); after the
engine, ``e2e_runner.py`` (spec key ``"distribution"``) runs transformers' model in
float32 teacher-forced over each prompt + its sampled tokens and turns every sampled
token into its randomized probability integral transform: with the reference's tempered
distribution p sorted by decreasing probability, ``u = P(tokens before t) + V * p(t)``
(``V`` uniform from a fixed generator). For an exact sampler each ``u`` is uniform on
[0, 1) and independent of the tokens before it, whatever the vocabulary or the
distribution, so the ``u`` of all sampled tokens pooled pass a chi-square test of
uniformity over ten equal bins (``assert_follows_reference``). A sampler biased to the
likely tokens (drafts kept too often, a lower temperature) piles ``u`` into the first
bins; one biased to unlikely tokens, into the last.
A helpers module (no tests); the runner imports it by name next to it.
"""

from __future__ import annotations

from typing import Any

BINS = 10
# The chi-square distribution with 9 degrees of freedom exceeds 27.88 with probability
# 0.001: a correct sampler fails one seeded run in a thousand. The draws are seeded, so
# a run that passes keeps passing.
CHI2_9_P001 = 27.88
TEMPERATURE = 1.0


def distribution_job(
    prompts: list[str],
    requests: int = 32,
    max_tokens: int = 6,
    temperature: float = TEMPERATURE,
    name: str = "distribution",
) -> dict[str, Any]:
    """``requests`` seeded requests cycling over ``prompts``, in one batch: at least
    ``requests * max_tokens`` sampled tokens (192 by default, ~19 per bin)."""
    return {
        "name": name,
        "temperature": temperature,
        "requests": [
            {
                "prompt": prompts[i % len(prompts)],
                "max_tokens": max_tokens,
                "sampling": {"temperature": temperature, "seed": 1000 + i},
            }
            for i in range(requests)
        ],
    }


def reference_pit(spec: dict[str, Any], result: dict[str, Any]) -> dict[str, Any]:
    """For each job named in ``spec["distribution"]``, the ``u`` of every token the
    engine sampled, from transformers' float32 model on ``spec["model"]``."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(spec["model"], dtype=torch.float32)
    model.eval()
    jitter = torch.Generator().manual_seed(0)
    temperature = {j["name"]: j.get("temperature", 1.0) for j in spec["jobs"]}
    out: dict[str, Any] = {}
    for name in spec["distribution"]:
        us: list[float] = []
        for row in result["jobs"][name]:
            prompt, tokens = row["prompt_token_ids"], row["token_ids"]
            with torch.no_grad():
                logits = model(torch.tensor([prompt + tokens])).logits[0].double()
            steps = logits[len(prompt) - 1 : len(prompt) - 1 + len(tokens)]
            probs = (steps / temperature[name]).softmax(-1)
            for p, token in zip(probs, tokens, strict=True):
                order = torch.argsort(-p, stable=True)
                rank = int((order == token).nonzero()[0, 0])
                before = float(p[order[:rank]].sum())
                v = float(torch.rand((), generator=jitter, dtype=torch.float64))
                us.append(before + v * float(p[token]))
        out[name] = us
    return out


def chi_square_uniform(us: list[float], bins: int = BINS) -> tuple[float, list[int]]:
    """Pearson's statistic of ``us`` against the uniform law over ``bins`` equal
    bins, and the bin counts."""
    counts = [0] * bins
    for u in us:
        counts[min(int(u * bins), bins - 1)] += 1
    expected = len(us) / bins
    return sum((c - expected) ** 2 / expected for c in counts), counts


def assert_follows_reference(run: dict[str, Any], name: str = "distribution") -> None:
    """The sampled tokens of job ``name`` pass the uniformity test against the
    reference (see the module docstring)."""
    us = run["distribution"][name]
    assert len(us) >= 10 * BINS, len(us)
    stat, counts = chi_square_uniform(us)
    assert stat < CHI2_9_P001, (
        f"sampled tokens do not follow transformers' distribution: chi-square "
        f"{stat:.1f} >= {CHI2_9_P001} over {len(us)} tokens, bins {counts} "
        "(low bins: the likely tokens too often; high bins: the unlikely ones)"
    )
