"""Filtering out the general plugin that carries the sampling patches is not silent."""

from __future__ import annotations

import json
from pathlib import Path

from tests.conftest import run_python
from tests.integration.test_engine_config import TINY_QWEN3

CODE = """
from vllm.engine.arg_utils import EngineArgs
EngineArgs(model=MODEL, skip_tokenizer_init=True).create_engine_config()
"""
WARNING = "does not include kunlun_runtime_fixes"


def _engine_config_log(tmp_path: Path, plugins: str) -> str:
    (tmp_path / "config.json").write_text(json.dumps(TINY_QWEN3))
    proc = run_python(
        f"MODEL = {str(tmp_path)!r}\n" + CODE,
        env={"FAKE_XMLIR_DEVICES": "8", "VLLM_PLUGINS": plugins},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout + proc.stderr


def test_filtered_general_plugin_is_named_with_the_fix(tmp_path: Path) -> None:
    log = _engine_config_log(tmp_path, "kunlun")
    assert "Platform plugin kunlun is activated" in log
    assert WARNING in log
    assert "VLLM_PLUGINS=kunlun,kunlun_runtime_fixes" in log


def test_no_warning_when_both_plugins_are_allowed(tmp_path: Path) -> None:
    log = _engine_config_log(tmp_path, "kunlun,kunlun_runtime_fixes")
    assert WARNING not in log
