"""Runtime patch ``grammar_error_cause``: a structured-output request with a bad
grammar, regex or schema is a 400 that names the problem.

Why: vLLM 0.15.1 checks a request's constraint with xgrammar in the API server and
answers a ``ValueError`` with 400, but for an EBNF grammar and a schema that is not JSON
the message is only "Invalid grammar specification." / "Invalid JSON grammar
specification." (xgrammar's reason, e.g. which rule is undefined, is chained as the
cause and dropped), and for choices it prints a literal ``{err}``.
How: ``validate_xgrammar_grammar``, as the input processor calls it, is wrapped: a
``ValueError`` whose chained cause is not in its message is raised again with the
cause appended (xgrammar's ``[time] file.cc:line:`` prefix removed). Requests that pass
are untouched; the engine never sees a bad constraint either way.
On the Kunlun platform (not in host emulation) a structured-output request is also a
400 naming the fix when patch 07 of the patch set is not in the installed vLLM: without
it xgrammar sends the mask of a "cuda" tensor to its Triton kernel, which does not run
on Kunlun, and the step fails in the model process.
Installed with the engine guards (``Phase.FRONT_END``: the processes that parse
requests).
Removal: when vLLM's messages carry xgrammar's reason.
"""

from __future__ import annotations

import functools
import re
from types import ModuleType
from typing import Any

from vllm_kunlun.patching.attribute import AttributePatch, OptionalPatch, expect_params

NAME = "grammar_error_cause"
MODULE = "vllm.v1.engine.input_processor"
ATTR = "validate_xgrammar_grammar"
_PREFIX = re.compile(r"^\[[0-9:]+\] \S+:\d+: ")


def cause_text(exc: BaseException) -> str:
    """The reason a grammar library gave, without its log prefix."""
    return _PREFIX.sub("", str(exc).strip())


def with_cause(exc: ValueError) -> ValueError:
    """``exc`` or a ValueError whose message also names its chained cause."""
    cause = exc.__cause__
    if cause is None:
        return exc
    reason = cause_text(cause)
    message = str(exc).replace("{err}", "").rstrip(": .")
    if not reason or reason in message:
        return exc
    return ValueError(f"{message}: {reason}")


PATCH_07_FUNCTION = "_apply_token_bitmask_torch_native"
"""What patch 07 adds to vllm/v1/structured_output/utils.py."""
PATCH_07_MISSING = (
    "structured output on Kunlun needs patch 07 of the patch_torch251 set (xgrammar's "
    "Triton mask kernel does not run on Kunlun) and the installed vLLM does not have "
    "it: run `vllm-kunlun patch apply` and restart the server"
)


def patch_07_refusal(platform: Any = None, utils: Any = None) -> str | None:
    """Why this process cannot serve structured output, or None: the Kunlun platform
    (device type "cuda") on a vLLM without patch 07. Host emulation masks CPU tensors
    with xgrammar's CPU kernel, so it needs no patch."""
    if platform is None:
        import vllm.platforms

        platform = vllm.platforms.current_platform
    if not getattr(platform, "is_vllm_kunlun_platform", False):
        return None
    if getattr(platform, "device_type", "") != "cuda":
        return None
    if utils is None:
        import vllm.v1.structured_output.utils

        utils = vllm.v1.structured_output.utils
    return None if hasattr(utils, PATCH_07_FUNCTION) else PATCH_07_MISSING


def _check(module: ModuleType, original: Any) -> str | None:
    return expect_params(original, ATTR, ("sampling_params",))


def _make(original: Any) -> Any:
    @functools.wraps(original)
    def validate_xgrammar_grammar(sampling_params: Any) -> None:
        if getattr(sampling_params, "structured_outputs", None) is not None:
            refusal = patch_07_refusal()
            if refusal is not None:
                raise ValueError(refusal)
        try:
            original(sampling_params)
        except ValueError as exc:
            named = with_cause(exc)
            if named is exc:
                raise
            raise named from exc.__cause__

    return validate_xgrammar_grammar


PATCH = AttributePatch(NAME, MODULE, ATTR, _make, _check)


# A vLLM that differs keeps its own messages, with a warning.
GUARD = OptionalPatch(NAME, (PATCH,), "a bad grammar's 400 may not name the problem")
install, installed, uninstall, RUNTIME_PATCHES = GUARD.bindings()
