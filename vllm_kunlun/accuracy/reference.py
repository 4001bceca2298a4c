"""The reference side: transformers on the CPU, from the checkpoint directory the
server serves, teacher-forced.

Why bounded: a 27B checkpoint is 54 GB in bfloat16 and 108 GB in float32; loading it on
a host without that much free memory swaps the machine to a halt or gets the process
killed minutes later. So the memory is estimated first from the weight files'
safetensors headers (the exact parameter count; config.json when there are none) and
the reference refuses before loading what does not fit. It computes in float32 when
that fits (the most exact reference) and in the checkpoint's dtype otherwise.
transformers 5.2.0 always loads on the meta device and materializes one tensor at a
time in the requested dtype (its ``low_cpu_mem_usage`` is gone: that is the default),
so the peak is the model once, not twice.
"""

from __future__ import annotations

import importlib.util
import json
import os
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vllm_kunlun.checks.config_file import read_config
from vllm_kunlun.checks.weights import DTYPE_BYTES, estimate_weights, int8_ignore

GIB = 1 << 30
RUNTIME_OVERHEAD = 2 * GIB
"""torch, transformers, the tokenizer and allocator slack, measured at about 1.2 GiB
for the tiny model; rounded up."""
_SAFETENSORS_ITEM = {
    "F64": 8, "F32": 4, "BF16": 2, "F16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1,
    "U8": 1, "BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1,
}  # fmt: skip


class ReferenceUnavailable(RuntimeError):
    """The reference cannot be computed here (exit 2); the message names the fix."""


@dataclass(frozen=True)
class Checkpoint:
    path: str
    dtype: str  # the checkpoint's float dtype: float32 / bfloat16 / float16
    quant: str  # "none" or "w8a8"
    params: int
    params_source: str
    vocab: int


def _text_config(config: dict[str, Any]) -> dict[str, Any]:
    text = config.get("text_config")
    return text if isinstance(text, dict) else config


def checkpoint_dtype(config: dict[str, Any]) -> str:
    """The float dtype config.json names (transformers' default float32 if none)."""
    text = _text_config(config)
    raw = text.get("dtype") or text.get("torch_dtype") or config.get("dtype")
    raw = str(raw or config.get("torch_dtype") or "float32").replace("torch.", "")
    return {"float": "float32", "half": "float16"}.get(raw, raw)


def safetensors_params(path: str) -> int | None:
    """Elements in every ``*.safetensors`` file of ``path`` (their headers only)."""
    files = sorted(Path(path).glob("*.safetensors"))
    if not files:
        return None
    total = 0
    for f in files:
        with open(f, "rb") as fh:
            (size,) = struct.unpack("<Q", fh.read(8))
            header = json.loads(fh.read(size))
        for name, info in header.items():
            if name == "__metadata__":
                continue
            n = 1
            for d in info["shape"]:
                n *= int(d)
            total += n
    return total


def inspect_checkpoint(path: str) -> Checkpoint:
    """dtype, quantization and parameter count, without loading a weight."""
    if not os.path.isdir(path):
        raise ReferenceUnavailable(
            f"--model {path}: not a directory; give the local checkpoint directory "
            "the server was started on"
        )
    try:
        config = read_config(path)
    except (OSError, ValueError) as exc:
        raise ReferenceUnavailable(f"--model {path}: {exc}") from None
    quant = "none"
    q = config.get("quantization_config") or _text_config(config).get(
        "quantization_config"
    )
    if int8_ignore(config) is not None:
        quant = "w8a8"
        if "text_config" in config:
            raise ReferenceUnavailable(
                "the checkpoint is a compressed-tensors W8A8 composite (text_config "
                "beside quantization_config): transformers 5.2.0 builds its text model "
                "as a causal LM without the quantization, reading the int8 weights as "
                "floats and dropping every weight_scale, so there is no trustworthy "
                "reference for it here yet (no reference is better than a wrong one)"
            )
        if importlib.util.find_spec("compressed_tensors") is None:
            raise ReferenceUnavailable(
                "the checkpoint is compressed-tensors W8A8 int8 and transformers needs "
                "the compressed-tensors package to load it; pip install "
                "compressed-tensors (no reference is better than a wrong one)"
            )
    elif q:
        method = q.get("quant_method") if isinstance(q, dict) else q
        raise ReferenceUnavailable(
            f"quantization {method!r} has no reference or thresholds here (supported: "
            "unquantized, compressed-tensors W8A8 int8)"
        )
    dtype = checkpoint_dtype(config)
    if dtype not in ("float32", "bfloat16", "float16"):
        raise ReferenceUnavailable(
            f"config.json's dtype {dtype!r} is not a float dtype"
        )
    params = safetensors_params(path)
    source = "safetensors headers"
    if params is None:
        est = estimate_weights(config)
        if est is None:
            raise ReferenceUnavailable(
                f"no *.safetensors in {path} and config.json's model family is not "
                "one the estimate knows: cannot bound the reference's memory"
            )
        params = est.total_bytes // DTYPE_BYTES.get(dtype, 2)
        source = est.source
    vocab = int(_text_config(config).get("vocab_size") or 0)
    return Checkpoint(path, dtype, quant, params, source, vocab)


@dataclass(frozen=True)
class MemoryPlan:
    dtype: str  # the reference's compute dtype
    estimate_bytes: int
    available_bytes: int


def memory_estimate(params: int, dtype: str, tokens: int, vocab: int) -> int:
    """Weights in ``dtype`` (W8A8 dequantized: every parameter as a float), the
    longest prompt's logits in ``dtype`` plus two float32 copies (log_softmax), and
    the runtime."""
    item = DTYPE_BYTES[dtype]
    return params * item + tokens * vocab * (item + 8) + RUNTIME_OVERHEAD


def plan_memory(ckpt: Checkpoint, tokens: int, available: int) -> MemoryPlan:
    """float32 when it fits, else the checkpoint's dtype, else ReferenceUnavailable."""
    for dtype in dict.fromkeys(("float32", ckpt.dtype)):
        need = memory_estimate(ckpt.params, dtype, tokens, ckpt.vocab)
        if need <= available:
            return MemoryPlan(dtype, need, available)
    need = memory_estimate(ckpt.params, ckpt.dtype, tokens, ckpt.vocab)
    raise ReferenceUnavailable(
        f"the transformers reference needs about {need / GIB:.1f} GiB "
        f"({ckpt.params / 1e9:.2f} B parameters in {ckpt.dtype}, from "
        f"{ckpt.params_source}) and {available / GIB:.1f} GiB RAM is available: run "
        "the check on a host with more free memory (the server's host is not needed; "
        "--url can be remote), or free memory first"
    )


def available_memory() -> int:
    """Memory the kernel can give without swapping (MemAvailable)."""
    import psutil

    return int(psutil.virtual_memory().available)


@dataclass(frozen=True)
class ReferencePrompt:
    """Per position t >= 1, what transformers computes from tokens before t."""

    logprob: list[float]  # of the prompt token
    argmax: list[int]
    argmax_logprob: list[float]
    at_server_top1: list[float]  # the reference's logprob of the server's argmax


class Reference:
    """The checkpoint in transformers, on the CPU, for teacher-forced logprobs."""

    def __init__(self, path: str, dtype: str, progress: bool = False) -> None:
        """``progress``: transformers' loading bar (stderr), for a terminal only."""
        import torch
        import transformers
        from transformers import AutoModelForCausalLM, AutoTokenizer

        from vllm_kunlun.logger import init_logger

        init_logger(__name__).debug(
            "accuracy reference: %s in %s on the CPU", path, dtype
        )
        if progress:
            transformers.utils.logging.enable_progress_bar()
        else:
            transformers.utils.logging.disable_progress_bar()
        self.dtype = dtype
        try:
            self.tokenizer = AutoTokenizer.from_pretrained(path)
            self.model = AutoModelForCausalLM.from_pretrained(
                path, dtype=getattr(torch, dtype)
            ).eval()
        # The CLI's boundary: whatever transformers raises for a checkpoint it cannot
        # build (unknown architecture, missing files, bad shapes) is a usage error.
        except Exception as exc:
            first = str(exc).strip().splitlines()[0][:300] if str(exc).strip() else ""
            raise ReferenceUnavailable(
                f"--model {path}: transformers {transformers.__version__} cannot load "
                f"it ({type(exc).__name__}: {first}); give the checkpoint directory "
                "the server was started on, complete (config.json, tokenizer, "
                "weights)"
            ) from None

    def tokenize(self, prompt: str) -> list[int]:
        """As vLLM 0.15.1 tokenizes a completion prompt: ``tokenizer(text,
        add_special_tokens=True)`` (entrypoints/renderer.py)."""
        return list(self.tokenizer(prompt, add_special_tokens=True)["input_ids"])

    def decode(self, token_id: int) -> str:
        return str(self.tokenizer.decode([token_id]))

    def forward(
        self, token_ids: Sequence[int], server_top1: Sequence[int]
    ) -> ReferencePrompt:
        import torch

        with torch.inference_mode():
            ids = torch.tensor([list(token_ids)])
            logits = self.model(input_ids=ids).logits[0, :-1].float()
            logp = torch.log_softmax(logits, dim=-1)
            nxt = ids[0, 1:]
            top = logp.max(dim=-1)
            other = torch.tensor(list(server_top1), dtype=torch.long)
            return ReferencePrompt(
                logprob=logp.gather(1, nxt[:, None])[:, 0].tolist(),
                argmax=top.indices.tolist(),
                argmax_logprob=top.values.tolist(),
                at_server_top1=logp.gather(1, other[:, None])[:, 0].tolist(),
            )
