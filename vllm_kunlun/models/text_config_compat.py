"""Runtime patch ``composite_tied_embeddings``: a composite's text config carries the
composite's ``tie_word_embeddings``.

Why: transformers 5.2.0 keeps ``tie_word_embeddings`` on the top level of a composite
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
How: ``vllm.config.model.get_hf_text_config`` (what ``ModelConfig.__post_init__`` calls
to pick the text config) first copies the composite's flag onto its text config when the
two are different objects and the composite has the flag. The config objects travel to
the engine core and workers pickled, with the flag set. Text-only configs are untouched.
Applied where engine arguments become a config (``Phase.FRONT_END``). Removal: when the
validated vLLM reads the flag from the composite (or transformers puts it back on the
text config).
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

NAME = "composite_tied_embeddings"
MODULE = "vllm.config.model"
FLAG = "tie_word_embeddings"


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
        return original(config)

    get_hf_text_config.__wrapped__ = original  # type: ignore[attr-defined]
    return get_hf_text_config


PATCH = AttributePatch(NAME, MODULE, "get_hf_text_config", _make, _check)


def apply() -> bool:
    """True when this call applied it; a mismatch warns (vLLM then fails on these
    checkpoints as it does without the plugin)."""
    return PATCH.apply_or_warn(
        "composite checkpoints whose text config lacks tie_word_embeddings fail at "
        "model init"
    )


# phases.apply_phase's hook (patching/phases.py)
RUNTIME_PATCHES = {NAME: lambda phase: apply()}


def revert() -> None:
    PATCH.revert()
