"""``vllm-kunlun accuracy`` on a wrong deployment: the server serves a copy of the tiny
checkpoint with one MLP weight scaled by 1.5, ``--model`` is the intact checkpoint.
The command must exit 1 and name the worst prompt and its gap. One server for the
module (the passing case shares test_serve.py's server); every wait is bounded
(``start_server``'s ready timeout, the CLI's subprocess timeout)."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from tests.conftest import child_env
from tests.integration.serve_clients import NAME, accuracy_cli
from vllm_kunlun.demo.server_process import ServerProcess, start_server
from vllm_kunlun.demo.tiny_model import write_tiny_model

pytestmark = pytest.mark.slow

CORRUPTED = "model.layers.0.mlp.down_proj.weight"


@pytest.fixture(scope="module")
def dirs(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str]:
    """(intact checkpoint, served copy with CORRUPTED scaled by 1.5)."""
    intact = write_tiny_model(tmp_path_factory.mktemp("intact") / "tiny-qwen3")
    broken = tmp_path_factory.mktemp("broken") / "tiny-qwen3"
    shutil.copytree(intact, broken)
    weights = broken / "model.safetensors"
    tensors = load_file(str(weights))
    tensors[CORRUPTED] = (tensors[CORRUPTED] * 1.5).contiguous()
    save_file(tensors, str(weights), metadata={"format": "pt"})
    assert not torch.equal(
        load_file(str(Path(intact) / "model.safetensors"))[CORRUPTED],
        tensors[CORRUPTED],
    )
    return str(intact), str(broken)


@pytest.fixture(scope="module")
def server(
    dirs: tuple[str, str], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerProcess]:
    args = ["--served-model-name", NAME, "--dtype", "float32"]
    args += ["--max-model-len", "512", "--seed", "0"]
    env = child_env({"VLLM_KUNLUN_HOST_EMULATION": "1", "VLLM_LOGGING_LEVEL": "INFO"})
    srv = start_server(dirs[1], args, env, log_dir=tmp_path_factory.mktemp("log"))
    try:
        yield srv
    finally:
        stopped = srv.stop(timeout=60)
        assert stopped.leftover == [], stopped


def test_accuracy_fails_on_a_corrupted_deployment(
    server: ServerProcess, dirs: tuple[str, str]
) -> None:
    code, doc, err = accuracy_cli(server.url, dirs[0])
    assert code == 1, (doc, err[-3000:])
    assert doc["passed"] is False and doc["failures"], doc
    assert doc["max_gap"] > doc["thresholds"]["max_gap"]
    worst = max(doc["prompts"], key=lambda p: p["max_gap"])
    assert doc["worst_prompt"] == worst["prompt"]
    assert any(worst["prompt"] in f and "largest" in f for f in doc["failures"])
    assert worst["server_logprob"] != worst["reference_logprob"]
