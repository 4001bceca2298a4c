"""The Gated DeltaNet kernel seam: vendor kernel, vLLM's Triton kernels, or portable torch.

Why: vLLM 0.15.1's GDN layer (``qwen3_next._forward_core``, which Qwen3.5 reuses) calls
five Triton-only kernels. Without an active Triton driver the first prefill fails
(``triton.next_power_of_2`` on vLLM's placeholder module), and on Kunlun the vendor
library ships its own decode kernel. This module offers the same five entry points,
with vLLM's signatures, and routes each call:

- ``vendor``: ``kunlun_ops.fused_recurrent_gated_delta_rule_fwdv2`` for the decode
  recurrence, called the way the upstream Kunlun plugin calls it (vLLM's state layout
  ``[slots, HV, dk, dv]`` with ``is_h0_transposed=True``). Only this one vendor kernel is
  wired: the others' semantics cannot be pinned from observed usage (upstream's
  ``gated_delta_rule`` call sits in a dead branch; the conv kernels changed signatures
  and need host mirrors). Its call form is in ``docs/vendor-calls.md``; no
  test here runs it on a Kunlun host, only against the fake (``tests/unit/ops/test_gdn_seam.py``).
- ``triton``: vLLM's own kernel (the function the runtime patch replaced).
- ``portable``: ``gdn_portable`` (torch, any device).

``VLLM_KUNLUN_GDN``: ``auto`` (vendor where wired, the active platform wants vendor
kernels and it loads; else Triton when it has an active driver and the tensors are on a
device; else portable), ``vendor`` (fail when the vendor kernel is missing; portable for
the other ops), ``triton`` (fail without a driver), ``portable``. ``ops/chooser.py``
makes each op's choice and logs it once. If a Triton kernel raises (e.g. it cannot compile for the
device), that op switches to portable with a warning that quotes the error.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from vllm_kunlun.logger import init_logger
from vllm_kunlun.ops import chooser, vendor
from vllm_kunlun.ops.gdn import portable

logger = init_logger(__name__)

VENDOR_MODULE = "kunlun_ops"
VENDOR = chooser.VENDOR
TRITON = chooser.TRITON
PORTABLE = chooser.PORTABLE
# The entry points, by the name vLLM's qwen3_next module calls them.
OPS = (
    "fused_gdn_gating",
    "causal_conv1d_fn",
    "causal_conv1d_update",
    "chunk_gated_delta_rule",
    "fused_recurrent_gated_delta_rule",
)
# Entry point -> the vendor function behind it (ops/contract.py declares its kwargs).
VENDOR_FUNCTIONS = {
    "fused_recurrent_gated_delta_rule": "fused_recurrent_gated_delta_rule_fwdv2",
}


@dataclass(frozen=True)
class GdnChoice:
    """One op's path on one device, why, and the vendor handle the chooser loaded."""

    op: str
    name: str
    reason: str
    vendor: Callable[..., Any] | None = None


_CHOICES: dict[tuple[str, str], GdnChoice] = {}
_TRITON_BROKEN: dict[str, str] = {}


def reset() -> None:
    """Forget the choices made in this process (tests)."""
    _CHOICES.clear()
    _TRITON_BROKEN.clear()


def triton_driver() -> tuple[bool, str]:
    """Whether vLLM found an active Triton driver in this process, and why not."""
    from vllm.triton_utils import HAS_TRITON

    if HAS_TRITON:
        return True, "Triton has an active driver"
    return False, "Triton has no active driver in this process (vLLM's HAS_TRITON)"


def vendor_function(op: str) -> tuple[Callable[..., Any] | None, str]:
    name = VENDOR_FUNCTIONS.get(op)
    if name is None:
        return None, f"no vendor kernel is wired for {op}"
    fn, reason = vendor.function(VENDOR_MODULE, name)
    return fn, (f"{reason} is available" if fn is not None else reason)


def _triton(op: str) -> tuple[bool, str]:
    if op in _TRITON_BROKEN:
        return False, _TRITON_BROKEN[op]
    return triton_driver()


def choose(op: str, device: torch.device) -> GdnChoice:
    """The kernel for ``op`` on ``device`` per ``VLLM_KUNLUN_GDN`` and the active
    platform's policy (``ops/chooser.py``, which logs it once)."""
    key = (op, device.type)
    if key in _CHOICES:
        return _CHOICES[key]
    choice = chooser.choose(
        chooser.GDN,
        device,
        vendor=(lambda: vendor_function(op)) if op in VENDOR_FUNCTIONS else None,
        triton=lambda: _triton(op),
        op=op,
    )
    _CHOICES[key] = GdnChoice(op, choice.name, choice.reason, choice.vendor)
    return _CHOICES[key]


def served() -> list[dict[str, str]]:
    """The kernel each GDN op called in this process so far ran on (op, device type,
    path, reason): the demo's and the tests' report of what served the layers."""
    return [
        {"op": op, "device": device, "path": c.name, "reason": c.reason}
        for (op, device), c in sorted(_CHOICES.items())
    ]


def _device_of(arguments: dict[str, Any]) -> torch.device:
    for value in arguments.values():
        if isinstance(value, torch.Tensor):
            return value.device
    return torch.device("cpu")


def _arguments_of(fn: Callable[..., Any]) -> Callable[..., dict[str, Any]]:
    """A function mapping one call's ``(args, kwargs)`` to ``fn``'s parameters by name,
    defaults filled in. The signature is read here, once: a GDN kernel is called several
    times per layer and step, too often to bind ``inspect.Signature`` on every call."""
    signature = inspect.signature(fn)
    params = list(signature.parameters.values())
    kinds = {p.kind for p in params}
    if kinds - {
        inspect.Parameter.POSITIONAL_OR_KEYWORD,
        inspect.Parameter.KEYWORD_ONLY,
    }:
        raise TypeError(
            f"vllm-kunlun: the GDN seam maps named parameters only; {fn.__name__} "
            f"takes {signature} (a vLLM this plugin was not written for)"
        )
    positional = [
        p.name for p in params if p.kind == inspect.Parameter.POSITIONAL_OR_KEYWORD
    ]
    defaults = {p.name: p.default for p in params if p.default is not p.empty}
    names = {p.name for p in params}
    required = names - set(defaults)

    def arguments(args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
        given = positional[: len(args)]
        if (
            len(args) > len(positional)
            or not names.issuperset(kwargs)
            or not kwargs.keys().isdisjoint(given)
        ):
            signature.bind(*args, **kwargs)  # raises the TypeError Python would
        out = {**defaults, **dict(zip(given, args, strict=True)), **kwargs}
        if not required.issubset(out):
            signature.bind(*args, **kwargs)
        return out

    return arguments


def dispatcher(op: str, triton_fn: Callable[..., Any]) -> Callable[..., Any]:
    """A drop-in for vLLM's ``op`` (same signature) that routes every call."""
    arguments_of = _arguments_of(triton_fn)
    portable_impl = _PORTABLE[op]
    vendor_impl = _VENDOR.get(op)

    def route(*args: Any, **kwargs: Any) -> Any:
        arguments = arguments_of(args, kwargs)
        device = _device_of(arguments)
        choice = choose(op, device)
        if choice.name == VENDOR and vendor_impl is not None:
            if choice.vendor is None:  # a chooser contract violation, not a user error
                raise RuntimeError(
                    f"vllm-kunlun: GDN chose the vendor kernel for {op} without its "
                    "handle"
                )
            return vendor_impl(choice.vendor, arguments)
        if choice.name == TRITON:
            try:
                return triton_fn(*args, **kwargs)
            except Exception as exc:
                if chooser.mode_of(chooser.GDN) == TRITON:
                    raise
                _TRITON_BROKEN[op] = f"vLLM's Triton {op} failed ({exc!r:.200})"
                _CHOICES.pop((op, device.type), None)
                logger.warning(
                    "vllm-kunlun: %s; using the portable torch kernel for it",
                    _TRITON_BROKEN[op],
                )
        return portable_impl(arguments)

    route.__name__ = route.__qualname__ = f"kunlun_{op}"
    route.__doc__ = (
        f"vllm-kunlun GDN seam for vLLM's {op} (see vllm_kunlun/ops/gdn/seam.py)."
    )
    route.__wrapped__ = triton_fn  # type: ignore[attr-defined]
    return route


# ---- portable adapters: vLLM's arguments -> gdn_portable ----------------------------------


def _unsupported(what: str) -> NotImplementedError:
    return NotImplementedError(
        f"the portable GDN kernels do not support {what} (mamba_cache_mode='all' "
        "on a hybrid model); serve without it"
    )


def _gating(a: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor]:
    return portable.gdn_gating(
        a["A_log"], a["a"], a["b"], a["dt_bias"], a["beta"], a["threshold"]
    )


def _conv(a: dict[str, Any]) -> torch.Tensor:
    if a.get("block_idx_first_scheduled_token") is not None:
        raise _unsupported("per-block conv states")
    indices = a["cache_indices"]
    if indices is None:
        indices = torch.arange(a["query_start_loc"].numel() - 1)
    return portable.causal_conv1d_varlen(
        a["x"],
        a["weight"],
        a["bias"],
        a["conv_states"],
        a["query_start_loc"],
        indices,
        a["has_initial_state"],
        a["activation"],
    )


def _conv_update(a: dict[str, Any]) -> torch.Tensor:
    x = a["x"]
    if a["block_idx_last_scheduled_token"] is not None:
        raise _unsupported("per-block conv states")
    if a["query_start_loc"] is not None:
        # Speculative decode: several query tokens per sequence (vLLM's varlen form).
        return portable.causal_conv1d_multi(
            x,
            a["conv_state"],
            a["weight"],
            a["bias"],
            a["activation"],
            a["conv_state_indices"],
            a["query_start_loc"],
            a["num_accepted_tokens"],
        )
    if a["num_accepted_tokens"] is not None:
        raise _unsupported("accepted-token counts without query_start_loc")
    if x.dim() != 2:
        raise _unsupported(f"conv update inputs of shape {tuple(x.shape)}")
    indices = a["conv_state_indices"]
    if indices is None:
        indices = torch.arange(x.shape[0], device=x.device)
    return portable.causal_conv1d_step(
        x, a["conv_state"], a["weight"], a["bias"], a["activation"], indices
    )


def _scale(a: dict[str, Any]) -> float:
    scale = a["scale"]
    return float(a["k"].shape[-1] ** -0.5 if scale is None else scale)


def _chunk(a: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor]:
    if a["head_first"]:
        raise _unsupported("head-first layouts")
    return portable.chunk_gated_delta_rule(
        a["q"],
        a["k"],
        a["v"],
        a["g"],
        a["beta"],
        _scale(a),
        a["initial_state"],
        a["cu_seqlens"],
        a["use_qk_l2norm_in_kernel"],
    )


def _is_speculative(a: dict[str, Any]) -> bool:
    """Whether a recurrent call carries vLLM's speculative-decode state layout."""
    indices = a["ssm_state_indices"]
    return a["num_accepted_tokens"] is not None or (
        indices is not None and indices.dim() == 2 and indices.shape[1] > 1
    )


def _recurrent_checks(a: dict[str, Any]) -> None:
    if not a["inplace_final_state"]:
        raise _unsupported("out-of-place final states")


def _recurrent(a: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor]:
    _recurrent_checks(a)
    beta = a["beta"] if a["beta"] is not None else torch.ones_like(a["g"])
    state = a["initial_state"]
    out = portable.recurrent_gated_delta_rule(
        a["q"],
        a["k"],
        a["v"],
        a["g"],
        beta,
        _scale(a),
        state,
        a["cu_seqlens"],
        a["ssm_state_indices"],
        a["use_qk_l2norm_in_kernel"],
        a["num_accepted_tokens"],
    )
    return out, state


_PORTABLE: dict[str, Callable[[dict[str, Any]], Any]] = {
    "fused_gdn_gating": _gating,
    "causal_conv1d_fn": _conv,
    "causal_conv1d_update": _conv_update,
    "chunk_gated_delta_rule": _chunk,
    "fused_recurrent_gated_delta_rule": _recurrent,
}


# ---- vendor adapters ----------------------------------------------------------------------


def _recurrent_vendor(
    fn: Callable[..., Any], a: dict[str, Any]
) -> tuple[torch.Tensor, torch.Tensor]:
    """The decode recurrence through ``kunlun_ops.fused_recurrent_gated_delta_rule_fwdv2``,
    called as the upstream Kunlun plugin calls it: q/k/v/g/beta contiguous, vLLM's state
    pool updated in place at ``h0_indices``. Speculative-decode calls (per-token state
    slots, accepted-token counts) go to the portable kernel: the vendor kernel's
    handling of them is not pinned down (``docs/vendor-calls.md``)."""
    _recurrent_checks(a)
    if _is_speculative(a):
        logger.info_once(
            "vllm-kunlun: GDN speculative-decode recurrence runs on the portable "
            "kernel (the vendor kernel's multi-token state layout is not wired)"
        )
        return _recurrent(a)
    beta = a["beta"] if a["beta"] is not None else torch.ones_like(a["g"])
    state = a["initial_state"]
    out, _final = fn(
        a["q"].contiguous(),
        a["k"].contiguous(),
        a["v"].contiguous(),
        a["g"].contiguous(),
        beta.contiguous(),
        _scale(a),
        state,
        inplace_final_state=True,
        cu_seqlens=a["cu_seqlens"],
        h0_indices=a["ssm_state_indices"],
        num_accepted_tokens=None,
        use_qk_l2norm_in_kernel=a["use_qk_l2norm_in_kernel"],
        is_h0_transposed=True,
    )
    return out, state


_VENDOR: dict[str, Callable[[Callable[..., Any], dict[str, Any]], Any]] = {
    "fused_recurrent_gated_delta_rule": _recurrent_vendor,
}
