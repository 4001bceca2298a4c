"""Runtime patch ``kunlun_qwen3_5_mtp_config``: ``method: mtp`` on Qwen3.5 checkpoints.

Why: vLLM 0.15.1 builds the MTP draft's model config with
``SpeculativeConfig.hf_config_override``, which maps the model types it knows
(``qwen3_next`` -> ``qwen3_next_mtp`` / ``Qwen3NextMTP`` ...) and leaves ``qwen3_5``
alone; ``__post_init__`` then refuses the draft ("Unsupported speculative method:
'mtp'"), whatever name the user gave (``mtp``, ``qwen3_next_mtp``; ``qwen3_5_mtp`` is not
a method vLLM's config type accepts).
How: two attributes of ``vllm.config.speculative``, both or neither:
- ``SpeculativeConfig.hf_config_override`` also maps ``qwen3_5`` / ``qwen3_5_text`` to
  model type ``qwen3_5_mtp`` with architecture ``Qwen3_5MTP``, and ``qwen3_5_moe`` /
  ``qwen3_5_moe_text`` to ``qwen3_5_mtp`` with ``Qwen3_5MoeMTP`` (``n_predict`` =
  ``mtp_num_hidden_layers``): the plugin's draft models (``models/qwen3_5_mtp.py``);
  the draft's config drops ``mrope_section`` (text only, M-RoPE is the plain rotary
  embedding; vLLM 0.15.1's proposer with an M-RoPE draft and more than one
  speculative token reads ``self.positions``, which it creates only without M-RoPE);
- ``MTPModelTypes`` (the names ``__post_init__`` treats as MTP drafts) gains
  ``qwen3_5_mtp``.
With them ``mtp`` and ``qwen3_next_mtp`` (vLLM rewrites the latter to ``mtp``) both
serve Qwen3.5; ``qwen3_5_mtp`` as a method fails in vLLM's argument validation, whose
list of accepted names includes ``mtp``.
Applied where engine arguments become a config (``Phase.FRONT_END``). Removal: when
the validated vLLM maps Qwen3.5 to an MTP draft itself.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any, Literal, get_args

from vllm_kunlun.logger import init_logger
from vllm_kunlun.patching.attribute import (
    AttributePatch,
    apply_group_or_warn,
    expect_caller,
    expect_params,
)

logger = init_logger(__name__)

NAME = "kunlun_qwen3_5_mtp_config"
MODULE = "vllm.config.speculative"
MTP_MODEL_TYPE = "qwen3_5_mtp"
# target model type (composite or text config) -> draft architecture
DRAFTS = {
    "qwen3_5": "Qwen3_5MTP",
    "qwen3_5_text": "Qwen3_5MTP",
    "qwen3_5_moe": "Qwen3_5MoeMTP",
    "qwen3_5_moe_text": "Qwen3_5MoeMTP",
}


def draft_override(hf_config: Any) -> Any:
    """Qwen3.5 configs -> the plugin's MTP draft (in place, as vLLM's override)."""
    model_type = getattr(hf_config, "model_type", None)
    arch = DRAFTS.get(model_type)  # type: ignore[arg-type]
    if arch is None:
        return hf_config
    text = getattr(hf_config, "text_config", None) or hf_config
    # Text-only M-RoPE (three equal position rows) is the plain rotary embedding;
    # a draft config without mrope_section gets 1-D positions from vLLM's proposer,
    # whose multi-token M-RoPE path reads a buffer it never creates (self.positions).
    for cfg in {id(c): c for c in (hf_config, text)}.values():
        rope = getattr(cfg, "rope_parameters", None)
        if isinstance(rope, dict) and "mrope_section" in rope:
            cfg.rope_parameters = {
                k: v for k, v in rope.items() if k not in ("mrope_section",)
            }
    hf_config.model_type = MTP_MODEL_TYPE
    hf_config.update(
        {
            "n_predict": int(getattr(text, "mtp_num_hidden_layers", 1) or 1),
            "architectures": [arch],
        }
    )
    return hf_config


def _check_override(module: ModuleType, original: Any) -> str | None:
    return expect_params(
        original, "SpeculativeConfig.hf_config_override", ("hf_config",)
    ) or expect_caller(module, "SpeculativeConfig.__post_init__", "SpeculativeConfig")


def hf_config_override(hf_config: Any) -> Any:
    """vLLM's override, then ``draft_override``. Module-level: the draft's
    ``ModelConfig`` keeps it as ``hf_overrides`` and is pickled to the engine core."""
    from vllm.config.speculative import SpeculativeConfig

    upstream = SpeculativeConfig.hf_config_override
    if upstream is hf_config_override:  # patched in this process
        original = OVERRIDE_PATCH._original
        upstream = getattr(original, "__func__", original)
    return draft_override(upstream(hf_config))


def _make_override(original: Any) -> Any:
    return staticmethod(hf_config_override)


def _check_types(module: ModuleType, original: Any) -> str | None:
    names = get_args(original)
    if "mtp" not in names:
        return f"MTPModelTypes is not a Literal of MTP names (found {names!r})"
    return expect_caller(module, "SpeculativeConfig.__post_init__", "MTPModelTypes")


def _make_types(original: Any) -> Any:
    names = get_args(original)
    if MTP_MODEL_TYPE in names:
        return original
    return Literal[(*names, MTP_MODEL_TYPE)]  # type: ignore[valid-type]


OVERRIDE_PATCH = AttributePatch(
    NAME,
    MODULE,
    "SpeculativeConfig.hf_config_override",
    _make_override,
    _check_override,
)
PATCHES: tuple[AttributePatch, ...] = (
    OVERRIDE_PATCH,
    AttributePatch(NAME, MODULE, "MTPModelTypes", _make_types, _check_types),
)


def apply() -> bool:
    """Both attributes or neither; True when this call applied them. A mismatch warns:
    vLLM then refuses ``method: mtp`` on Qwen3.5 itself."""
    return apply_group_or_warn(
        PATCHES, "MTP speculative decoding on Qwen3.5 is unavailable"
    )


# phases.apply_phase's hook (patching/phases.py)
RUNTIME_PATCHES = {NAME: lambda phase: apply()}


def revert() -> None:
    for patch in reversed(PATCHES):
        patch.revert()
