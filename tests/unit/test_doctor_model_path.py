"""Doctor check 6 (model path) and the model-path guard, on a models directory with
near-miss names built in tmp_path."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from vllm_kunlun.doctor.finding import Context
from vllm_kunlun.doctor.model_path import check_model_path, looks_local, suggestions
from vllm_kunlun.guards import ModelPathError, model_path_guard

REAL = "Qwen3.8-27B-W8A8-INT8-Dynamic"


@pytest.fixture
def site(tmp_path: Path) -> Path:
    models = tmp_path / "models"
    for name in (REAL, "Qwen3-8B", "Llama-3.1-8B-Instruct", "qwen-vl"):
        (models / name).mkdir(parents=True)
    (models / "README.txt").write_text("not a directory")
    return tmp_path


def _ctx(site: Path, model: str) -> Context:
    return Context(model=model, cwd=str(site))


def test_shorthand_fails_with_the_real_directory_first(site: Path) -> None:
    f = check_model_path(_ctx(site, "models/Qwen3.8"))
    assert f.status == "fail"
    assert "'models/Qwen3.8' looks local" in f.cause and "HFValidationError" in f.cause
    assert f.details["suggestions"][0] == f"models/{REAL}"
    assert f.fix.startswith(f"did you mean 'models/{REAL}'")
    assert "Llama" not in f.fix


def test_absolute_shorthand_suggests_absolute_paths(site: Path) -> None:
    f = check_model_path(_ctx(site, f"{site}/models/Qwen3.8"))
    assert f.status == "fail"
    assert f.details["suggestions"][0] == f"{site}/models/{REAL}"


def test_missing_middle_component(site: Path) -> None:
    assert suggestions("modles/Qwen3-8B", str(site)) == ["models/Qwen3-8B"]


def test_what_looks_local(site: Path) -> None:
    cwd = str(site)
    assert looks_local("models/Qwen3.8", cwd)  # first component exists here
    assert looks_local("./Qwen3.8", cwd)
    assert looks_local("/abs/path", cwd)
    assert looks_local("a/b/c", cwd)  # a Hub id has one separator
    assert not looks_local("Qwen/Qwen3-8B", cwd)  # a Hub id
    assert not looks_local("gpt2", cwd)


def test_hub_id_is_a_warning_not_a_failure(site: Path) -> None:
    f = check_model_path(_ctx(site, "Qwen/Qwen3-8B"))
    assert f.status == "warn" and "Hugging Face Hub" in f.cause


def test_directory_without_config_lists_model_dirs_inside(site: Path) -> None:
    (site / "models" / REAL / "config.json").write_text("{}")
    f = check_model_path(_ctx(site, "models"))
    assert f.status == "fail"
    assert "no config.json" in f.cause and REAL in f.fix


def test_unreadable_config(site: Path) -> None:
    (site / "models" / REAL / "config.json").write_text("{not json")
    f = check_model_path(_ctx(site, f"models/{REAL}"))
    assert f.status == "fail" and "unreadable" in f.cause


def _model(site: Path, arch: str, weights: bool) -> str:
    d = site / "models" / REAL
    (d / "config.json").write_text(
        json.dumps({"architectures": [arch], "model_type": "qwen3"})
    )
    if weights:
        (d / "model-00001-of-00001.safetensors").write_bytes(b"\0" * 16)
    return f"models/{REAL}"


def test_existing_model_known_to_vllm(site: Path) -> None:
    f = check_model_path(_ctx(site, _model(site, "Qwen3ForCausalLM", True)))
    assert f.status == "ok", f
    assert "Qwen3ForCausalLM" in f.cause and f.details["weight_files"] == 1


def test_existing_model_without_weights_warns(site: Path) -> None:
    f = check_model_path(_ctx(site, _model(site, "Qwen3ForCausalLM", False)))
    assert f.status == "warn" and "no weight files" in f.cause


def test_unknown_architecture_fails(site: Path) -> None:
    f = check_model_path(_ctx(site, _model(site, "Qwen9ForTimeTravel", True)))
    assert f.status == "fail"
    assert "not supported by vLLM 0.15.1" in f.cause


def test_no_model_is_skipped() -> None:
    assert check_model_path(Context()).status == "skip"


def test_guard_raises_our_message(site: Path) -> None:
    with pytest.raises(ModelPathError) as e:
        model_path_guard("models/Qwen3.8", cwd=str(site))
    msg = str(e.value)
    assert msg.startswith("vllm-kunlun: model path 'models/Qwen3.8' looks local")
    assert f"Fix: did you mean 'models/{REAL}'?" in msg
    with pytest.raises(ModelPathError, match="tokenizer path"):
        model_path_guard("models/qwen", what="tokenizer", cwd=str(site))


def test_guard_lets_hub_ids_and_existing_paths_through(site: Path) -> None:
    model_path_guard("Qwen/Qwen3-8B", cwd=str(site))
    model_path_guard(f"models/{REAL}", cwd=str(site))
    model_path_guard(None)
