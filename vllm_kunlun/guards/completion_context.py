"""Runtime patch ``completion_context_length``: a ``/v1/completions`` request whose
prompt plus ``max_tokens`` does not fit the context is a 400 that names the prompt
length, ``max_tokens`` (and its default), ``max_model_len`` and the fix.

Why: vLLM 0.15.1's completion route checks the prompt against ``max_model_len -
max_tokens`` and reports that difference as "This model's maximum context length is
<max_model_len - max_tokens> tokens", with ``param`` ``input_tokens`` and no word of
``max_tokens``. A client that sent ``max_tokens`` 2 to a server with 2 speculative
tokens read it as the drafts counted against its prompt; one that sent no
``max_tokens`` is told the context is ``max_model_len - 16`` (the route's default
``max_tokens``, the OpenAI API's). Speculative drafts do not count: the scheduler caps
their lookahead at ``max_model_len``, and a prompt of ``max_model_len - k`` tokens gets
its ``k`` tokens with and without MTP (tests/integration/test_serve_structured.py). The
chat route's message is already right.
How: ``OpenAIServingCompletion.render_completion_request`` (the completion and
``/v1/completions/render`` routes) is wrapped. A request with a ``max_tokens`` in
``[0, max_model_len]`` is rendered as if it had none (vLLM then refuses only a prompt
longer than ``max_model_len``, with its own message), and each rendered prompt is then
checked against ``max_model_len - max_tokens``: one that does not fit gets vLLM's own
``create_error_response`` (400, ``param`` ``max_tokens``) with the numbers and the fix.
A request whose ``max_tokens`` is ``null`` (as many as fit) is rendered as it
is, and a prompt that leaves no room for one output token gets the same kind of 400
(vLLM said only "max_tokens must be at least 1, got 0"). A ``max_tokens`` outside that
range keeps vLLM's path.
Installed with the engine guards where vLLM's API server is imported (``vllm serve``).
Removal: when vLLM's completion route names max_tokens in its context-length message.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from types import ModuleType
from typing import Any

from vllm_kunlun.guards.app_middleware import API_SERVER
from vllm_kunlun.patching.attribute import AttributePatch, OptionalPatch, expect_params

NAME = "completion_context_length"
MODULE = "vllm.entrypoints.openai.completion.serving"
ATTR = "OpenAIServingCompletion.render_completion_request"


def prompt_length(prompt: Any) -> int | None:
    """Tokens in one rendered prompt (token ids or embeddings), or None."""
    if not isinstance(prompt, dict):
        return None
    ids = prompt.get("prompt_token_ids")
    if ids is not None:
        return len(ids)
    embeds = prompt.get("prompt_embeds")
    return int(embeds.shape[0]) if embeds is not None else None


def context_problem(
    lengths: Sequence[int], max_tokens: int, defaulted: bool, max_model_len: int
) -> str | None:
    """Why prompts of ``lengths`` tokens plus ``max_tokens`` do not fit, or None."""
    if not lengths:
        return None
    longest = max(lengths)
    if longest + max_tokens <= max_model_len:
        return None
    which = "The prompt"
    if len(lengths) > 1:
        which = f"Prompt {lengths.index(longest) + 1} of {len(lengths)}"
    asked = f"max_tokens is {max_tokens}"
    if defaulted:
        asked = (
            f"max_tokens is {max_tokens} (not set: /v1/completions defaults to "
            f"{max_tokens}, the OpenAI API's default)"
        )
    room = max_model_len - longest
    fix = (
        f"set max_tokens to at most {room} or send a shorter prompt"
        if room > 0
        else "send a shorter prompt"
    )
    return (
        f"{which} has {longest} tokens and {asked}: {longest} + {max_tokens} is "
        f"more than this model's maximum context length of {max_model_len} tokens "
        f"(--max-model-len); {fix}. Speculative draft tokens do not count."
    )


def no_room_problem(lengths: Sequence[int], max_model_len: int) -> str | None:
    """Why prompts of ``lengths`` tokens leave no room for one output token under
    ``max_tokens`` null (as many as fit), or None."""
    if not lengths or max(lengths) < max_model_len:
        return None
    longest = max(lengths)
    return (
        f"The prompt has {longest} tokens and max_tokens is null (as many as fit): "
        f"no room for one output token in this model's maximum context length of "
        f"{max_model_len} tokens (--max-model-len); send a prompt of at most "
        f"{max_model_len - 1} tokens."
    )


def _make(original: Any) -> Any:
    @functools.wraps(original)
    async def render_completion_request(self: Any, request: Any) -> Any:
        max_model_len = getattr(self, "max_model_len", None)
        max_tokens = getattr(request, "max_tokens", None)
        if not isinstance(max_model_len, int) or not (
            max_tokens is None
            or (isinstance(max_tokens, int) and 0 <= max_tokens <= max_model_len)
        ):
            return await original(self, request)
        if max_tokens is None:
            rendered = await original(self, request)
        else:
            unbounded = request.model_copy(update={"max_tokens": None})
            rendered = await original(self, unbounded)
        if not isinstance(rendered, list):
            return rendered  # vLLM's own error response
        lengths = [prompt_length(prompt) for prompt in rendered]
        known = [n for n in lengths if n is not None]
        if max_tokens is None:
            problem = no_room_problem(known, max_model_len)
        else:
            defaulted = "max_tokens" not in request.model_fields_set
            problem = context_problem(known, max_tokens, defaulted, max_model_len)
        if problem is not None:
            return self.create_error_response(problem, param="max_tokens")
        return rendered

    return render_completion_request


def _check(module: ModuleType, original: Any) -> str | None:
    return expect_params(original, ATTR, ("self", "request"))


PATCH = AttributePatch(NAME, MODULE, ATTR, _make, _check)
# Only where vLLM's API server is imported (``vllm serve``).
GUARD = OptionalPatch(
    NAME,
    (PATCH,),
    "a completion that does not fit the context is refused with vLLM's message, "
    "which reports max_model_len - max_tokens as the context length",
    only_where=API_SERVER,
)
install, installed, uninstall = GUARD.install, GUARD.installed, GUARD.uninstall
RUNTIME_PATCHES = GUARD.hooks()
