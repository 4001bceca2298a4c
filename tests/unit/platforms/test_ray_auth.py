"""Ray's token authentication: where this host's token is, and the engine's connection
error naming it (Ray's connection faked; a real token-authenticated cluster is
rehearsed in docs/distributed.md)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from vllm_kunlun.platforms import ray_auth


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("HOME", str(tmp_path))
    for name in (
        "RAY_AUTH_MODE",
        "RAY_AUTH_TOKEN",
        "RAY_AUTH_TOKEN_PATH",
        "RAY_ADDRESS",
    ):
        monkeypatch.delenv(name, raising=False)
    return tmp_path


def write_token(home: Path) -> Path:
    (home / ".ray").mkdir()
    token = home / ".ray" / "auth_token"
    token.write_text("secret")
    return token


def test_token_sources_in_rays_order(home: Path) -> None:
    assert ray_auth.token_source({}) is None
    token = write_token(home)
    assert ray_auth.token_source({}) == str(token)
    other = home / "t"
    other.write_text("x")
    assert ray_auth.token_source({"RAY_AUTH_TOKEN_PATH": str(other)}) == (
        f"RAY_AUTH_TOKEN_PATH={other}"
    )
    assert ray_auth.token_source({"RAY_AUTH_TOKEN": "x"}) == "RAY_AUTH_TOKEN"
    # a path that names no file is no token
    assert ray_auth.token_source({"RAY_AUTH_TOKEN_PATH": str(home / "no")}) == str(
        token
    )


def test_mismatch_only_without_token_mode(home: Path) -> None:
    assert ray_auth.auth_mode_mismatch({}) is None  # no token: nothing to name
    write_token(home)
    assert ray_auth.auth_mode_mismatch({}) is not None
    assert ray_auth.auth_mode_mismatch({"RAY_AUTH_MODE": "disabled"}) is not None
    assert ray_auth.auth_mode_mismatch({"RAY_AUTH_MODE": "TOKEN"}) is None


def refusing(parallel_config: Any, ray_address: Any = None) -> None:
    raise ConnectionError("Failed to connect to Ray cluster at 10.0.0.1:6379")


def test_the_engine_error_names_auth_mode_and_fix(
    home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    token = write_token(home)
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.1:6379")
    wrapped = ray_auth._make(refusing)
    with pytest.raises(ConnectionError) as err:
        wrapped(object())
    message = str(err.value)
    assert message.startswith("Failed to connect to Ray cluster at 10.0.0.1:6379. ")
    assert "10.0.0.1:6379 may require token authentication" in message
    assert f"this host has one: {token}" in message
    assert "RAY_AUTH_MODE is unset here" in message
    assert "export RAY_AUTH_MODE=token" in message
    assert isinstance(err.value.__cause__, ConnectionError)


@pytest.mark.parametrize(
    "env", [{}, {"RAY_ADDRESS": "10.0.0.1:6379", "RAY_AUTH_MODE": "token"}]
)
def test_other_connection_errors_are_vllms(
    home: Path, monkeypatch: pytest.MonkeyPatch, env: dict[str, str]
) -> None:
    """No address (vLLM starts its own Ray: Ray handles the token), or token mode
    already on: the error is not about the mode."""
    write_token(home)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(ConnectionError) as err:
        ray_auth._make(refusing)(object())
    assert "vllm-kunlun" not in str(err.value)


def test_success_passes_through(home: Path) -> None:
    calls = []
    wrapped = ray_auth._make(lambda c, a=None: calls.append((c, a)) or "done")
    assert wrapped("cfg", "addr") == "done" and calls == [("cfg", "addr")]


def test_the_patch_fits_the_installed_vllm() -> None:
    import vllm.v1.executor.ray_executor  # noqa: F401

    assert ray_auth.PATCH.mismatch() is None
