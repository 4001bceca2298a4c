"""The runtime patch engine_model_path_guard on vLLM's real arg_utils (no engine)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from vllm.engine import arg_utils

from vllm_kunlun.guards import model_path as guards


@pytest.fixture
def clean_guard() -> Iterator[None]:
    guards.uninstall()
    original = (arg_utils.maybe_override_with_speculators, arg_utils.get_model_path)
    yield
    guards.uninstall()
    assert (
        arg_utils.maybe_override_with_speculators,
        arg_utils.get_model_path,
    ) == original


def test_install_wraps_both_readers_and_uninstall_restores(
    clean_guard: None, tmp_path: Path
) -> None:
    original = arg_utils.get_model_path
    assert guards.install() is True
    assert guards.install() is False  # idempotent
    assert guards.installed()
    assert arg_utils.get_model_path is not original
    (tmp_path / "models" / "Qwen3.8-27B").mkdir(parents=True)
    missing = str(tmp_path / "models" / "Qwen3.8")
    # the HF_HUB_OFFLINE reader in EngineArgs.__post_init__
    with pytest.raises(guards.ModelPathError, match="did you mean"):
        arg_utils.get_model_path(missing, None)
    # the first reader in create_engine_config
    with pytest.raises(guards.ModelPathError, match=r"Qwen3\.8-27B"):
        arg_utils.maybe_override_with_speculators(
            model=missing, tokenizer=missing, trust_remote_code=False
        )
    with pytest.raises(guards.ModelPathError, match="tokenizer path"):
        arg_utils.maybe_override_with_speculators(
            model=str(tmp_path), tokenizer=missing, trust_remote_code=False
        )
    # an existing path goes through to vLLM's own function
    assert arg_utils.get_model_path(str(tmp_path), None) == str(tmp_path)
    guards.uninstall()
    assert arg_utils.get_model_path is original and not guards.installed()


def test_changed_upstream_signature_keeps_the_patch_out(
    clean_guard: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    def get_model_path(model, revision, token):  # type: ignore[no-untyped-def]
        return model

    monkeypatch.setattr(arg_utils, "get_model_path", get_model_path)
    assert guards.install() is False
    assert arg_utils.get_model_path is get_model_path
    assert not guards.installed()
