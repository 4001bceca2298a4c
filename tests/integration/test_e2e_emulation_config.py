"""Host emulation as vLLM's own config machinery sees it (real vLLM, no engine)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import run_python
from vllm_kunlun.demo.tiny_model import write_tiny_model

pytestmark = pytest.mark.slow

PROBE = """
import json, os
from vllm.engine.arg_utils import EngineArgs
from vllm.platforms import current_platform
from vllm.v1.sample.sampler import Sampler
from vllm_kunlun.patching import schema

cfg = EngineArgs(model={model!r}, max_model_len=256).create_engine_config()
print("RESULT " + json.dumps({{
    "platform": type(current_platform).__qualname__,
    "device": str(cfg.device_config.device),
    "worker_cls": cfg.parallel_config.worker_cls,
    "custom_ops": cfg.compilation_config.custom_ops,
    "compile_mode": int(cfg.compilation_config.mode),
    "cudagraph_mode": cfg.compilation_config.cudagraph_mode.name,
    "async_scheduling": cfg.scheduler_config.async_scheduling,
    "kv_bytes": cfg.cache_config.cpu_kvcache_space_bytes,
    "pin_memory": current_platform.is_pin_memory_available(),
    "omp_bind": os.environ.get("VLLM_CPU_OMP_THREADS_BIND"),
    "mp_method": os.environ.get("VLLM_WORKER_MULTIPROC_METHOD"),
    "host_ip": os.environ.get("VLLM_HOST_IP"),
    "schema_fix": schema.applied(),
    "topk_topp": type(Sampler().topk_topp_sampler).__module__,
}}))
"""


def test_emulation_config_handles_every_measured_fact(tmp_path: Path) -> None:
    model = str(write_tiny_model(tmp_path / "tiny"))
    proc = run_python(
        PROBE.format(model=model),
        # The fake torch_xmlir reports 8 devices: explicit emulation still wins.
        env={
            "VLLM_KUNLUN_HOST_EMULATION": "1",
            "VLLM_KUNLUN_EMULATION_KV_CACHE_GIB": "0.25",
            "VLLM_LOGGING_LEVEL": "INFO",
        },
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = next(x for x in proc.stdout.splitlines() if x.startswith("RESULT "))
    found = json.loads(line[len("RESULT ") :])
    assert found == {
        "platform": "KunlunHostEmulationPlatform",
        "device": "cpu",
        "worker_cls": "vllm_kunlun.platforms.emulation_worker.EmulationWorker",
        "custom_ops": ["none"],  # every CustomOp on its torch-native path
        "compile_mode": 0,  # CompilationMode.NONE
        "cudagraph_mode": "NONE",
        "async_scheduling": False,
        "kv_bytes": 1 << 28,  # 0.25 GiB, not half the RAM
        "pin_memory": False,
        "omp_bind": "nobind",
        "mp_method": "spawn",
        "host_ip": "127.0.0.1",  # process groups on loopback, not the host's address
        "schema_fix": True,  # import vllm.config needs it on torch 2.5.1
        "topk_topp": "vllm_kunlun.ops.sampling.topk_topp",  # the plugin's sampler
    }
    log = proc.stdout + proc.stderr
    assert "HOST EMULATION active" in log
    assert "NOT a Kunlun device" in log
