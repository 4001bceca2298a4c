"""Engine-start guards through vLLM's real ``EngineArgs.create_engine_config`` under
KunlunPlatform (fake torch_xmlir reporting 8 cards), one subprocess for all cases; and
the model-dimension guard through a real ``LLM(model=DIR)`` in host emulation, one
subprocess for its three checkpoints (each refused before an engine process starts)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import child_env, run_python
from vllm_kunlun.demo.tiny_model import write_tiny_model

REAL = "Qwen3.8-27B-W8A8-INT8-Dynamic"

# Qwen3-Next field names (transformers 5.2.0 Qwen3NextConfig); 64 layers, 48 GDN.
HYBRID = {
    "architectures": ["Qwen3NextForCausalLM"],
    "model_type": "qwen3_next",
    "vocab_size": 151936,
    "hidden_size": 5120,
    "intermediate_size": 17408,
    "num_hidden_layers": 64,
    "num_attention_heads": 24,
    "num_key_value_heads": 4,
    "head_dim": 256,
    "max_position_embeddings": 4096,
    "layer_types": (["linear_attention"] * 3 + ["full_attention"]) * 16,
    "linear_conv_kernel_dim": 4,
    "linear_key_head_dim": 128,
    "linear_value_head_dim": 128,
    "linear_num_key_heads": 16,
    "linear_num_value_heads": 48,
    "num_experts": 8,
    "num_experts_per_tok": 2,
    "moe_intermediate_size": 512,
    "shared_expert_intermediate_size": 512,
    "dtype": "bfloat16",
}

CODE = """
import json, os
from vllm.engine.arg_utils import EngineArgs
from vllm.platforms import current_platform

def attempt(model):
    try:
        EngineArgs(model=model, skip_tokenizer_init=True).create_engine_config()
    except Exception as exc:
        return [type(exc).__name__, [c.__name__ for c in type(exc).__mro__], str(exc)]
    return None

out = {
    "platform": type(current_platform).__name__,
    "absolute": attempt(os.path.join(os.getcwd(), "models", "Qwen3.8")),
    "relative": attempt("models/Qwen3.8"),
    "layers": attempt(os.path.join(os.getcwd(), "layers")),
}
cfg = EngineArgs(model=os.path.join(os.getcwd(), "hybrid"), skip_tokenizer_init=True,
                 tensor_parallel_size=8, max_num_seqs=256, gpu_memory_utilization=0.9,
                 mamba_cache_dtype="float32", swap_space=0).create_engine_config()
out["hybrid_tp"] = cfg.parallel_config.tensor_parallel_size
out["hybrid_block_size"] = cfg.cache_config.block_size
out["hybrid_page_padded"] = cfg.cache_config.mamba_page_size_padded
print("RESULT " + json.dumps(out))
"""


@pytest.mark.slow
def test_engine_guards(tmp_path: Path) -> None:
    (tmp_path / "models" / REAL).mkdir(parents=True)
    (tmp_path / "models" / "Llama-3.1-8B").mkdir()
    (tmp_path / "hybrid").mkdir()
    (tmp_path / "hybrid" / "config.json").write_text(json.dumps(HYBRID))
    _tiny_with(tmp_path / "layers", num_hidden_layers=100_000)
    proc = run_python(CODE, env={"FAKE_XMLIR_DEVICES": "8"}, cwd=tmp_path)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output[-4000:]
    line = next(x for x in proc.stdout.splitlines() if x.startswith("RESULT "))
    res = json.loads(line[len("RESULT ") :])
    assert res["platform"] == "KunlunPlatform"

    # A bad local-looking path: our message and suggestion, not HFValidationError.
    name, mro, msg = res["absolute"]
    assert name == "ModelPathError" and "ValueError" in mro
    assert "HFValidationError" not in mro
    assert f"did you mean '{tmp_path}/models/{REAL}'?" in msg
    assert "Llama" not in msg
    # models/Qwen3.8 is a well-formed Hub id; it is local because ./models exists.
    name, _, msg = res["relative"]
    assert name == "ModelPathError"
    assert f"did you mean 'models/{REAL}'?" in msg
    # 100000 layers: the doctor's range check at engine start on Kunlun too.
    name, mro, msg = res["layers"]
    assert name == "ModelDimensionError" and "ValidationError" not in mro
    assert "num_hidden_layers = 100000 is out of range (1 to 4096)" in msg

    # The budget guard in check_and_update_config: same numbers as the doctor.
    assert res["hybrid_tp"] == 8
    assert "vllm-kunlun: memory budget: at --gpu-memory-utilization 0.90" in output
    # vLLM's own HybridAttentionMambaModelConfig pads each GDN page to one attention
    # page of 400 tokens (409600 B); the guard counts the state the same way.
    assert (res["hybrid_block_size"], res["hybrid_page_padded"]) == (400, 409_600)
    assert "linear-attention state (4.69 GiB for 256 seqs)" in output
    assert "use --gpu-memory-utilization 0.88 (largest safe)" in output
    assert "needed beside = 10.98 GiB > 9.60 GiB" in output
    assert "padded by vLLM to one attention page of 400 tokens = 409600 B" in output


def _tiny_with(directory: Path, **config: object) -> Path:
    """The tiny Qwen3 checkpoint (real weights, tokenizer) with ``config`` overriding
    its config.json: only the config lies, as in a broken or hostile checkpoint."""
    write_tiny_model(directory)
    path = directory / "config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), **config}))
    return directory


# A refusal must come from the front end's config stage: no engine process, no layers.
# Each attempt is bounded (SIGALRM) after vLLM's import, which alone takes 20-200 s on
# a loaded host; an attempt still running at the bound is recorded as not refused and
# the child stops there (its engine processes go with it).
ATTEMPT_S = 120
RANGES_CODE = f"""
import json, os, signal, sys, time
from vllm import LLM
from vllm.platforms import current_platform
import vllm.v1.engine.llm_engine  # what LLM() imports lazily, so attempts time the guard

current_platform.device_type  # resolves the platform (plugins load) before timing

class NotRefused(Exception):
    pass

def bound(signum, frame):
    raise NotRefused("LLM(model=DIR) still running after {ATTEMPT_S} s: not refused")

signal.signal(signal.SIGALRM, bound)

def attempt(name):
    start = time.monotonic()
    signal.alarm({ATTEMPT_S})
    try:
        LLM(model=os.path.join(os.getcwd(), name), max_model_len=256, dtype="float32")
    except Exception as exc:
        return [type(exc).__name__, str(exc), time.monotonic() - start]
    finally:
        signal.alarm(0)
    return ["started", "", time.monotonic() - start]

out = {{}}
for name in sys.argv[1:]:
    out[name] = attempt(name)
    print("ATTEMPT " + json.dumps([name, out[name]]), flush=True)
    if out[name][0] != "ModelDimensionError":
        break
print("RESULT " + json.dumps(out), flush=True)
"""


def _attempt_ranges(
    cwd: Path, names: list[str], code: str = RANGES_CODE
) -> tuple[dict, str]:
    """Run ``code`` (the attempts) in host emulation: what each attempt raised, and
    the child's output."""
    proc = subprocess.run(
        [sys.executable, "-c", code, *names],
        env=child_env({"VLLM_KUNLUN_HOST_EMULATION": "1"}),
        capture_output=True,
        text=True,
        timeout=900,  # a backstop only: each attempt is bounded in the child
        cwd=cwd,
    )
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output[-4000:]
    line = next(x for x in proc.stdout.splitlines() if x.startswith("RESULT "))
    return dict(json.loads(line[len("RESULT ") :])), output


@pytest.mark.slow
def test_absurd_dimensions_are_refused_before_the_model_is_built(
    tmp_path: Path,
) -> None:
    """``num_hidden_layers: 100000`` used to pass vLLM's config stage and build layers
    for minutes (4.8 GB after 240 s); a million heads or a 2^30 vocabulary likewise.
    Each must be refused at engine start with the doctor's field, value, bound and fix,
    in seconds, before vLLM starts an engine process."""
    cases = {
        "layers": ("num_hidden_layers", 100_000, "(1 to 4096)"),
        "heads": ("num_attention_heads", 1_000_000, "(1 to 4096)"),
        "vocab": ("vocab_size", 1 << 30, f"(1 to {1 << 24})"),
    }
    for name, (field, value, _) in cases.items():
        _tiny_with(tmp_path / name, **{field: value})
    res, output = _attempt_ranges(tmp_path, list(cases))
    for name, (field, value, bound) in cases.items():
        kind, msg, seconds = res.get(name, ["skipped", "an attempt before failed", 0])
        assert kind == "ModelDimensionError", (name, kind, msg[-2000:])
        assert f"config.json: {field} = {value} is out of range {bound}" in msg
        assert str(tmp_path / name) in msg  # which model
        assert "Fix: fix the model's config.json" in msg
        # The config stage, not a model build: the first attempt also pays for
        # transformers' config imports (20-45 s on a loaded 2-core host), the others
        # only for vLLM's config objects and the guard.
        assert seconds < (60 if name == "layers" else 10), (name, seconds)
    assert "Initializing a V1 LLM engine" not in output  # no engine core started
