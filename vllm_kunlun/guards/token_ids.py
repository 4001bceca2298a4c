"""Runtime patch ``engine_token_id_guard``: a prompt token id outside the vocabulary is
a bad request, not a dead engine.

Why: vLLM 0.15.1 checks prompt token ids in ``InputProcessor._validate_model_input``
against ``max(tokenizer.max_token_id, vocab_size - 1)`` and checks only the largest id.
``max_token_id`` of a Hugging Face tokenizer includes ``tokenizer.vocab_size``, a count,
so an id equal to the vocabulary size passes; a negative id is never checked. Both
reach the embedding lookup in the engine core, where the IndexError kills the engine:
one request ``{"prompt": [-1, 5]}`` takes the whole server down.
How: the patch wraps that method and, before vLLM's own checks, refuses any id outside
``[0, bound)`` with a ``ValueError`` (the OpenAI server answers it with 400,
``LLM.generate`` raises it). ``bound`` is the larger of the model's vocabulary (its
embedding rows) and the tokenizer's length (its highest id + 1): vLLM's own notion of
"beyond both vocabularies", without the off-by-one. The check is one ``min()`` and one
``max()`` over the id list (C loops, about a millisecond per 100k ids); the position of a
bad id is looked up only when there is one.
Installed with the engine guards (``KunlunPlatformBase.pre_register_and_update`` and the
general plugin). Removal: when vLLM checks both bounds itself.
"""

from __future__ import annotations

import functools
from types import ModuleType
from typing import Any

from vllm_kunlun.logger import init_logger
from vllm_kunlun.patching.attribute import AttributePatch, OptionalPatch, expect_params

logger = init_logger(__name__)

NAME = "engine_token_id_guard"
_PARAMS = ("self", "prompt_inputs", "prompt_type")


class TokenIdError(ValueError):
    """A prompt token id outside the model's vocabulary."""


def vocab_bound(model_vocab: int, tokenizer: Any | None) -> int:
    """One past the largest valid id: model vocabulary or tokenizer length."""
    if tokenizer is None:
        return int(model_vocab)
    return max(int(model_vocab), len(tokenizer))


def check_token_ids(ids: Any, bound: int, what: str = "prompt") -> None:
    """Raise ``TokenIdError`` unless every id is in ``[0, bound)``.

    ``ids`` is a list of ints (vLLM 0.15.1's prompts) or a tensor / array.
    """
    if len(ids) == 0:
        return
    if isinstance(ids, (list, tuple)):
        low, high = min(ids), max(ids)
    else:
        low, high = int(ids.min()), int(ids.max())
    if low >= 0 and high < bound:
        return
    bad = low if low < 0 else high
    position = next(i for i, t in enumerate(ids) if int(t) == bad)
    raise TokenIdError(
        f"Token id {bad} at position {position} of the {what} is out of vocabulary: "
        f"token ids must be in [0, {bound}) for this model"
    )


def _check_target(module: ModuleType, original: Any) -> str | None:
    return expect_params(original, "InputProcessor._validate_model_input", _PARAMS)


def _make_guard(original: Any) -> Any:
    @functools.wraps(original)
    def guarded(self: Any, prompt_inputs: Any, *, prompt_type: str) -> Any:
        if prompt_inputs.get("type") != "embeds":
            bound = vocab_bound(self.model_config.get_vocab_size(), self.tokenizer)
            ids = prompt_inputs.get("prompt_token_ids")
            if ids is not None:
                check_token_ids(ids, bound, f"{prompt_type} prompt")
        return original(self, prompt_inputs, prompt_type=prompt_type)

    return guarded


PATCH = AttributePatch(
    NAME,
    "vllm.v1.engine.input_processor",
    "InputProcessor._validate_model_input",
    _make_guard,
    _check_target,
)


# A vLLM whose method differs keeps its own check, with a warning.
GUARD = OptionalPatch(
    NAME, (PATCH,), "out-of-vocabulary prompt token ids are checked by vLLM alone"
)
install, installed, uninstall, RUNTIME_PATCHES = GUARD.bindings()
