"""Runtime patch ``speculative_config_limits``: a speculative config that is not an
object, or asks for more draft tokens than any drafter proposes, is refused at once
naming the cause and the fix.

Why: vLLM 0.15.1 builds the speculative config in the API server before any engine
starts (``EngineArgs.create_speculative_config``). ``SpeculativeConfig.__post_init__``
writes a default token tree whose text grows with the square of
``num_speculative_tokens``: ``{"method": "mtp", "num_speculative_tokens": 1000000000}``
grew the API server by 16 GB in 76 s, with nothing logged. A JSON value that is not an
object (``--speculative-config '[1,2]'``) ends in ``AttributeError: 'list' object has no
attribute 'update'``. With ``--enable-prefix-caching`` on a hybrid model (Qwen3.5,
Qwen3-Next) vLLM stops at ``AssertionError: Mamba cache mode 'align' is currently not
compatible with speculative decoding``, which names neither prefix caching nor the fix.
How: the method is wrapped; before vLLM's own code it refuses a non-object config and
a ``num_speculative_tokens`` that is not a whole number in
``[1, VLLM_KUNLUN_MAX_SPEC_TOKENS]`` (default 16: MTP heads propose 1 to 4, EAGLE trees
and n-gram lookups stay under 16), with a ``SpeculativeConfigError`` (a ValueError: the
CLI prints it, ``LLM(...)`` raises it), and refuses speculation on a hybrid model with
prefix caching on, naming both and the flag that fixes it.
Installed where engine arguments become a config (``Phase.FRONT_END``).
Removal: when vLLM bounds ``num_speculative_tokens`` and checks the config's type.
"""

from __future__ import annotations

import functools
from types import ModuleType
from typing import Any

from vllm_kunlun import envs
from vllm_kunlun.patching.attribute import AttributePatch, OptionalPatch, expect_params

NAME = "speculative_config_limits"
_PARAMS = ("self", "target_model_config", "target_parallel_config")


class SpeculativeConfigError(ValueError):
    """A speculative config refused before vLLM builds it."""


def max_spec_tokens() -> int:
    """The variable's value; its declared default when it is set but empty."""
    return int(
        envs.VLLM_KUNLUN_MAX_SPEC_TOKENS
        or envs.registry()["VLLM_KUNLUN_MAX_SPEC_TOKENS"].default
    )


def check_speculative_config(config: Any) -> None:
    """Raise ``SpeculativeConfigError`` unless ``config`` is None or an object whose
    ``num_speculative_tokens`` (when given) is a whole number within the limit."""
    if config is None:
        return
    if not isinstance(config, dict):
        raise SpeculativeConfigError(
            f"--speculative-config must be a JSON object, got {type(config).__name__} "
            f'{str(config)[:80]}; pass e.g. \'{{"method": "mtp", '
            '"num_speculative_tokens": 2}\''
        )
    num = config.get("num_speculative_tokens")
    if num is None:
        return
    limit = max_spec_tokens()
    if isinstance(num, bool) or not isinstance(num, int) or not 1 <= num <= limit:
        raise SpeculativeConfigError(
            f"num_speculative_tokens={num!r} is not a whole number in [1, {limit}]; "
            "drafters propose 1 to 4 tokens a step (MTP) and acceptance falls with "
            f"every further one: pass a number from 1 to {limit}, or raise "
            "VLLM_KUNLUN_MAX_SPEC_TOKENS on the server"
        )


def check_prefix_caching(args: Any, target_model_config: Any) -> None:
    """vLLM 0.15.1 tracks a hybrid model's prefix-cached states in mamba cache mode
    'align', which cannot hold speculative drafts ('all' could, where the model
    supports it)."""
    if args.speculative_config is None or not getattr(
        args, "enable_prefix_caching", False
    ):
        return
    if not getattr(target_model_config, "is_hybrid", False):
        return
    mode = getattr(args, "mamba_cache_mode", None)
    if mode == "all" and getattr(
        target_model_config, "supports_mamba_prefix_caching", False
    ):
        return
    raise SpeculativeConfigError(
        "speculative decoding and prefix caching cannot run together on this hybrid "
        "(linear-attention) model in vLLM 0.15.1: its prefix-cached states (mamba "
        "cache mode 'align') cannot hold draft tokens. Add --no-enable-prefix-caching "
        "(LLM(enable_prefix_caching=False)), or serve without --speculative-config"
    )


def _check_target(module: ModuleType, original: Any) -> str | None:
    return expect_params(original, "EngineArgs.create_speculative_config", _PARAMS)


def _make_guard(original: Any) -> Any:
    @functools.wraps(original)
    def guarded(
        self: Any, target_model_config: Any, target_parallel_config: Any
    ) -> Any:
        check_speculative_config(self.speculative_config)
        check_prefix_caching(self, target_model_config)
        return original(self, target_model_config, target_parallel_config)

    return guarded


PATCH = AttributePatch(
    NAME,
    "vllm.engine.arg_utils",
    "EngineArgs.create_speculative_config",
    _make_guard,
    _check_target,
)


GUARD = OptionalPatch(NAME, (PATCH,), "speculative configs are checked by vLLM alone")
install, installed, uninstall, RUNTIME_PATCHES = GUARD.bindings()
