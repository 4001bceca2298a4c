"""What the accuracy check judges by: the served dtype and quantization, asked from
the server (the plugin's ``/kunlun/served_config``, else vLLM's dev-mode
``/server_info``, else only ``/v1/models``' directory), and a mismatch with the
checkpoint failing with both named. A local HTTP server answers as each kind of vLLM
server does (the live plugin route is tests/integration/test_serve.py's)."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from vllm_kunlun.accuracy.compare import (
    DtypeConflict,
    ServedMismatch,
    served_precision,
    thresholds_for,
)
from vllm_kunlun.accuracy.endpoint import ServedConfig, served_config

MODELS = {"object": "list", "data": [{"id": "qwen", "root": "/srv/qwen-fp"}]}


@pytest.fixture
def routes() -> Iterator[tuple[str, dict[str, Any]]]:
    """(url, routes): GET path -> JSON answer; any other path is a 404."""
    table: dict[str, Any] = {}

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            found = self.path in table
            body = json.dumps(table[self.path] if found else {"detail": "Not Found"})
            self.send_response(200 if found else 404)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(body.encode())

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", table
    finally:
        server.shutdown()
        server.server_close()


def test_the_plugins_route_is_asked_first(routes: tuple[str, dict[str, Any]]) -> None:
    url, table = routes
    table["/kunlun/served_config"] = {
        "model": "/srv/qwen-fp",
        "dtype": "bfloat16",
        "quantization": None,
    }
    table["/v1/models"] = MODELS
    got = served_config(url + "/v1", "qwen", 5)
    assert got == ServedConfig(
        "/kunlun/served_config", "/srv/qwen-fp", "bfloat16", None, True
    )


def test_vllms_dev_mode_server_info_is_read(routes: tuple[str, dict[str, Any]]) -> None:
    url, table = routes
    table["/server_info?config_format=json"] = {
        "vllm_config": {
            "model_config": {
                "model": "/srv/w8a8",
                "dtype": "torch.float16",  # pydantic's fallback=str of a torch.dtype
                "quantization": "compressed-tensors",
            }
        },
        "vllm_env": {},
    }
    got = served_config(url, "qwen", 5)
    assert (got.source, got.dtype, got.quantization) == (
        "/server_info",
        "float16",
        "compressed-tensors",
    )
    assert got.known


def test_a_server_that_says_nothing_gives_only_its_directory(
    routes: tuple[str, dict[str, Any]],
) -> None:
    url, table = routes
    table["/v1/models"] = MODELS
    got = served_config(url, "qwen", 5)
    assert got == ServedConfig("/v1/models", "/srv/qwen-fp", None, None, False)


def _served(dtype: str, quantization: str | None) -> ServedConfig:
    return ServedConfig("/kunlun/served_config", "/srv/x", dtype, quantization, True)


def test_a_float_model_under_a_w8a8_checkpoints_name_fails_naming_both() -> None:
    with pytest.raises(ServedMismatch) as err:
        served_precision(
            _served("bfloat16", None), "w8a8", "bfloat16", "auto", "/ck/w8a8", "qwen"
        )
    text = str(err.value)
    assert "unquantized" in text and "/ck/w8a8" in text and "W8A8" in text
    assert "/srv/x" in text and "'qwen'" in text


def test_an_int8_server_under_a_float_checkpoint_fails_too() -> None:
    with pytest.raises(ServedMismatch, match="quantized with compressed-tensors"):
        served_precision(
            _served("bfloat16", "compressed-tensors"),
            "none",
            "bfloat16",
            "auto",
            "/ck/fp",
            "qwen",
        )


def test_the_served_dtype_chooses_the_thresholds() -> None:
    # A float32 checkpoint served in bfloat16 is judged by bfloat16's thresholds.
    got = served_precision(
        _served("bfloat16", None), "none", "float32", "auto", "/ck", "q"
    )
    assert got == ("bfloat16", "none")
    assert thresholds_for(*got)[0] == "bfloat16"
    w8a8 = served_precision(
        _served("float16", "compressed-tensors"), "w8a8", "float16", "auto", "/c", "q"
    )
    assert thresholds_for(*w8a8)[0] == "w8a8"


def test_without_a_report_the_checkpoint_and_dtype_flag_decide() -> None:
    unknown = ServedConfig("/v1/models", "/srv/x", None, None, False)
    assert served_precision(unknown, "none", "float32", "auto", "/c", "q") == (
        "float32",
        "none",
    )
    assert served_precision(unknown, "none", "float32", "float16", "/c", "q") == (
        "float16",
        "none",
    )


def test_a_dtype_flag_against_the_report_or_an_unknown_dtype_is_a_usage_error() -> None:
    with pytest.raises(DtypeConflict, match=r"--dtype float16, but .* bfloat16"):
        served_precision(_served("bfloat16", None), "none", "x", "float16", "/c", "q")
    with pytest.raises(DtypeConflict, match="no thresholds"):
        served_precision(_served("float64", None), "none", "x", "auto", "/c", "q")
