"""Filtering out the general plugin: the workers still sample on the device, and the
missing front-end guards are not silent."""

from __future__ import annotations

import json
from pathlib import Path

from tests.conftest import run_python
from tests.integration.engine_specs import TINY_QWEN3

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


WORKER_CODE = """
from vllm.platforms import current_platform
assert type(current_platform).__name__ == "KunlunPlatform", current_platform
from vllm.v1.sample.sampler import Sampler
before = type(Sampler().topk_topp_sampler).__name__
from vllm_kunlun.platforms.runtime_fixes import prepare_model_process
prepare_model_process()  # what KunlunWorker.__init__ runs first
after = type(Sampler().topk_topp_sampler).__name__
print("SAMPLERS", before, after)
"""


def test_worker_applies_the_sampler_patch_without_the_general_plugin() -> None:
    """VLLM_PLUGINS=kunlun: no general plugin, yet the worker's process samples with
    ours (before: vLLM's TopKTopPSampler, the CPU exponential_ path on Kunlun)."""
    proc = run_python(
        WORKER_CODE, env={"FAKE_XMLIR_DEVICES": "8", "VLLM_PLUGINS": "kunlun"}
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "SAMPLERS TopKTopPSampler KunlunTopKTopPSampler" in proc.stdout


FILTERED_IMPORT = """
import json
try:
    from vllm import LLM
except ValueError as exc:
    print("IMPORT FAILED " + str(exc)[:200])
else:
    print("IMPORT OK")
from vllm_kunlun.checks.finding import Context
from vllm_kunlun.doctor.plugins import check_plugins
f = check_plugins(Context())
print("FINDING " + json.dumps({"status": f.status, "cause": f.cause, "fix": f.fix}))
"""


def test_platform_plugin_filtered_out_the_import_failure_is_named() -> None:
    """VLLM_PLUGINS=nonexistent,,kunlun_runtime_fixes: vLLM never calls register(),
    where the schema fix is applied, and loads the general plugin only after
    vllm.config is imported; so with the patch set unapplied on torch 2.5.1 `from vllm
    import LLM` dies in infer_schema (README, "Runtime fixes"), and the doctor's
    plugins check names that cause and both ways out."""
    proc = run_python(
        FILTERED_IMPORT,
        env={"VLLM_PLUGINS": "nonexistent,,kunlun_runtime_fixes"},
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    imported = next(line for line in lines if line.startswith("IMPORT "))
    finding = json.loads(next(x for x in lines if x.startswith("FINDING "))[8:])
    assert finding["status"] == "fail"
    assert "leaves out kunlun (vllm.platform_plugins)" in finding["cause"]
    if imported == "IMPORT OK":  # this vLLM has the whole patch set applied
        assert "infer_schema" not in finding["cause"]
        return
    assert "infer_schema(func)" in imported and "list[int]" in imported
    assert "`from vllm import LLM`" in finding["cause"]
    assert "schema_pep585 runs in the platform plugin's register()" in finding["cause"]
    assert finding["fix"].startswith(
        "export VLLM_PLUGINS=nonexistent,kunlun_runtime_fixes,kunlun "
    )
    assert finding["fix"].endswith("run `vllm-kunlun patch apply`")
