"""MLA decode probe: the portable absorbed MLA decode against the same attention served
from the equivalent multi-head (MHA) cache, one layer, in one run.

Why MLA exists: a decode step reads every cached token of every running sequence. The
MHA cache holds per head a key (``nope + rope`` wide) and a value (``v_head`` wide); the
MLA cache holds one ``kv_lora_rank + rope`` row per token, shared by the heads, and the
absorbed decode (``ops/mla/portable.decode_attention``, ``W_UK`` folded into the query,
``W_UV`` applied to the output) attends over those rows directly. At DeepSeek-V3's
shape on one of 8 TP ranks (16 heads, 512 + 64 latent, nope 128, v_head 128) that is
576 values a token against 16 x (192 + 128) = 5120: 8.9x fewer bytes read per step.

Both sides run the same way (paged cache, slots gathered by block table, float32
scores and softmax); the MHA cache is the MLA cache up-projected (``k_nope = kv_c
W_UK``, ``v = kv_c W_UV``), so both compute the same attention: the largest
difference between their outputs is reported. Reported per (batch, context): median ms
per layer decode step, mha / mla, and the KV bytes each reads per step.

    python benchmarks/mla.py                          # batch 8, 64; context 1024
    python benchmarks/mla.py --heads 128 --batch 1,8 --context 4096 --json mla.json

Calls alternate (mla, mha, mla, ...), so a change in machine load affects both.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from vllm_kunlun.ops.mla import portable  # noqa: E402

# DeepSeek-V3's attention on one of 8 TP ranks (config.json: num_attention_heads 128,
# kv_lora_rank, qk_rope_head_dim, qk_nope_head_dim, v_head_dim).
HEADS, LATENT, ROPE, NOPE, V_HEAD = 16, 512, 64, 128, 128
DTYPES = {"float32": torch.float32, "bf16": torch.bfloat16}
BLOCK = 64


def _sizes(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a list of integers"
        ) from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: every size must be at least 1")
    return values


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--heads", type=int, default=HEADS)
    parser.add_argument("--latent", type=int, default=LATENT, help="kv_lora_rank")
    parser.add_argument("--rope", type=int, default=ROPE)
    parser.add_argument("--nope", type=int, default=NOPE)
    parser.add_argument("--v-head", type=int, default=V_HEAD)
    parser.add_argument("--batch", type=_sizes, default=[8, 64])
    parser.add_argument("--context", type=_sizes, default=[1024])
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="float32")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=0, help="0: torch's default")
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args(argv)
    for name in ("heads", "latent", "rope", "nope", "v_head", "rounds"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1")
    return args


def _mha_decode(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    table: torch.Tensor,
    lens: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """Decode over a paged per-head K / V cache, written as ``decode_attention`` is."""
    block = k_cache.shape[1]
    longest = int(lens.max())
    pos = torch.arange(longest)
    slots = table[:, pos // block].long() * block + pos % block
    valid = pos.unsqueeze(0) < lens.unsqueeze(1)
    slots = torch.where(valid, slots, torch.zeros_like(slots))
    k = k_cache.view(-1, *k_cache.shape[2:])[slots].float()  # [B, S, H, Dk]
    v = v_cache.view(-1, *v_cache.shape[2:])[slots].float()
    scores = torch.einsum("bhd,bshd->bhs", q.float(), k) * scale
    scores = scores.masked_fill(~valid.unsqueeze(1), float("-inf"))
    return torch.einsum("bhs,bshv->bhv", torch.softmax(scores, -1), v).to(q.dtype)


def _timed(fn: Any, out: list[float]) -> Any:
    """``fn()``, its wall time in ms appended to ``out``."""
    start = time.perf_counter()
    result = fn()
    out.append((time.perf_counter() - start) * 1e3)
    return result


def case(args: argparse.Namespace, batch: int, context: int) -> dict[str, Any]:
    dtype = DTYPES[args.dtype]
    g = torch.Generator().manual_seed(batch * 7919 + context)
    h, lat, r, p, dv = args.heads, args.latent, args.rope, args.nope, args.v_head
    per = -(-context // BLOCK)
    blocks = batch * per
    table = torch.randperm(blocks, generator=g).view(batch, per).to(torch.int32)
    lens = torch.full((batch,), context)
    latent = torch.randn(blocks, BLOCK, lat + r, generator=g).to(dtype)
    w_uk = (torch.randn(h, p, lat, generator=g) / lat**0.5).to(dtype)  # W_UK_T
    w_uv = (torch.randn(h, lat, dv, generator=g) / lat**0.5).to(dtype)
    # The equivalent MHA cache: the latent up-projected per head.
    kv_c, k_pe = latent[..., :lat], latent[..., lat:]
    k_nope = torch.einsum("nbl,hpl->nbhp", kv_c, w_uk)
    k_cache = torch.cat([k_nope, k_pe.unsqueeze(2).expand(-1, -1, h, -1)], -1)
    v_cache = torch.einsum("nbl,hlv->nbhv", kv_c, w_uv).contiguous()
    q = torch.randn(batch, h, p + r, generator=g).to(dtype)
    scale = (p + r) ** -0.5

    def mla() -> torch.Tensor:
        q_latent = torch.bmm(q[..., :p].transpose(0, 1), w_uk).transpose(0, 1)
        o = portable.decode_attention(
            q_latent.contiguous(),
            q[..., p:].contiguous(),
            latent,
            table,
            lens,
            lat,
            scale,
        )
        return torch.bmm(o.transpose(0, 1), w_uv).transpose(0, 1)

    def mha() -> torch.Tensor:
        return _mha_decode(q, k_cache, v_cache, table, lens, scale)

    times: dict[str, list[float]] = {"mla": [], "mha": []}
    outs: dict[str, torch.Tensor] = {}
    mla(), mha()  # warm-up
    for _ in range(args.rounds):
        outs["mla"] = _timed(mla, times["mla"])
        outs["mha"] = _timed(mha, times["mha"])
    size = torch.finfo(dtype).bits // 8
    mla_bytes = batch * context * (lat + r) * size
    mha_bytes = batch * context * h * (p + r + dv) * size
    ms = {k: statistics.median(v) for k, v in times.items()}
    return {
        "batch": batch,
        "context": context,
        "mla_ms": ms["mla"],
        "mha_ms": ms["mha"],
        "mha_over_mla": ms["mha"] / ms["mla"],
        "mla_kv_bytes": mla_bytes,
        "mha_kv_bytes": mha_bytes,
        "bytes_ratio": mha_bytes / mla_bytes,
        "max_diff": float((outs["mla"].float() - outs["mha"].float()).abs().max()),
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    if args.threads:
        torch.set_num_threads(args.threads)
    shape = {
        "heads": args.heads,
        "latent": args.latent,
        "rope": args.rope,
        "nope": args.nope,
        "v_head": args.v_head,
    }
    rows = [case(args, b, c) for b in args.batch for c in args.context]
    return {
        "shape": shape,
        "dtype": args.dtype,
        "rounds": args.rounds,
        "threads": torch.get_num_threads(),
        "rows": rows,
    }


def markdown(report: dict[str, Any]) -> str:
    s = report["shape"]
    lines = [
        f"MLA decode, one layer: {s['heads']} heads, latent {s['latent']} + rope "
        f"{s['rope']}, nope {s['nope']}, v_head {s['v_head']}; {report['dtype']}, CPU, "
        f"{report['threads']} threads, median of {report['rounds']}",
        "",
        "| batch | context | mla ms | mha ms | mha / mla | KV read MLA | KV read MHA "
        "| bytes MHA / MLA | max diff |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in report["rows"]:
        lines.append(
            f"| {r['batch']} | {r['context']} | {r['mla_ms']:.2f} | {r['mha_ms']:.2f} "
            f"| {r['mha_over_mla']:.2f} | {r['mla_kv_bytes'] / 2**20:.1f} MiB "
            f"| {r['mha_kv_bytes'] / 2**20:.1f} MiB | {r['bytes_ratio']:.2f} "
            f"| {r['max_diff']:.1e} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    report = run(args)
    print(markdown(report))
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
