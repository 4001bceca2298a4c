"""Engine-start guards through vLLM's real ``EngineArgs.create_engine_config`` under
KunlunPlatform (fake torch_xmlir reporting 8 cards), one subprocess for all cases."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import run_python

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
