"""One LoRA run the LoRA engine tests share (test_e2e_lora.py, test_e2e_lora_hybrid.py):
``run_lora`` writes a spec, runs lora_runner.py in a fresh interpreter under a timeout
(in-process engine core on the faked vendor kernels, or TP workers), and returns its
JSON result, failing the test with the runner's error and stderr tail."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import child_env, run_bounded

RUNNER = Path(__file__).with_name("lora_runner.py")
# TP 1: the engine core in the test's child, so its kernel report is readable, on the
# vendor kernels (the fakes in tests/fakes compute their math); TP 2 on the portable.
EMULATION = {
    "VLLM_KUNLUN_HOST_EMULATION": "1",
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
    "VLLM_KUNLUN_EMULATION_VENDOR": "1",
}
# apply_model sends the runner's slot_bytes to the TP workers by pickle.
EMULATION_TP = {
    "VLLM_KUNLUN_HOST_EMULATION": "1",
    "VLLM_ALLOW_INSECURE_SERIALIZATION": "1",
}


def run_lora(
    spec: dict[str, Any], tmp: Path, timeout: float = 600, in_process: bool = True
) -> dict[str, Any]:
    spec_path, out_path = tmp / "spec.json", tmp / "out.json"
    spec_path.write_text(json.dumps(spec))
    proc = run_bounded(
        [sys.executable, str(RUNNER), str(spec_path), str(out_path)],
        env=child_env(EMULATION if in_process else EMULATION_TP),
        timeout=timeout,
    )
    result = json.loads(out_path.read_text()) if out_path.exists() else {}
    if proc.returncode != 0 or result.get("error"):
        pytest.fail(
            f"exit {proc.returncode}\n{result.get('error')}\n"
            f"--- stderr tail ---\n{proc.stderr[-4000:]}"
        )
    return result
