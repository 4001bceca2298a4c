"""Refuse a LoRA adapter whose tensor shapes do not fit the model, at load.

Why: vLLM 0.15.1 checks an adapter's rank and target-module names when it loads it,
but not its shapes. An adapter for another base model (another hidden size) is
accepted; a narrower ``lora_A`` is copied into the corner of its slot and served as
silently wrong output, a wider one fails later with a bare "The size of tensor a (64)
must match the size of tensor b (72)" (observed on the tiny Qwen3). This runtime patch
(``lora_adapter_shapes``, ``patching/registry.py``) wraps
``WorkerLoRAManager._load_adapter``: after vLLM's own checks, every ``lora_A`` must
have the input width and every ``lora_B`` the output height of the layer it adapts
(the whole layer, before any tensor-parallel split), else a ValueError names the
adapter, the module, both shapes and the fix. It raises before the adapter enters
vLLM's cache, so the adapters already served are untouched and the API answers the
load with the error. The same wrapper refuses an adapter for a module the model
declares unserved (``LORA_REFUSED_MODULES`` on the model class: Qwen3.5's GDN
``conv1d``, a linear layer only as a weight holder, which vLLM would wrap and never
apply). Removal: when vLLM checks adapter shapes at load and knows which wrapped layers
never run.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from types import ModuleType
from typing import Any

from vllm_kunlun.patching.attribute import AttributePatch, expect_params

NAME = "lora_adapter_shapes"
MODULE = "vllm.lora.worker_manager"
_PARAMS = ("self", "lora_request")


def _slice_sizes(base: Any, count: int) -> list[int] | None:
    """The whole output sizes of a packed layer's slices (q, k, v / gate, up)."""
    heads = getattr(base, "total_num_heads", None)
    if heads is not None and count == 3:  # QKVParallelLinear: no KV replication
        kv = base.total_num_kv_heads
        v_size = getattr(base, "v_head_size", base.head_size)
        return [heads * base.head_size, kv * base.head_size, kv * v_size]
    sizes = getattr(base, "output_sizes", None)
    return list(sizes) if sizes is not None and len(sizes) == count else None


def expected_shapes(manager: Any) -> dict[str, tuple[int, int]]:
    """Module name -> (input width, output height) of the whole layer, for every
    linear layer vLLM wrapped for LoRA (packed layers by their sub-module names)."""
    out: dict[str, tuple[int, int]] = {}
    packed = getattr(manager, "packed_modules", {})
    for name, layer in getattr(manager, "modules", {}).items():
        base = getattr(layer, "base_layer", None)
        in_size = getattr(base, "input_size", None)
        if in_size is None:
            continue
        subs = packed.get(name)
        if subs:
            sizes = _slice_sizes(base, len(subs))
            if sizes is not None:
                out.update(
                    {sub: (in_size, n) for sub, n in zip(subs, sizes, strict=True)}
                )
        else:
            out_size = getattr(base, "output_size", None)
            if out_size is not None:
                out[name] = (int(in_size), int(out_size))
    return out


def check_shapes(manager: Any, lora: Any, adapter: str) -> None:
    """Raise ValueError on the first module whose A or B does not fit the layer."""
    expected = expected_shapes(manager)
    for module, weights in sorted(getattr(lora, "loras", {}).items()):
        want = expected.get(module)
        a, b = getattr(weights, "lora_a", None), getattr(weights, "lora_b", None)
        if want is None or a is None or b is None:
            continue
        in_size, out_size = want
        if a.shape[-1] != in_size or b.shape[0] != out_size:
            raise ValueError(
                f"LoRA adapter {adapter!r} does not fit this model: {module} takes "
                f"{in_size} inputs and gives {out_size} outputs, but the adapter's "
                f"lora_A is {list(a.shape)} and lora_B is {list(b.shape)} (expected "
                f"[r, {in_size}] and [{out_size}, r]). Was it trained for another "
                "base model? Load an adapter trained for this one."
            )


def check_served_modules(manager: Any, lora: Any, adapter: str) -> None:
    """Raise ValueError naming the adapter's modules the model declares unserved."""
    model = getattr(manager, "model", None)
    refused: dict[str, str] = getattr(model, "LORA_REFUSED_MODULES", None) or {}
    hits = sorted(
        module
        for module in getattr(lora, "loras", {})
        if module.rsplit(".", 1)[-1] in refused
    )
    if hits:
        leaf = hits[0].rsplit(".", 1)[-1]
        raise ValueError(
            f"LoRA adapter {adapter!r} targets {leaf} ({len(hits)} modules, first "
            f"{hits[0]}), which {type(model).__name__} does not serve with LoRA: "
            f"{refused[leaf]}. Train the adapter without {leaf} in target_modules, "
            "or merge it into the weights."
        )


def _make(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def _load_adapter(self: Any, lora_request: Any) -> Any:
        lora = original(self, lora_request)
        name = f"{lora_request.lora_name} ({lora_request.lora_path})"
        check_served_modules(self._adapter_manager, lora, name)
        check_shapes(self._adapter_manager, lora, name)
        return lora

    return _load_adapter


def _check_target(module: ModuleType, original: Any) -> str | None:
    return expect_params(original, "WorkerLoRAManager._load_adapter", _PARAMS)


PATCH = AttributePatch(
    NAME, MODULE, "WorkerLoRAManager._load_adapter", _make, _check_target
)


def apply() -> bool:
    """Install the shape check (imports vLLM's LoRA worker manager)."""
    return PATCH.apply_or_warn("LoRA adapters are loaded without the shape check")


RUNTIME_PATCHES = {NAME: lambda phase: apply()}  # phases.apply_phase's hook


def revert() -> None:
    PATCH.revert()
