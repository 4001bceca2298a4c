"""Gemma 2 configs saved by transformers 5.2.0 lack ``hidden_act``; vLLM 0.15.1 reads it.

Why: vLLM's ``Gemma2ForCausalLM`` builds its MLP with ``config.hidden_act`` and
``config.hidden_activation`` and requires both to be ``gelu_pytorch_tanh``. Released
Gemma 2 ``config.json`` files carry both keys, but transformers 5.2.0's ``Gemma2Config``
knows only ``hidden_activation``: a checkpoint it saves (a fine-tune, a conversion, the
tests' tiny ones) has no ``hidden_act``, and the model build dies with
``AttributeError: 'Gemma2Config' object has no attribute 'hidden_act'``.
How: when the platform checks the engine config (before any model is built, in every
process that builds one), a Gemma 2 text config without ``hidden_act`` gets the value
of its ``hidden_activation``, logged once. Nothing else is touched.
Removal: when vLLM reads ``hidden_activation`` alone (as its Gemma 3 model does).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from vllm_kunlun.logger import init_logger

if TYPE_CHECKING:
    from vllm.config import VllmConfig

logger = init_logger(__name__)


def fill_hidden_act(vllm_config: VllmConfig) -> bool:
    """Give a Gemma 2 text config without ``hidden_act`` its ``hidden_activation``;
    True when it did."""
    config = getattr(getattr(vllm_config, "model_config", None), "hf_text_config", None)
    if config is None or getattr(config, "model_type", None) != "gemma2":
        return False
    activation = getattr(config, "hidden_activation", None)
    if getattr(config, "hidden_act", None) is not None or activation is None:
        return False
    config.hidden_act = activation
    logger.info_once(
        "vllm-kunlun: the Gemma 2 config has no hidden_act (transformers 5.2.0 saves "
        "hidden_activation only); vLLM's Gemma 2 reads both: hidden_act = %r",
        activation,
    )
    return True
