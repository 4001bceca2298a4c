"""Runtime patch ``transformers5_config_fields``: the config fields vLLM 0.15.1 reads
that a config written by transformers 5.2.0 no longer has.

Why, 1: transformers 5.2.0 keeps ``tie_word_embeddings`` on the top level of a composite
(vision-language) config and decides the tying there (``PreTrainedModel`` reads
``self.config.tie_word_embeddings`` of the ``...ForConditionalGeneration``, whose config
is the composite; Llava-style configs even lift an old ``text_config`` flag to the top
level). Several text configs of 5.2.0 no longer declare the flag at all
(``Qwen2VLTextConfig``, ``Qwen2_5_VLTextConfig``, ``Qwen3VLTextConfig``,
``Qwen3VLMoeTextConfig``, ``Glm4vTextConfig``, ``Glm4vMoeTextConfig``), while vLLM 0.15.1
builds the language model on the text config and reads the flag there (``qwen2.py``,
``qwen3.py``, ``qwen3_vl.py``, ``glm4.py``...): every such checkpoint fails at model init
with ``AttributeError: '...TextConfig' object has no attribute 'tie_word_embeddings'``.
A text config that does declare its own flag (Qwen3.5's) can disagree with the top
level; transformers serves the top level, so the plugin's models must too (else the
checkpoint guard refuses ``lm_head.weight`` that has no place, or an ``lm_head`` never
loaded).
Why, 2: transformers 5.2.0's ``BertConfig`` / ``RobertaConfig`` / ``XLMRobertaConfig``
dropped ``position_embedding_type`` (their models implement absolute positions only), and
vLLM's ``XLMRobertaModel`` config check reads it unguarded
(``JinaRobertaModelConfig``): a BGE-M3-class checkpoint saved by 5.2.0 fails at
engine start with ``AttributeError``. Hub files written by older versions carry the field.
How: ``vllm.config.model.get_hf_text_config`` (what ``ModelConfig.__post_init__`` calls
to pick the text config) first copies the composite's flag onto its text config when the
two are different objects and the composite has the flag, and gives a BERT-family config
without ``position_embedding_type`` the value ``"absolute"`` (what 5.2.0's models do).
Both run before vLLM's per-architecture config checks. The config objects travel to the
engine core and workers pickled, with the fields set. Other configs are untouched.
Applied where engine arguments become a config (``Phase.FRONT_END``). Removal: when the
validated vLLM reads the flag from the composite and guards ``position_embedding_type``.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

from vllm_kunlun.logger import init_logger
from vllm_kunlun.patching.attribute import (
    AttributePatch,
    expect_caller,
    expect_params,
)

logger = init_logger(__name__)

NAME = "transformers5_config_fields"
MODULE = "vllm.config.model"
FLAG = "tie_word_embeddings"
POSITIONS = "position_embedding_type"
# model types whose 5.2.0 config lost POSITIONS (absolute positions only)
ABSOLUTE_POSITIONS = ("bert", "roberta", "xlm-roberta")


def absolute_positions(hf_config: Any) -> bool:
    """Give a BERT-family config without ``position_embedding_type`` the value
    ``"absolute"``; True when it did."""
    if getattr(hf_config, "model_type", None) not in ABSOLUTE_POSITIONS:
        return False
    if hasattr(hf_config, POSITIONS):
        return False
    setattr(hf_config, POSITIONS, "absolute")
    logger.info_once(
        "vllm-kunlun: %s has no %s (transformers 5 implements absolute positions "
        "only); vLLM reads it, so it is 'absolute'",
        type(hf_config).__name__,
        POSITIONS,
    )
    return True


def carry_tie_flag(hf_config: Any) -> bool:
    """Set the text config's ``tie_word_embeddings`` to the composite's; True when it
    changed (was missing or disagreed). A text-only config is left alone."""
    get_text = getattr(hf_config, "get_text_config", None)
    text = get_text() if callable(get_text) else hf_config
    if text is hf_config or FLAG not in vars(hf_config):
        return False
    tied = bool(vars(hf_config)[FLAG])
    own = vars(text).get(FLAG)
    if own is not None and bool(own) == tied:
        return False
    setattr(text, FLAG, tied)
    if own is None:
        logger.info_once(
            "vllm-kunlun: %s has no %s (transformers 5 keeps it on %s); vLLM reads "
            "it there, so it takes the composite's value %s",
            type(text).__name__,
            FLAG,
            type(hf_config).__name__,
            tied,
        )
    else:
        logger.warning_once(
            "vllm-kunlun: %s sets %s=%s but the composite %s sets %s; serving the "
            "composite's value as transformers does",
            type(text).__name__,
            FLAG,
            bool(own),
            type(hf_config).__name__,
            tied,
        )
    return True


def _check(module: ModuleType, original: Any) -> str | None:
    return expect_params(original, "get_hf_text_config", ("config",)) or expect_caller(
        module, "ModelConfig.__post_init__", "get_hf_text_config"
    )


def _make(original: Any) -> Any:
    def get_hf_text_config(config: Any) -> Any:
        carry_tie_flag(config)
        absolute_positions(config)
        return original(config)

    get_hf_text_config.__wrapped__ = original  # type: ignore[attr-defined]
    return get_hf_text_config


PATCH = AttributePatch(NAME, MODULE, "get_hf_text_config", _make, _check)


def apply() -> bool:
    """True when this call applied it; a mismatch warns (vLLM then fails on these
    checkpoints as it does without the plugin)."""
    return PATCH.apply_or_warn(
        "composite checkpoints whose text config lacks tie_word_embeddings fail at "
        "model init, BERT-family ones without position_embedding_type at engine start"
    )


# phases.apply_phase's hook (patching/phases.py)
RUNTIME_PATCHES = {NAME: lambda phase: apply()}


def revert() -> None:
    PATCH.revert()
