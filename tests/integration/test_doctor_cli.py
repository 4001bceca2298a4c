"""``vllm-kunlun doctor`` as a user runs it: a real process, real vLLM, fake torch_xmlir."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest

from tests.conftest import run_python
from vllm_kunlun.doctor.report import json_schema

CODE = """
import sys
from vllm_kunlun.cli import main
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.slow
def test_doctor_json_on_a_broken_site(tmp_path: Path) -> None:
    real = tmp_path / "models" / "Qwen3.8-27B-W8A8-INT8-Dynamic"
    real.mkdir(parents=True)
    proc = run_python(
        "import sys; sys.argv = ['x', 'doctor', '--json', '--model', "
        f"{str(tmp_path / 'models' / 'Qwen3.8')!r}]\n" + CODE,
        env={"FAKE_XMLIR_DEVICES": "8"},
        cwd=tmp_path,
    )
    assert proc.returncode == 1, proc.stderr[-3000:]
    doc = json.loads(proc.stdout)  # logs went to stderr: stdout is the document
    jsonschema.validate(doc, json_schema())
    by_name = {f["check"]: f for f in doc["findings"]}
    assert list(by_name) == [
        "environment",
        "plugins",
        "platform",
        "devices",
        "stack_versions",
        "transformers_compat",
        "vendor_contract",
        "patchset",
        "model_path",
        "kv_budget",
        "ray",
        "source_sync",
        "sampler_path",
    ]
    assert by_name["plugins"]["status"] == "ok"  # VLLM_PLUGINS unset in the child
    assert by_name["platform"]["status"] == "ok"  # KunlunPlatform via the fake driver
    assert by_name["model_path"]["status"] == "fail"
    assert by_name["model_path"]["fix"] == f"did you mean '{real}'?"
    assert by_name["source_sync"]["status"] == "skip"  # tmp_path is no checkout
    assert by_name["ray"]["status"] == "skip"  # no Ray executor, RAY_ADDRESS unset
    assert by_name["transformers_compat"]["status"] == "ok"
    assert not any("crashed" in f["cause"] for f in doc["findings"]), doc
    assert doc["exit_code"] == 1 and doc["ok"] is False
