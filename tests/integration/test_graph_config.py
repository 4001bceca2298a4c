"""Graph capture on KunlunPlatform as vLLM 0.15.1's config machinery resolves it.

KunlunPlatform is active through the test-only torch_xmlir (8 devices), on the CPU:
vLLM builds its engine config exactly as on a P800 host. The test venv's vLLM is left
unpatched (docs/patches.md), so the graph path is checked on a patched copy of it put
first on a child's path (the refusal on the unpatched venv: tests/unit/platforms/test_graphs.py).

The compile half of the graph path also runs for real on the CPU: host emulation with
the model compiled as KunlunPlatform compiles it (VLLM_COMPILE, eager backend, attention
as the opaque split op) generates the same greedy tokens as transformers. Capturing the
pieces needs a GPU: tests/device/test_graphs_cuda.py.
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import FAKES, run_python
from tests.integration.engine_specs import TINY_QWEN3
from tests.integration.vllm_tree import SET_DIR, copy_tree, installed_root
from vllm_kunlun.demo.tiny_model import write_tiny_model
from vllm_kunlun.file_patches import engine

pytestmark = pytest.mark.slow

KUNLUN = {"FAKE_XMLIR_DEVICES": "8", "VLLM_LOGGING_LEVEL": "INFO"}
ATTENTION_OPS = ("vllm::unified_attention", "vllm::unified_attention_with_output")

CONFIGS = """
import json, sys
from vllm.engine.arg_utils import EngineArgs

def resolve(**kw):
    cfg = EngineArgs(model=MODEL, skip_tokenizer_init=True, **kw).create_engine_config()
    cc = cfg.compilation_config
    return {"mode": cc.mode.name, "backend": cc.backend,
            "cudagraph": cc.cudagraph_mode.name, "sizes": cc.cudagraph_capture_sizes,
            "max": cc.max_cudagraph_capture_size, "splitting": cc.splitting_ops}

import vllm._custom_ops  # the engine path: the platform's import_kernels()
import vllm.utils.torch_utils as tu
out = {"weak_ref_patched": tu.weak_ref_tensor.__module__}
for name, kw in CASES:
    if name == "native_missing":  # as if the extension had never been built
        from vllm_kunlun.ops import native
        sys.modules["vllm_kunlun._native"] = None
        native.load.cache_clear()
    out[name] = resolve(**kw)
    print(f"=== end of case {name}", flush=True)

print("RESULT " + json.dumps(out))
"""

CASES: list[tuple[str, dict[str, Any]]] = [
    ("default", {"max_num_seqs": 256}),
    ("eager", {"max_num_seqs": 256, "enforce_eager": True}),
    ("seqs_100", {"max_num_seqs": 100}),
    ("user_sizes", {"cudagraph_capture_sizes": [1, 3, 300]}),
    (
        "full_decode_only",
        {"compilation_config": {"cudagraph_mode": "FULL_DECODE_ONLY"}},
    ),
    ("no_graphs_asked", {"compilation_config": {"cudagraph_mode": "NONE"}}),
    ("tp2", {"tensor_parallel_size": 2}),
    ("native_missing", {}),  # last: the extension stays unloaded afterwards
]


def resolve(cases: list[tuple[str, dict]], root: Path, tmp: Path) -> tuple:
    model = tmp / "model"
    model.mkdir(exist_ok=True)
    (model / "config.json").write_text(json.dumps(TINY_QWEN3))
    # The fake torch_xmlir, then the patched vLLM.
    env = {**KUNLUN, "PYTHONPATH": f"{FAKES}:{root}"}
    proc = run_python(f"MODEL = {str(model)!r}\nCASES = {cases!r}\n" + CONFIGS, env=env)
    assert proc.returncode == 0, proc.stderr[-4000:]
    line = next(x for x in proc.stdout.splitlines() if x.startswith("RESULT "))
    log = proc.stdout + proc.stderr
    chunks = log.split("=== end of case ")
    logs = {c.split("\n", 1)[0]: chunks[i] for i, c in enumerate(chunks[1:])}
    return json.loads(line[len("RESULT ") :]), logs


@pytest.fixture(scope="module")
def patched_root(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A full copy of the installed vLLM with patch_torch251 applied."""
    if engine.read_vllm_version(installed_root()) != "0.15.1":
        pytest.skip("needs the installed vLLM 0.15.1")
    if (engine.installed_torch_version() or "").split("+")[0] != "2.5.1":
        pytest.skip("the set is for torch 2.5.1")
    tmp = tmp_path_factory.mktemp("patched-vllm")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(tempfile, "tempdir", str(tmp))  # the patch engine's lock file
        root = copy_tree(tmp / "site", full=True)
        assert engine.apply(root, SET_DIR).report.applied == 7
    yield root


@pytest.fixture(scope="module")
def resolved(
    patched_root: Path, tmp_path_factory: pytest.TempPathFactory
) -> tuple[dict, dict]:
    return resolve(CASES, patched_root, tmp_path_factory.mktemp("configs"))


def test_default_is_piecewise_around_attention(resolved: tuple[dict, dict]) -> None:
    found, logs = resolved
    got = found["default"]
    assert (got["mode"], got["backend"], got["cudagraph"]) == (
        "VLLM_COMPILE",
        "eager",
        "PIECEWISE",
    )
    assert got["sizes"] == [1, 2, 4, *range(8, 257, 8)]  # up to the 256-way decode
    assert got["max"] == 256
    assert all(op in got["splitting"] for op in ATTENTION_OPS)
    log = logs["default"]
    assert "CUDA graphs PIECEWISE, compile backend eager, 35 capture sizes" in log
    assert "full graphs would capture attention kernels" in log  # the O2 default
    assert "decode batches go up to 256 sequences" in log


def test_enforce_eager_turns_graphs_off(resolved: tuple[dict, dict]) -> None:
    found, logs = resolved
    got = found["eager"]
    assert (got["mode"], got["cudagraph"], got["sizes"]) == ("NONE", "NONE", [])
    assert "graphs off: --enforce-eager" in logs["eager"]


def test_capture_sizes_follow_max_num_seqs(resolved: tuple[dict, dict]) -> None:
    found, _ = resolved
    assert found["seqs_100"]["sizes"] == [1, 2, 4, *range(8, 97, 8), 100]
    assert found["seqs_100"]["max"] == 100


def test_sizes_the_user_gave_are_kept(resolved: tuple[dict, dict]) -> None:
    found, _ = resolved
    assert found["user_sizes"]["sizes"] == [1, 3, 300]
    assert found["user_sizes"]["cudagraph"] == "PIECEWISE"


def test_full_graph_modes_become_piecewise(resolved: tuple[dict, dict]) -> None:
    found, logs = resolved
    assert found["full_decode_only"]["cudagraph"] == "PIECEWISE"
    assert "was <CUDAGraphMode.FULL_DECODE_ONLY" in logs["full_decode_only"]


def test_graphs_none_keeps_the_compiled_model(resolved: tuple[dict, dict]) -> None:
    found, _ = resolved
    got = found["no_graphs_asked"]
    assert (got["mode"], got["cudagraph"], got["sizes"]) == ("VLLM_COMPILE", "NONE", [])


def test_tensor_parallel_runs_eagerly_with_the_reason(
    resolved: tuple[dict, dict],
) -> None:
    found, logs = resolved
    got = found["tp2"]
    assert (got["mode"], got["cudagraph"], got["sizes"]) == ("NONE", "NONE", [])
    log = logs["tp2"]
    assert "CUDA graphs OFF, the model runs eagerly" in log
    assert "tensor/pipeline parallel (2/1)" in log and "CudaCommunicator" in log


def test_missing_native_op_runs_eagerly_with_the_fix(
    resolved: tuple[dict, dict],
) -> None:
    found, logs = resolved
    assert found["native_missing"]["cudagraph"] == "NONE"
    assert found["native_missing"]["mode"] == "NONE"
    log = logs["native_missing"]
    assert "weak_ref_tensor is missing" in log
    assert "VLLM_KUNLUN_BUILD_EXT=1 scripts/setup.sh" in log


def test_engine_path_points_vllms_weak_ref_at_our_op(
    resolved: tuple[dict, dict],
) -> None:
    found, _ = resolved
    assert found["weak_ref_patched"] == "vllm_kunlun.patching.weak_ref"


# ---- the compile half on the CPU ---------------------------------------------------------

COMPILE_IN_EMULATION = """
import json, os
os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # counters of this process
from vllm.compilation.counter import compilation_counter as counter
from vllm.config import CompilationMode

from vllm_kunlun.platforms import emulation_defaults
from vllm_kunlun.platforms import graphs
from vllm_kunlun.platforms.emulation import KunlunHostEmulationPlatform
from vllm_kunlun.platforms.kunlun import KunlunPlatform

# The model compiled as on KunlunPlatform; host emulation has no graphs to capture.
KunlunHostEmulationPlatform.opaque_attention_op = KunlunPlatform.opaque_attention_op
emulation_defaults_apply = emulation_defaults.apply_emulation_defaults

def compiled_like_kunlun(cfg):
    emulation_defaults_apply(cfg)
    cc = cfg.compilation_config
    cc.mode, cc.backend, cc.compile_sizes = (
        CompilationMode.VLLM_COMPILE, graphs.COMPILE_BACKEND, [])

emulation_defaults.apply_emulation_defaults = compiled_like_kunlun

from tests.integration.e2e_runner import run_hf
from vllm import LLM, SamplingParams
llm = LLM(model=MODEL, dtype="float32", max_model_len=256, max_num_seqs=4, seed=0)
params = SamplingParams(max_tokens=TOKENS, temperature=0.0, ignore_eos=True)
outs = llm.generate(PROMPTS, params, use_tqdm=False)
job = {"name": "g", "requests": [{"prompt": p, "max_tokens": TOKENS} for p in PROMPTS]}
print("RESULT " + json.dumps({
    "tokens": [list(o.outputs[0].token_ids) for o in outs],
    "hf": [r["token_ids"] for r in run_hf({"model": MODEL, "jobs": [job]})["jobs"]["g"]],
    "pieces": counter.num_piecewise_graphs_seen,
    "capturable": counter.num_piecewise_capturable_graphs_seen,
    "compiles": counter.num_eager_compiles,
    "splitting": llm.llm_engine.vllm_config.compilation_config.splitting_ops,
}))
"""


def test_piecewise_compile_on_torch_251_matches_transformers(
    patched_root: Path, tmp_path: Path
) -> None:
    model = write_tiny_model(tmp_path / "tiny")
    code = (
        f"MODEL = {str(model)!r}\nTOKENS = 8\n"
        "PROMPTS = ['the quick brown fox', 'one two three four five']\n"
        + COMPILE_IN_EMULATION
    )
    proc = run_python(
        code,
        env={
            "VLLM_KUNLUN_HOST_EMULATION": "1",
            "PYTHONPATH": str(patched_root),
            "VLLM_CACHE_ROOT": str(tmp_path / "cache"),
            "VLLM_DISABLE_COMPILE_CACHE": "1",
            "VLLM_LOGGING_LEVEL": "INFO",
        },
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    line = next(x for x in proc.stdout.splitlines() if x.startswith("RESULT "))
    found = json.loads(line[len("RESULT ") :])
    # Two decoder layers split at their two attention calls: 5 pieces, the 3 between
    # (and around) attention are the ones a GPU captures.
    assert (found["pieces"], found["capturable"]) == (5, 3)
    assert found["compiles"] >= 3
    assert all(op in found["splitting"] for op in ATTENTION_OPS)
    assert found["tokens"] == found["hf"]
