"""Runtime patch ``engine_checkpoint_guard``: a checkpoint loads whole or not at all.

Why: vLLM 0.15.1's ``DefaultModelLoader.load_weights`` compares the model's parameters
with the names its ``load_weights`` reports only when the model is NOT quantized: a
quantization method creates parameters no checkpoint holds (the KV-cache method gives
every attention layer ``k_scale`` / ``v_scale`` / ``q_scale`` and zero points, filled
with defaults after loading), so vLLM turned the check off for all of them. A W8A8
checkpoint with a ``weight_scale`` deleted then loads without a word and serves
garbage (the scale stays ``torch.empty``). Even unquantized, a merged parameter counts
as loaded when one of its shards was (``qkv_proj`` without ``k_proj``). And the linear,
embedding and sharded loaders ``narrow`` the checkpoint tensor to the slot they fill: an
oversize tensor is cut silently (a ``q_proj`` with 8 extra rows serves), an undersize
one fails deep in ``narrow`` or with a bare ``AssertionError`` naming nothing.
How: the patch wraps ``DefaultModelLoader.load_weights``. For the duration of the
call every parameter's ``weight_loader`` is wrapped (and put back afterwards) so that
each checkpoint tensor is compared with the slot it goes into before vLLM's loader
touches it: its expected on-disk shape comes from the owning layer (column / merged /
QKV / row parallel linear, vocabulary embedding, or a ``checkpoint_shape`` attribute a
model sets on a parameter with a loader of its own), a shape comparison only, no copy.
The wrapper records which parameter (and shard) each tensor filled; after vLLM's own
loading, every parameter must have been filled, every shard of a merged one, except
what vLLM fills itself (the KV-cache method's scales). Buffers are not parameters and
tied weights are one parameter, so neither needs an exception. A mismatch raises
``CheckpointError`` (a ``ValueError``) naming the checkpoint tensor, the parameter and
both shapes, or the parameters never loaded: the engine refuses to start.
Applied in every process that builds a model (the platform's runtime fixes, once vLLM's
platform is resolved). Removal: when vLLM checks loaded shapes and quantized models'
completeness itself.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from types import ModuleType
from typing import Any

from vllm_kunlun.logger import init_logger
from vllm_kunlun.patching.attribute import (
    AttributePatch,
    expect_call,
    expect_params,
)

logger = init_logger(__name__)

NAME = "engine_checkpoint_guard"
MODULE = "vllm.model_executor.model_loader.default_loader"
_PARAMS = ("self", "model", "model_config")
# A parameter whose loader is not one of vLLM's layer loaders may declare the shape
# of the checkpoint tensor it is loaded from (the whole tensor, before any TP split).
CHECKPOINT_SHAPE = "checkpoint_shape"
# Quantization methods whose models are held to the completeness check (None: the
# unquantized model). Others are refused at engine start on vllm-kunlun platforms.
CHECKED_QUANTIZATION = (None, "compressed-tensors", "awq", "gptq")

Shape = tuple[int, ...]


class CheckpointError(ValueError):
    """The checkpoint does not fill the model it is loaded into."""


def _fits(expected: Shape, found: Shape) -> bool:
    """Equal shapes, or a scalar and a one-element vector (vLLM loads either)."""
    if expected == found:
        return True
    return len(expected) <= 1 and len(found) <= 1 and _numel(expected) == _numel(found)


def _numel(shape: Shape) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def _slot_rows(layer: Any, shard_id: Any) -> int | None:
    """Rows (along the output dim) of the checkpoint tensor that fills ``shard_id`` of
    a column-parallel layer: whole, before the tensor-parallel split."""
    from vllm.model_executor.layers.linear import (
        MergedColumnParallelLinear,
        QKVParallelLinear,
    )

    if isinstance(layer, QKVParallelLinear):
        sizes = {
            "q": layer.total_num_heads * layer.head_size,
            "k": layer.total_num_kv_heads * layer.head_size,
            "v": layer.total_num_kv_heads * layer.v_head_size,
        }
        return sum(sizes.values()) if shard_id is None else sizes.get(shard_id)
    if isinstance(layer, MergedColumnParallelLinear):
        sizes_list = list(layer.output_sizes)
        if shard_id is None:
            return sum(sizes_list)
        return sizes_list[shard_id] if 0 <= shard_id < len(sizes_list) else None
    return int(layer.output_size) if shard_id is None else None


def shards_of(layer: Any) -> tuple[Any, ...]:
    """The shard ids a merged layer's parameters are loaded by (``()``: not merged)."""
    from vllm.model_executor.layers.linear import (
        MergedColumnParallelLinear,
        QKVParallelLinear,
    )

    if isinstance(layer, QKVParallelLinear):
        return ("q", "k", "v")
    if isinstance(layer, MergedColumnParallelLinear):
        return tuple(range(len(layer.output_sizes)))
    return ()


def expected_shape(
    layer: Any, param: Any, shard_id: Any, own_loader: bool = True
) -> Shape | None:
    """The shape the checkpoint tensor loaded into ``param`` (of ``layer``, shard
    ``shard_id``) must have, or None where the loader's rule is not known here.
    ``own_loader``: the parameter has a loader other than ``default_weight_loader``.

    Only the rules of the loaders vLLM 0.15.1 and the plugin use for the models served:
    the checkpoint tensor is whole (not pre-sharded): a split dimension is the
    parameter's times the TP size, a merged slot is its layer's output size.
    """
    from vllm.model_executor.layers.linear import (
        ColumnParallelLinear,
        ReplicatedLinear,
        RowParallelLinear,
    )
    from vllm.model_executor.layers.vocab_parallel_embedding import (
        VocabParallelEmbedding,
    )
    from vllm.model_executor.parameter import PerTensorScaleParameter

    declared = getattr(param, CHECKPOINT_SHAPE, None)
    if declared is not None:
        return tuple(int(d) for d in declared)
    packed_dim = getattr(param, "packed_dim", None)
    if any(
        getattr(param, flag, False)
        for flag in (
            "is_sharded_weight",
            "use_bitsandbytes_4bit",
            "is_gguf_weight",
            "marlin_tile_size",
        )
    ):
        return (
            None  # pre-sharded, Marlin-tiled or GGUF layouts: not served, not checked
        )
    shape = list(param.shape)
    output_dim = getattr(param, "output_dim", None)
    input_dim = getattr(param, "input_dim", None)
    if isinstance(layer, VocabParallelEmbedding):
        if output_dim is not None:
            shape[output_dim] = int(layer.org_vocab_size)
        return tuple(shape)
    if isinstance(layer, ColumnParallelLinear):
        if output_dim is None:
            scalar = isinstance(param, PerTensorScaleParameter) or getattr(
                param, "needs_scalar_to_array", False
            )
            return (1,) if scalar and shard_id is not None else tuple(shape)
        rows = _slot_rows(layer, shard_id)
        if rows is None:
            return None
        if packed_dim == output_dim:  # 4-bit values packed along the output rows
            rows //= int(param.packed_factor)
        shape[output_dim] = rows
        return tuple(shape)
    if isinstance(layer, RowParallelLinear):
        if input_dim is not None:
            shape[input_dim] *= int(layer.tp_size)
        return tuple(shape)
    if isinstance(layer, ReplicatedLinear):
        return tuple(shape)
    if not own_loader:
        return tuple(shape)  # default_weight_loader copies the tensor whole
    return None


class _Recorder:
    """Wraps every parameter's loader for one ``load_weights`` call: checks each
    tensor's shape before it is loaded and records what was filled."""

    def __init__(self, model: Any, where: str) -> None:
        self.where = where
        self.current = "<a tensor the model built itself>"
        self.filled: dict[str, set[Any]] = {}
        self.layers: dict[str, Any] = {}
        self._restore: list[tuple[Any, bool, Any]] = []
        seen: set[int] = set()
        for module_name, module in model.named_modules():
            for attr, param in module.named_parameters(recurse=False):
                if id(param) in seen:
                    continue  # a tied weight: one parameter, loaded once
                seen.add(id(param))
                name = f"{module_name}.{attr}" if module_name else attr
                self.layers[name] = module
                self._wrap(name, module, param)

    def _wrap(self, name: str, layer: Any, param: Any) -> None:
        from vllm.model_executor.model_loader.weight_utils import (
            default_weight_loader,
        )

        had = "weight_loader" in vars(param) or hasattr(type(param), "weight_loader")
        original = getattr(param, "weight_loader", None) if had else None
        loader = original if original is not None else default_weight_loader
        own = loader is not default_weight_loader

        @functools.wraps(loader)
        def checked(p: Any, loaded: Any, *args: Any, **kwargs: Any) -> Any:
            shard_id = args[0] if args else kwargs.get("loaded_shard_id")
            if shard_id is None:
                shard_id = kwargs.get("shard_id")
            self.check(name, layer, p, loaded, shard_id, own)
            self.filled.setdefault(name, set()).add(shard_id)
            return loader(p, loaded, *args, **kwargs)

        param.weight_loader = checked
        self._restore.append((param, had, original))

    def check(
        self, name: str, layer: Any, param: Any, loaded: Any, shard: Any, own: bool
    ) -> None:
        want = expected_shape(layer, param, shard, own)
        found = tuple(int(d) for d in loaded.shape)
        if want is None or _fits(want, found):
            return
        slot = (
            f" (shard {shard!r} of {type(layer).__name__})" if shard is not None else ""
        )
        raise CheckpointError(
            f"checkpoint tensor {self.current!r} does not fit parameter {name!r}"
            f"{slot}: expected shape {list(want)}, found {list(found)}. The "
            f"checkpoint at {self.where} does not match the model its config.json "
            "describes; re-export it (or fix config.json) instead of serving it."
        )

    def weights(self, source: Iterator[tuple[str, Any]]) -> Iterator[tuple[str, Any]]:
        """The checkpoint's tensors, remembering which one is being loaded."""
        for name, tensor in source:
            self.current = name
            yield name, tensor

    def restore(self) -> None:
        for param, had, original in self._restore:
            if had:
                param.weight_loader = original
            else:
                del param.weight_loader
        self._restore.clear()

    def missing(self, reported: set[str] | None) -> list[str]:
        """Parameters (or shards of merged ones) no checkpoint tensor filled."""
        from vllm.model_executor.layers.quantization.kv_cache import BaseKVCacheMethod

        out = []
        for name, layer in self.layers.items():
            if isinstance(getattr(layer, "quant_method", None), BaseKVCacheMethod):
                continue  # KV-cache scales: vLLM fills defaults after loading
            got = self.filled.get(name)
            if got is None:
                if reported is None or name not in reported:
                    out.append(name)
                continue
            shards = shards_of(layer)
            if shards and None not in got:
                lacking = [s for s in shards if s not in got]
                if lacking:
                    out.append(f"{name} (shard {', '.join(map(repr, lacking))})")
        return out


def _check_target(module: ModuleType, original: Any) -> str | None:
    return (
        expect_params(original, "DefaultModelLoader.load_weights", _PARAMS)
        or expect_call(original, "DefaultModelLoader.load_weights", "get_all_weights")
        or expect_call(original, "DefaultModelLoader.load_weights", "load_weights")
    )


def _make(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def load_weights(self: Any, model: Any, model_config: Any) -> Any:
        recorder = _Recorder(model, str(getattr(model_config, "model", "?")))
        reported: dict[str, set[str] | None] = {"names": None}
        get_all = self.get_all_weights
        model_load = model.load_weights

        def tracked(*args: Any, **kwargs: Any) -> Iterator[tuple[str, Any]]:
            return recorder.weights(get_all(*args, **kwargs))

        def reporting(weights: Any) -> Any:
            names = model_load(weights)
            reported["names"] = None if names is None else set(names)
            return names

        self.get_all_weights = tracked
        model.load_weights = reporting
        try:
            result = original(self, model, model_config)
        finally:
            del self.get_all_weights
            del model.load_weights
            recorder.restore()
        if model_config.quantization not in CHECKED_QUANTIZATION:
            return result
        missing = recorder.missing(reported["names"])
        if missing:
            shown = ", ".join(missing[:20])
            more = f" and {len(missing) - 20} more" if len(missing) > 20 else ""
            raise CheckpointError(
                f"{len(missing)} model parameter(s) were not initialized from the "
                f"checkpoint at {recorder.where}: {shown}{more}. It lacks their "
                "tensors (a deleted or renamed tensor, a partial download?); restore "
                "the complete checkpoint instead of serving uninitialized weights."
            )
        return result

    return load_weights


PATCH = AttributePatch(
    NAME, MODULE, "DefaultModelLoader.load_weights", _make, _check_target
)


def apply() -> bool:
    """Install the guard (imports vLLM's model loader); True when this call did.

    A vLLM whose loader differs keeps its own checks, with a warning saying what
    differs.
    """
    return PATCH.apply_or_warn(
        "checkpoints are loaded without the plugin's shape and completeness checks"
    )


RUNTIME_PATCHES = {NAME: lambda phase: apply()}  # phases.apply_phase's hook


def revert() -> None:
    PATCH.revert()
