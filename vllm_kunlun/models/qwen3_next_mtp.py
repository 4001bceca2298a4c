"""Runtime patch ``kunlun_qwen3_next_mtp_names``: vLLM's Qwen3-Next MTP draft here.

Why: vLLM 0.15.1's ``Qwen3NextMultiTokenPredictor`` names its decoder layers
``mtp.layers.<i>``. vLLM binds KV caches by the layer index in a layer's name
(``vllm.v1.worker.utils.bind_kv_cache``), so the draft's attention (index 0) shares an
index with the target's layer 0; on CUDA, CPU and XPU vLLM lets that pass, on an
out-of-tree platform it raises ``NotImplementedError`` at engine start:
``--speculative-config '{"method": "qwen3_next_mtp", ...}'`` never started here.

How: ``vllm.model_executor.models.qwen3_next_mtp.Qwen3NextDecoderLayer`` (the name the
predictor's constructor looks up) becomes a factory that builds vLLM's layer with the
index in its prefix moved past the target's layers (``num_hidden_layers + i``), as the
plugin's Qwen3.5 MTP head names its layers. Only the name changes: the module stays
``layers[i]`` of the predictor, so checkpoint names (``mtp.layers.<i>.*``) load as
before. The layer index also picks the layer's MLP kind (``mlp_only_layers``,
``decoder_sparse_step``); the plugin's Qwen3-Next refuses MTP where the moved index
would pick another kind (``mlp_kind_changes``). Applied in ``Phase.HYBRID_MODEL``
(the target's constructor runs before vLLM builds the draft, in the same process).

Removal: when vLLM names the MTP layers past the target's, or binds KV caches by name
on every platform.
"""

from __future__ import annotations

import re
import types
from types import ModuleType
from typing import Any

from vllm_kunlun.logger import init_logger
from vllm_kunlun.patching.attribute import AttributePatch, apply_group

logger = init_logger(__name__)

NAME = "kunlun_qwen3_next_mtp_names"
MODULE = "vllm.model_executor.models.qwen3_next_mtp"
_INDEX = re.compile(r"^(?P<head>.*\.layers\.)(?P<index>\d+)$")


def moved_prefix(prefix: str, num_hidden_layers: int) -> str:
    """``<...>.layers.<i>`` -> ``<...>.layers.<num_hidden_layers + i>``."""
    match = _INDEX.match(prefix)
    if match is None:
        raise ValueError(
            f"Qwen3-Next MTP layer prefix {prefix!r} does not end in .layers.<i>; "
            f"runtime patch {NAME} was written for vLLM 0.15.1's predictor"
        )
    return f"{match['head']}{num_hidden_layers + int(match['index'])}"


def _sparse(config: Any, index: int) -> bool:
    """Whether vLLM's Qwen3-Next gives layer ``index`` a sparse block."""
    only = list(getattr(config, "mlp_only_layers", None) or [])
    step = int(getattr(config, "decoder_sparse_step", 1) or 1)
    experts = int(getattr(config, "num_experts", 0) or 0)
    return index not in only and experts > 0 and (index + 1) % step == 0


def mlp_kind_changes(config: Any) -> list[int]:
    """MTP layers whose MLP kind the moved index would change (none for released
    configs: no ``mlp_only_layers``, ``decoder_sparse_step`` 1)."""
    n = int(config.num_hidden_layers)
    layers = int(getattr(config, "num_nextn_predict_layers", 1) or 1)
    return [i for i in range(layers) if _sparse(config, i) != _sparse(config, n + i)]


def _make(original: Any) -> Any:
    def decoder_layer(vllm_config: Any, layer_type: str, prefix: str = "") -> Any:
        n = int(vllm_config.model_config.hf_config.num_hidden_layers)
        return original(
            vllm_config, layer_type=layer_type, prefix=moved_prefix(prefix, n)
        )

    decoder_layer.__wrapped__ = original  # type: ignore[attr-defined]
    return decoder_layer


def _names(code: types.CodeType) -> set[str]:
    """Global names ``code`` and the code nested in it (a generator) look up."""
    out = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            out |= _names(const)
    return out


def _init_codes(init: Any) -> list[types.CodeType]:
    """The code of ``init`` and of the functions its closure holds: vLLM's
    ``support_torch_compile`` replaces a class's ``__init__`` with one that calls the
    original from its closure."""
    out = []
    for fn in (
        init,
        *(c.cell_contents for c in getattr(init, "__closure__", None) or ()),
    ):
        code = getattr(fn, "__code__", None)
        if isinstance(code, types.CodeType):
            out.append(code)
    return out


def _check(module: ModuleType, original: Any) -> str | None:
    import inspect

    try:
        params = tuple(inspect.signature(original.__init__).parameters)
    except (TypeError, ValueError):
        params = ()
    if params[:4] != ("self", "vllm_config", "layer_type", "prefix"):
        return f"Qwen3NextDecoderLayer.__init__ takes {params}"
    predictor = getattr(module, "Qwen3NextMultiTokenPredictor", None)
    codes = _init_codes(getattr(predictor, "__init__", None))
    if not any("Qwen3NextDecoderLayer" in _names(code) for code in codes):
        return (
            "Qwen3NextMultiTokenPredictor.__init__ no longer builds "
            "Qwen3NextDecoderLayer by its module-level name"
        )
    return None


PATCHES = (AttributePatch(NAME, MODULE, "Qwen3NextDecoderLayer", _make, _check),)


def apply() -> bool:
    """Install the patch (idempotent); True when this call did. A mismatching vLLM
    raises ``PatchMismatch`` naming what differs."""
    if not apply_group(PATCHES):
        return False
    logger.info("vllm-kunlun: hybrid-model runtime patch %s applied", NAME)
    return True


def revert() -> None:
    for p in reversed(PATCHES):
        p.revert()


# phases.apply_phase's hook (patching/phases.py)
RUNTIME_PATCHES = {NAME: lambda phase: apply()}
