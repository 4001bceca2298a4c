"""Runtime patch ``speculative_config_limits``: vLLM's own ``EngineArgs``, with the
patch, refuses a huge ``num_speculative_tokens`` and a non-object config at once with a
message naming the limit and the fix, and hands every other config to vLLM unchanged."""

from __future__ import annotations

import time
from collections.abc import Iterator
from types import SimpleNamespace

import pytest
from vllm.engine.arg_utils import EngineArgs

from tests.conftest import patch_state
from vllm_kunlun.guards import speculative_limits as guard


@pytest.fixture
def patched() -> Iterator[None]:
    with patch_state(guard, on=True):
        yield


def _create(config: object) -> object:
    """vLLM's method on arguments holding ``config`` (what the CLI's JSON parser leaves
    there); the rest of EngineArgs is not read by it."""
    args = SimpleNamespace(speculative_config=config, enable_prefix_caching=False)
    return EngineArgs.create_speculative_config(args, None, None)


@pytest.mark.usefixtures("patched")
@pytest.mark.parametrize(
    ("config", "words"),
    [
        ({"method": "mtp", "num_speculative_tokens": 1_000_000_000}, "[1, 16]"),
        ({"method": "mtp", "num_speculative_tokens": 17}, "[1, 16]"),
        ({"method": "mtp", "num_speculative_tokens": 0}, "[1, 16]"),
        ({"method": "mtp", "num_speculative_tokens": 2.5}, "whole number"),
        ({"method": "mtp", "num_speculative_tokens": True}, "whole number"),
        ([1, 2], "must be a JSON object, got list"),
        ("mtp", "must be a JSON object, got str"),
    ],
    ids=["1e9", "17", "0", "float", "bool", "list", "string"],
)
def test_refused_at_once_naming_the_cause(config: object, words: str) -> None:
    start = time.monotonic()
    with pytest.raises(guard.SpeculativeConfigError) as refused:
        _create(config)
    assert time.monotonic() - start < 5  # vLLM alone: minutes and 16 GB for 1e9
    assert words in str(refused.value)
    assert "VLLM_KUNLUN_MAX_SPEC_TOKENS" in str(refused.value) or "JSON object" in words


@pytest.mark.usefixtures("patched")
def test_the_limit_follows_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VLLM_KUNLUN_MAX_SPEC_TOKENS", "32")
    with pytest.raises(guard.SpeculativeConfigError, match=r"\[1, 32\]"):
        _create({"method": "mtp", "num_speculative_tokens": 33})


@pytest.mark.usefixtures("patched")
@pytest.mark.parametrize(
    "config",
    [{"method": "mtp", "num_speculative_tokens": 2}, {"method": "mtp"}],
    ids=["within", "default_count"],
)
def test_configs_within_the_limit_reach_vllm(config: dict) -> None:
    """No model config is given here, so vLLM's own SpeculativeConfig refuses: the
    refusal is vLLM's, not the guard's."""
    with pytest.raises(Exception) as raised:
        _create(dict(config))
    assert not isinstance(raised.value, guard.SpeculativeConfigError)


def test_no_config_is_no_speculation() -> None:
    assert _create(None) is None


@pytest.mark.usefixtures("patched")
@pytest.mark.parametrize(
    ("hybrid", "caching", "mode", "refused"),
    [
        (True, True, None, True),
        (True, True, "align", True),
        (True, False, None, False),
        (False, True, None, False),
    ],
)
def test_prefix_caching_with_speculation_on_a_hybrid_model_is_named(
    hybrid: bool, caching: bool, mode: str | None, refused: bool
) -> None:
    args = SimpleNamespace(
        speculative_config={"method": "mtp", "num_speculative_tokens": 1},
        enable_prefix_caching=caching,
        mamba_cache_mode=mode,
    )
    target = SimpleNamespace(is_hybrid=hybrid, supports_mamba_prefix_caching=False)
    if refused:
        with pytest.raises(guard.SpeculativeConfigError) as err:
            EngineArgs.create_speculative_config(args, target, None)
        assert "prefix caching" in str(err.value)
        assert "--no-enable-prefix-caching" in str(err.value)
    else:
        with pytest.raises(Exception) as raised:  # vLLM's own, on the fake config
            EngineArgs.create_speculative_config(args, target, None)
        assert not isinstance(raised.value, guard.SpeculativeConfigError)
