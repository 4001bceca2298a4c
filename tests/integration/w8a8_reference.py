"""References for the W8A8 end-to-end tests, run by e2e_runner after the engine jobs.

- ``float64``: transformers' own Qwen3 modeling code in float64, every quantized linear
  layer computing on the checkpoint's int8 weights times their scales, on activations
  quantized per token as vLLM's kernels do (at tensor parallel > 1, a row-parallel
  layer's input per rank slice, as each rank quantizes it) (``absmax / 127``, round half to even,
  saturate; the quantizer itself in float32, as the engine's). Same quantization as
  the engine: its greedy tokens equal the engine's, its logprobs match to ~1e-6 except
  where float noise moves one activation across a rounding boundary.
- ``transformers``: transformers' loading of the compressed-tensors checkpoint itself
  (``CompressedLinear``: weights dequantized, activations fake-quantized by
  compressed-tensors with ``absmax / 127.5``). Another rounding, so compared by
  teacher-forced logprobs with a tolerance, and by tokens only where its top-2 margin
  is clear.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

# Same-quantization reference vs the engine: logprobs agree to ~3e-6 (measured). Float
# noise upstream of a quantizer could still move one activation across an int8 rounding
# boundary (one quantum of one element), which in a 64-wide model moves a logprob by
# up to ~0.06 nats (measured on the reference run in float32 vs float64), so most steps
# must agree to 1e-4 and every step to 0.1.
SAME_QUANT_TYPICAL = 1e-4
SAME_QUANT_FLIP = 0.1

Row = tuple[dict[str, Any], list[int], dict[str, Any]]
"""An engine row, the reference's greedy tokens, its teacher-forced record."""


def assert_greedy_matches(rows: list[Row], misses: int = 1) -> None:
    """Token for token, up to near-ties: where a sequence parts from the reference, the
    reference's own top-2 margin at that step is within what float noise can move (every
    earlier token equal); at most ``misses`` sequences part at all."""
    exact = 0
    for got, want, ref in rows:
        tokens = got["token_ids"]
        if tokens == want:
            exact += 1
            continue
        step = next(
            i for i, (a, b) in enumerate(zip(tokens, want, strict=True)) if a != b
        )
        assert ref["margin"][step] < SAME_QUANT_FLIP, (step, tokens, want)
    assert exact >= len(rows) - misses


def assert_logprobs_match(rows: list[Row]) -> None:
    """The engine's logprobs against the teacher-forced reference: every step within
    one rounding flip, most steps (3 in 4) within float noise."""
    diffs = [
        abs(a - b)
        for got, _, ref in rows
        for a, b in zip(got["logprobs"], ref["logprobs"], strict=True)
    ]
    assert max(diffs) < SAME_QUANT_FLIP, max(diffs)
    typical = sorted(diffs)[len(diffs) * 3 // 4]  # most steps see no flip at all
    assert typical < SAME_QUANT_TYPICAL, typical


def vllm_per_token(x: torch.Tensor) -> torch.Tensor:
    """Quantize-dequantize each row as vLLM's CUDA kernel does, in float32:
    ``q = rne(x * (127 / absmax))`` saturated, ``scale = absmax / 127``."""
    xf = x.float()
    absmax = xf.abs().amax(dim=-1, keepdim=True)
    inv = torch.where(absmax > 0, 127.0 / absmax, torch.zeros_like(absmax))
    q = (xf * inv).round().clamp(-128, 127)
    return q.to(x.dtype) * (absmax / 127.0).to(x.dtype)


def compressed_tensors_per_token(x: torch.Tensor) -> torch.Tensor:
    """compressed-tensors' dynamic token quantization, in float32:
    ``scale = absmax / 127.5``, ``q = rne(clamp(x / scale))``. Its row maximum always
    lands on the tie at +-127.5, so the float32 arithmetic matters."""
    xf = x.float()
    scale = xf.abs().amax(dim=-1, keepdim=True) / 127.5
    scale = torch.where(scale == 0, torch.finfo(torch.float32).eps, scale)
    q = (xf / scale).clamp(-128, 127).round()
    return q.to(x.dtype) * scale.to(x.dtype)


# Row-parallel linears: under tensor parallelism each rank holds a slice of their input
# features and quantizes only that slice (its own per-token absmax).
ROW_PARALLEL = ("o_proj", "down_proj", "out_proj")


def sharded(
    quantize: Callable[[torch.Tensor], torch.Tensor], tp: int
) -> Callable[[torch.Tensor], torch.Tensor]:
    """``quantize`` applied to each of ``tp`` contiguous slices of the last dimension,
    as the ranks of a row-parallel layer do."""
    if tp == 1:
        return quantize
    return lambda x: torch.cat([quantize(c) for c in x.chunk(tp, dim=-1)], dim=-1)


def float64_reference(
    model_dir: str,
    quantize: Callable[[torch.Tensor], torch.Tensor] = vllm_per_token,
    tp: int = 1,
) -> torch.nn.Module:
    """transformers' model, float64, on the stored int8 weights x scales, with per-token
    activation quantization in front of every quantized linear layer."""
    from safetensors.torch import load_file
    from transformers import AutoConfig, AutoModelForCausalLM

    raw = json.loads((Path(model_dir) / "config.json").read_text())
    raw.pop("quantization_config")
    tensors = load_file(str(Path(model_dir) / "model.safetensors"))
    if "text_config" in raw:  # a composite: its text model, as a causal LM
        raw = raw["text_config"]
        tensors = _text_tensors(tensors)
    config = AutoConfig.for_model(**raw)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float64).eval()
    state, quantized = {}, []
    for name, t in tensors.items():
        if name.endswith(".weight_scale"):
            continue
        scale = tensors.get(name.removesuffix(".weight") + ".weight_scale")
        if scale is None:
            state[name] = t.double()
        else:
            assert t.dtype == torch.int8, name
            state[name] = t.double() * scale.double()
            quantized.append(name.removesuffix(".weight"))
    state, quantized_experts = _fuse_experts(state, quantized)
    model.load_state_dict(state, strict=True)
    modules = dict(model.named_modules())
    for name in quantized:
        if ".mlp.experts." in name:
            continue
        q = sharded(quantize, tp) if name.endswith(ROW_PARALLEL) else quantize
        modules[name].register_forward_pre_hook(lambda m, args, q=q: (q(args[0]),))
    for name in quantized_experts:
        assert tp == 1, "the MoE reference quantizes whole expert inputs (TP 1)"
        _quantize_expert_inputs(modules[name], quantize)
    return model


_EXPERT = re.compile(
    r"(.*\.mlp\.experts)\.(\d+)\.(gate_proj|up_proj|down_proj)\.weight"
)


def _fuse_experts(
    state: dict[str, torch.Tensor], quantized: list[str]
) -> tuple[dict[str, torch.Tensor], set[str]]:
    """Per-expert checkpoint tensors (as released MoE checkpoints store them) into
    transformers' fused ``experts.gate_up_proj`` [E, 2I, H] / ``experts.down_proj``
    [E, H, I]; also the experts modules whose projections were quantized."""
    experts: dict[str, dict[int, dict[str, torch.Tensor]]] = {}
    out = {}
    for name, t in state.items():
        m = _EXPERT.fullmatch(name)
        if m is None:
            out[name] = t
            continue
        experts.setdefault(m[1], {}).setdefault(int(m[2]), {})[m[3]] = t
    for module, by_expert in experts.items():
        order = sorted(by_expert)
        assert order == list(range(len(order))), (module, order)
        out[module + ".gate_up_proj"] = torch.stack(
            [
                torch.cat([by_expert[e]["gate_proj"], by_expert[e]["up_proj"]])
                for e in order
            ]
        )
        out[module + ".down_proj"] = torch.stack(
            [by_expert[e]["down_proj"] for e in order]
        )
    quantized_experts = {
        m[1] for n in quantized if (m := _EXPERT.fullmatch(n + ".weight")) is not None
    }
    return out, quantized_experts


def _quantize_expert_inputs(
    experts: torch.nn.Module, quantize: Callable[[torch.Tensor], torch.Tensor]
) -> None:
    """transformers' expert loop (``Qwen3_5MoeExperts.forward``) with each expert's
    input and its down projection's input quantized per token, as an int8 linear
    layer quantizes its activations."""
    import torch.nn.functional as F

    def forward(
        hidden_states: torch.Tensor,
        top_k_index: torch.Tensor,
        top_k_weights: torch.Tensor,
    ) -> torch.Tensor:
        final = torch.zeros_like(hidden_states)
        for e in range(experts.num_experts):
            token_idx, slot = torch.where(top_k_index == e)
            if token_idx.numel() == 0:
                continue
            x = quantize(hidden_states[token_idx])
            gate, up = F.linear(x, experts.gate_up_proj[e]).chunk(2, dim=-1)
            h = quantize(experts.act_fn(gate) * up)
            y = F.linear(h, experts.down_proj[e]) * top_k_weights[token_idx, slot, None]
            final.index_add_(0, token_idx, y.to(final.dtype))
        return final

    experts.forward = forward  # type: ignore[method-assign]


def _text_tensors(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A composite's text-model tensors under the causal LM's names (the vision tower
    and the MTP head dropped: text prompts never reach them)."""
    prefix = "model.language_model."
    out = {
        "model." + n.removeprefix(prefix): t
        for n, t in tensors.items()
        if n.startswith(prefix)
    }
    out["lm_head.weight"] = tensors["lm_head.weight"]
    return out


def transformers_native(model_dir: str) -> torch.nn.Module:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()


@torch.no_grad()
def greedy(model: torch.nn.Module, prompt: list[int], n: int) -> list[int]:
    ids = torch.tensor([prompt])
    out: list[int] = []
    for _ in range(n):
        nxt = int(model(ids).logits[0, -1].argmax())
        out.append(nxt)
        ids = torch.cat([ids, torch.tensor([[nxt]])], dim=1)
    return out


@torch.no_grad()
def teacher_forced(
    model: torch.nn.Module, prompt: list[int], tokens: list[int]
) -> dict[str, list[Any]]:
    """At each generated step: the logprob of ``tokens[i]``, the model's own argmax and
    its top-2 logprob margin, all from one forward pass over prompt + tokens."""
    ids = torch.tensor([prompt + tokens])
    logits = model(ids).logits[0].double()
    rows = logits[len(prompt) - 1 : len(prompt) - 1 + len(tokens)].log_softmax(-1)
    top2 = rows.topk(2, dim=-1)
    return {
        "logprobs": [float(rows[i, t]) for i, t in enumerate(tokens)],
        "argmax": top2.indices[:, 0].tolist(),
        "margin": (top2.values[:, 0] - top2.values[:, 1]).tolist(),
    }


def post(spec: dict[str, Any], result: dict[str, Any]) -> dict[str, Any]:
    """Both references on every job the engine ran (e2e_runner's ``post`` hook)."""
    ref = float64_reference(spec["model"])
    ref_ct = float64_reference(spec["model"], compressed_tensors_per_token)
    native = transformers_native(spec["model"])
    out = reference_rows(ref, result)
    for key, model in (("float64_127_5", ref_ct), ("transformers", native)):
        out[key] = {
            name: [
                teacher_forced(model, r["prompt_token_ids"], r["token_ids"])
                for r in rows
            ]
            for name, rows in result["jobs"].items()
        }
    return out


def post_float64(spec: dict[str, Any], result: dict[str, Any]) -> dict[str, Any]:
    """The same-quantization float64 reference only (e2e_runner's ``post`` hook), for
    checkpoints whose compressed-tensors loading transformers cannot do as a causal LM:
    a composite's ``quantization_config`` sits beside ``text_config``, which
    ``AutoModelForCausalLM`` builds the text model from, so transformers would load the
    int8 weights as floats and drop every ``weight_scale``."""
    tp = int(spec["llm"].get("tensor_parallel_size", 1))
    return reference_rows(float64_reference(spec["model"], tp=tp), result)


def reference_rows(ref: Any, result: dict[str, Any]) -> dict[str, Any]:
    """For every engine row of ``result``: ``ref``'s own greedy decoding of the prompt
    (``float64_greedy``) and ``ref`` teacher-forced on the engine's tokens
    (``float64``: logprobs and top-2 margins)."""
    out: dict[str, Any] = {"float64_greedy": {}, "float64": {}}
    for name, rows in result["jobs"].items():
        out["float64_greedy"][name] = [
            greedy(ref, r["prompt_token_ids"], len(r["token_ids"])) for r in rows
        ]
        out["float64"][name] = [
            teacher_forced(ref, r["prompt_token_ids"], r["token_ids"]) for r in rows
        ]
    return out
