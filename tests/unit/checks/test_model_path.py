"""Doctor check 6 (model path) and the model-path guard, on a models directory with
near-miss names built in tmp_path."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from vllm_kunlun.checks import config_file
from vllm_kunlun.checks.budget import check_kv_budget
from vllm_kunlun.checks.finding import Context
from vllm_kunlun.checks.model_path import check_model_path, looks_local, suggestions
from vllm_kunlun.guards.model_path import ModelPathError, model_path_guard

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
    assert "served neither by vLLM 0.15.1 nor by vllm-kunlun" in f.cause
    assert "Qwen3_5ForCausalLM" in f.cause  # what the plugin does serve


def test_existing_model_known_to_vllm_says_vllm_serves_it(site: Path) -> None:
    f = check_model_path(_ctx(site, _model(site, "Qwen3ForCausalLM", True)))
    assert f.details["served_by"] == "vLLM 0.15.1"
    assert "served by vLLM 0.15.1" in f.cause


@pytest.mark.parametrize("layout", ["causal", "composite"])
def test_the_plugins_qwen3_5_checkpoints_pass(tmp_path: Path, layout: str) -> None:
    """vLLM 0.15.1 has no Qwen3.5; the doctor knows the plugin serves it (before, it
    failed the plugin's own tiny checkpoint, which `vllm serve` serves)."""
    from vllm_kunlun.demo.tiny_model import write_tiny_model
    from vllm_kunlun.demo.tiny_qwen3_5 import TinyQwen3_5Spec

    model = write_tiny_model(tmp_path / layout, TinyQwen3_5Spec(layout=layout))
    f = check_model_path(_ctx(tmp_path, str(model)))
    assert f.status == "ok", f
    assert f.details["served_by"] == "vllm-kunlun"
    assert "served by vllm-kunlun" in f.cause


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


def test_architectures_as_a_string_is_named(site: Path) -> None:
    """Not a list of letters: the field, its value and the fix."""
    d = site / "models" / REAL
    (d / "config.json").write_text(
        json.dumps({"architectures": "Qwen3ForCausalLM", "model_type": "qwen3"})
    )
    f = check_model_path(_ctx(site, f"models/{REAL}"))
    assert f.status == "fail"
    assert "'architectures' is the string 'Qwen3ForCausalLM', not a list" in f.cause
    assert "'Q', 'w'" not in f.cause
    assert '["Qwen3ForCausalLM"]' in f.fix


def test_architectures_of_other_types_are_named(site: Path) -> None:
    d = site / "models" / REAL
    (d / "config.json").write_text(json.dumps({"architectures": [1, 2]}))
    f = check_model_path(_ctx(site, f"models/{REAL}"))
    assert f.status == "fail" and "must be a list of class names" in f.cause


def test_fifo_config_does_not_hang(site: Path) -> None:
    d = site / "models" / REAL
    os.mkfifo(d / "config.json")
    f = check_model_path(_ctx(site, f"models/{REAL}"))
    assert f.status == "fail" and "not a regular file" in f.cause


def test_huge_config_is_refused_without_reading_it(
    site: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = site / "models" / REAL / "config.json"
    with open(config, "wb") as f:
        f.truncate(2 << 30)  # sparse: 2 GiB that takes no disk
    read = _count_reads(monkeypatch)
    f = check_model_path(_ctx(site, f"models/{REAL}"))
    assert (
        f.status == "fail"
        and "larger than 16 MiB" in f.cause
        and str(config) in f.cause
    )
    budget = check_kv_budget(_ctx(site, f"models/{REAL}"))
    assert budget.status == "skip" and "larger than 16 MiB" in budget.cause
    assert read == [0]


def test_a_file_that_hides_its_size_is_read_to_the_cap_only(
    site: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A file whose stat says 0 bytes (as /proc files do, or one still growing): at
    most cap + 1 bytes are read."""
    config = site / "models" / REAL / "config.json"
    config.write_text(json.dumps({"pad": "x" * 1000}))
    real_fstat = os.fstat

    def zero_size(fd: int) -> os.stat_result:
        st = list(real_fstat(fd))
        st[6] = 0  # st_size
        return os.stat_result(st)

    read = _count_reads(monkeypatch)
    monkeypatch.setattr(config_file.os, "fstat", zero_size)
    with pytest.raises(config_file.ConfigFileError, match="larger than"):
        config_file.read_json_object(str(config), limit=100)
    assert read == [101]


def test_config_is_read_once_per_run(
    site: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _model(site, "Qwen3ForCausalLM", True)
    config = site / "models" / REAL / "config.json"
    config.write_text(
        json.dumps(
            {
                "architectures": ["Qwen3ForCausalLM"],
                "model_type": "qwen3",
                "num_hidden_layers": 2,
                "num_attention_heads": 4,
                "hidden_size": 64,
                "vocab_size": 100,
            }
        )
    )
    read = _count_reads(monkeypatch)
    assert check_model_path(_ctx(site, f"models/{REAL}")).status == "ok"
    assert check_kv_budget(_ctx(site, f"models/{REAL}")).status == "ok"
    assert read == [config.stat().st_size]


def _count_reads(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Bytes read through ``os.read`` by the config reader (a list of one counter)."""
    config_file._CACHE.clear()
    real = os.read
    total = [0]

    def counting(fd: int, n: int) -> bytes:
        data = real(fd, n)
        total[0] += len(data)
        return data

    monkeypatch.setattr(config_file.os, "read", counting)
    return total
