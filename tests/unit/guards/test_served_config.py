"""Runtime patch ``openai_served_config``: vLLM's real app (``api_server.build_app``)
answers ``GET /kunlun/served_config`` with what its engine config says it computes
with, and nothing else changes. The live server's answer (a real ``VllmConfig``) is
checked by tests/integration/test_serve.py."""

from __future__ import annotations

from argparse import Namespace
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from fastapi.testclient import TestClient
from vllm.entrypoints.openai import api_server
from vllm.entrypoints.openai.cli_args import FrontendArgs

from tests.conftest import patch_state
from vllm_kunlun.guards import served_config


def _config(dtype: torch.dtype, quantization: str | None, spec: Any = None) -> Any:
    """The attributes of ``VllmConfig`` the route reads."""
    return SimpleNamespace(
        model_config=SimpleNamespace(
            model="/models/qwen",
            served_model_name="qwen",
            dtype=dtype,
            quantization=quantization,
            max_model_len=4096,
        ),
        cache_config=SimpleNamespace(cache_dtype="auto"),
        speculative_config=spec,
    )


def _client(config: Any) -> TestClient:
    fields = {"model": "x", "served_model_name": None, "enable_log_requests": False}
    args = Namespace(**{"max_log_len": None, **fields, **vars(FrontendArgs())})
    app = api_server.build_app(args)
    if config is not None:
        app.state.vllm_config = config
    return TestClient(app, raise_server_exceptions=False)


@pytest.fixture
def patched() -> Iterator[None]:
    with patch_state(served_config, on=True):
        yield


def test_without_the_patch_vllm_has_no_such_route() -> None:
    with patch_state(served_config, on=False):
        resp = _client(_config(torch.float32, None)).get(served_config.PATH)
    assert resp.status_code == 404


@pytest.mark.parametrize(
    ("dtype", "quantization", "spec", "want"),
    [
        (torch.bfloat16, "compressed-tensors", None, ("bfloat16", None)),
        (torch.float16, None, SimpleNamespace(method="mtp"), ("float16", "mtp")),
    ],
    ids=["w8a8_bf16", "float16_mtp"],
)
def test_the_route_reports_dtype_quantization_and_checkpoint(
    patched: None, dtype: torch.dtype, quantization: str | None, spec: Any, want: Any
) -> None:
    resp = _client(_config(dtype, quantization, spec)).get(served_config.PATH)
    assert resp.status_code == 200
    doc = resp.json()
    assert (doc["dtype"], doc["speculative_method"]) == want
    assert doc["quantization"] == quantization
    assert doc["model"] == "/models/qwen" and doc["served_model_names"] == ["qwen"]
    assert doc["max_model_len"] == 4096 and doc["kv_cache_dtype"] == "auto"


def test_other_methods_and_an_unconfigured_app_are_errors(patched: None) -> None:
    client = _client(_config(torch.float32, None))
    assert client.post(served_config.PATH, json={}).status_code == 405
    resp = _client(None).get(served_config.PATH)
    assert resp.status_code == 503 and "not configured" in resp.text


def test_every_other_route_is_vllms(patched: None) -> None:
    client = _client(_config(torch.float32, None))
    assert client.get("/version").status_code == 200
    assert client.get("/kunlun/other").status_code == 404
