"""The patched vLLM 0.15.1 tree works on torch 2.5.1 with only the file patches.

A full copy of the installed vLLM (without its .so files, which cannot load with torch
2.5.1 anyway) is patched and put first on a child's sys.path. The child runs without
any plugin (VLLM_PLUGINS="") and with VLLM_KUNLUN_SCHEMA_FIX=0, and first proves that
torch's schema inference still rejects ``list[int]`` there: whatever works, works
because of the files.
"""

from __future__ import annotations

import json
import tempfile
import time
from pathlib import Path

import pytest

from tests.conftest import run_python
from tests.integration.vllm_tree import SET_DIR, copy_tree, installed_root
from vllm_kunlun.file_patches import engine

pytestmark = pytest.mark.slow

MODULES = [
    "vllm.config",
    "vllm.distributed.parallel_state",
    "vllm.attention.layer",
    "vllm.compilation.decorators",
    "vllm.compilation.wrapper",
    "vllm.compilation.backends",
    "vllm.compilation.piecewise_backend",
    "vllm.compilation.compiler_interface",
    "vllm.v1.structured_output.utils",
]

CHILD = r"""
import importlib, json, sys
from types import SimpleNamespace

import numpy as np
import torch
from torch._library.infer_schema import infer_schema

out = {}

def op(x: torch.Tensor, shape: list[int]) -> torch.Tensor:
    return x

try:
    infer_schema(op, mutates_args=())
    out["list_int_schema_ok"] = True
except ValueError:
    out["list_int_schema_ok"] = False

import vllm
out["vllm_file"] = vllm.__file__
for name in MODULES:
    importlib.import_module(name)
out["imported"] = MODULES

# 04: Inductor's functorch setup on torch 2.5.1.
from vllm.compilation.compiler_interface import set_functorch_config
set_functorch_config()

# 07: the torch-native bitmask equals xgrammar's own CPU kernel.
import xgrammar as xgr
from vllm.v1.core.sched.output import GrammarOutput
from vllm.v1.structured_output import utils

g = torch.Generator().manual_seed(0)
equal = []
for vocab, batch, idx in [(100, 4, None), (100, 4, [0, 2]), (64, 3, None), (1000, 5, [4, 1])]:
    words = (vocab + 31) // 32
    bm = torch.randint(-2**31, 2**31 - 1, (batch, words), dtype=torch.int32, generator=g)
    logits = torch.randn(batch, vocab, generator=g)
    ref, got = logits.clone(), logits.clone()
    xgr.apply_token_bitmask_inplace(ref, bm, indices=idx)
    index = None if idx is None else torch.tensor(idx, dtype=torch.int32)
    utils._apply_token_bitmask_torch_native(got, bm, index)
    equal.append(bool(torch.equal(ref, got)) and bool(torch.isinf(got).any()))
bm_np = np.random.default_rng(0).integers(-2**31, 2**31 - 1, (2, 4), dtype=np.int32)
logits = torch.randn(2, 128, generator=g)
ref = logits.clone()
utils.apply_grammar_bitmask(
    SimpleNamespace(scheduled_spec_decode_tokens={}),
    GrammarOutput(structured_output_request_ids=["a", "b"], grammar_bitmask=bm_np),
    SimpleNamespace(req_ids=["a", "b"]),
    logits,
)
xgr.apply_token_bitmask_inplace(ref, torch.from_numpy(bm_np))
equal.append(bool(torch.equal(ref, logits)))
out["bitmask_equal"] = equal

# Issue facts 8-10 (corrected): vLLM's config loader already resolves both types.
import tempfile
from transformers import Qwen3_5Config, Qwen3_5MoeConfig
from vllm.transformers_utils.config import get_config
kinds = {}
for cls in (Qwen3_5Config, Qwen3_5MoeConfig):
    directory = tempfile.mkdtemp()
    cls().save_pretrained(directory)
    kinds[cls.__name__] = type(get_config(directory, trust_remote_code=False)).__name__
out["qwen3_5_configs"] = kinds

# 01, 03, 06: a VLLM_COMPILE model (Dynamo inlining a user function, vLLM's
# backend, the piecewise compile path) on vLLM's own CPU platform.
import torch.nn as nn
import vllm.platforms
from vllm.platforms.cpu import CpuPlatform
vllm.platforms._current_platform = CpuPlatform()
from vllm.compilation.counter import compilation_counter
from vllm.compilation.decorators import support_torch_compile
from vllm.config import CompilationConfig, CompilationMode, VllmConfig
from vllm.config import set_current_vllm_config
from vllm.config.compilation import CUDAGraphMode
from vllm.forward_context import set_forward_context

def helper(y):
    return torch.relu(y) * 2

@support_torch_compile
class Tiny(nn.Module):
    def __init__(self, *, vllm_config, prefix="", **kwargs):
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return helper(self.lin(x)) + 1

config = VllmConfig(
    compilation_config=CompilationConfig(
        mode=CompilationMode.VLLM_COMPILE, cudagraph_mode=CUDAGraphMode.NONE,
        splitting_ops=[],
    )
)
cc = config.compilation_config
cc.mode, cc.backend, cc.compile_sizes = CompilationMode.VLLM_COMPILE, "eager", []
for name in ("fuse_norm_quant", "fuse_act_quant", "fuse_attn_quant", "enable_sp",
             "fuse_gemm_comms", "fuse_allreduce_rms", "enable_qk_norm_rope_fusion"):
    setattr(cc.pass_config, name, False)
with set_current_vllm_config(config):
    model = Tiny(vllm_config=config)
x = torch.randn(4, 8)
with set_forward_context({}, config), torch.no_grad():
    got = model(x)
    want = torch.relu(model.lin(x)) * 2 + 1
out["compiled_equal"] = bool(torch.allclose(got, want))
out["eager_compiles"] = compilation_counter.num_eager_compiles
print("RESULT " + json.dumps(out))
"""


def test_patched_tree_imports_and_compiles_on_torch_251(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # the lock file
    if engine.read_vllm_version(installed_root()) != "0.15.1":
        pytest.skip("needs the installed vLLM 0.15.1")
    if (engine.installed_torch_version() or "").split("+")[0] != "2.5.1":
        pytest.skip("the set is for torch 2.5.1")
    start = time.monotonic()
    root = copy_tree(tmp_path / "site", full=True)
    copy_s = time.monotonic() - start
    assert engine.apply(root, SET_DIR).report.applied == 7

    proc = run_python(
        f"MODULES = {MODULES!r}\n" + CHILD,
        env={
            "PYTHONPATH": str(root),
            "VLLM_PLUGINS": "",
            "VLLM_KUNLUN_SCHEMA_FIX": "0",
            "VLLM_CACHE_ROOT": str(tmp_path / "cache"),
            "VLLM_DISABLE_COMPILE_CACHE": "1",
            "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor"),
            "VLLM_LOGGING_LEVEL": "WARNING",
            "HF_HUB_OFFLINE": "1",
        },
        fakes=False,
        timeout=600,
    )
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stderr[-4000:]
    out = json.loads(lines[-1][len("RESULT ") :])
    print(f"copy of vllm without .so: {copy_s:.2f} s")

    assert out["list_int_schema_ok"] is False  # no runtime schema fix in the child
    assert out["vllm_file"] == str(root / "vllm" / "__init__.py")
    assert out["imported"] == MODULES
    assert out["bitmask_equal"] == [True] * 5
    assert out["qwen3_5_configs"] == {
        "Qwen3_5Config": "Qwen3_5Config",
        "Qwen3_5MoeConfig": "Qwen3_5MoeConfig",
    }
    assert out["compiled_equal"] is True
    assert out["eager_compiles"] >= 1
