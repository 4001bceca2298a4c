"""``EngineArgs(...).create_engine_config()`` under KunlunPlatform, on a local tiny config."""

from __future__ import annotations

import json

import pytest

from tests.conftest import run_python
from tests.integration.engine_specs import TINY_QWEN3

CODE = """
import json
from vllm.engine.arg_utils import EngineArgs
from vllm.platforms import current_platform

cfg = EngineArgs(model=MODEL, skip_tokenizer_init=True).create_engine_config()


def _lora_error():
    try:
        EngineArgs(model=MODEL, skip_tokenizer_init=True,
                   enable_lora=True).create_engine_config()
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"
    return None

pc = cfg.compilation_config.pass_config
print("RESULT " + json.dumps({
    "platform": type(current_platform).__name__,
    "worker_cls": cfg.parallel_config.worker_cls,
    "block_size": cfg.cache_config.block_size,
    "device": str(cfg.device_config.device),
    "fusions": {n: getattr(pc, n) for n in ("fuse_norm_quant", "fuse_act_quant",
                "fuse_attn_quant", "enable_sp", "fuse_gemm_comms",
                "fuse_allreduce_rms")},
    "attn": current_platform.get_attn_backend_cls(None, _sel),
    "lora_error": _lora_error(),
}))
"""


@pytest.fixture(scope="module")
def engine_config(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, str]:
    model = tmp_path_factory.mktemp("tiny-qwen3")
    (model / "config.json").write_text(json.dumps(TINY_QWEN3))
    code = (
        f"MODEL = {str(model)!r}\n"
        "from vllm.v1.attention.selector import AttentionSelectorConfig\n"
        "import torch\n"
        "_sel = AttentionSelectorConfig(head_size=16, dtype=torch.bfloat16, "
        "kv_cache_dtype=None, block_size=16)\n" + CODE
    )
    proc = run_python(code, env={"FAKE_XMLIR_DEVICES": "8"})
    assert proc.returncode == 0, proc.stderr[-4000:]
    line = next(x for x in proc.stdout.splitlines() if x.startswith("RESULT "))
    return json.loads(line[len("RESULT ") :]), proc.stdout + proc.stderr


def test_engine_config_builds_under_kunlun(engine_config: tuple[dict, str]) -> None:
    result, _ = engine_config
    assert result["platform"] == "KunlunPlatform"
    assert result["device"] == "cuda"


def test_platform_defaults_are_set_and_logged(engine_config: tuple[dict, str]) -> None:
    result, log = engine_config
    assert result["worker_cls"] == "vllm_kunlun.platforms.worker.KunlunWorker"
    assert result["block_size"] == 16
    assert not any(result["fusions"].values()), result["fusions"]
    assert "vllm-kunlun default: ParallelConfig.worker_cls" in log
    assert "vllm-kunlun default: CacheConfig.block_size = 16" in log


def test_default_attention_backend_is_triton(engine_config: tuple[dict, str]) -> None:
    result, _ = engine_config
    assert result["attn"] == (
        "vllm.v1.attention.backends.triton_attn.TritonAttentionBackend"
    )


def test_lora_is_accepted_on_a_lora_capable_model(
    engine_config: tuple[dict, str],
) -> None:
    result, _ = engine_config
    assert result["lora_error"] is None


def test_a_hybrid_budget_below_one_page_is_refused_by_the_real_config(
    tmp_path: pytest.TempPathFactory,
) -> None:
    """vLLM's own config pipeline: the hybrid page (16 tokens for the tiny Qwen3.5),
    prefix caching turning on mamba_cache_mode 'align', then the platform's guard; a
    budget of one page passes."""
    from vllm_kunlun.demo.tiny_model import write_tiny_model
    from vllm_kunlun.demo.tiny_qwen3_5 import TinyQwen3_5Spec

    model = write_tiny_model(tmp_path / "tiny35", TinyQwen3_5Spec())  # type: ignore[operator]
    composite = write_tiny_model(
        tmp_path / "tiny35vl",  # type: ignore[operator]
        TinyQwen3_5Spec(layout="composite"),
    )
    proc = run_python(
        f"""
        from vllm.engine.arg_utils import EngineArgs

        def config(budget):
            return EngineArgs(
                model={str(model)!r}, dtype="float32", enable_prefix_caching=True,
                max_num_batched_tokens=budget, max_num_seqs=4, max_model_len=64,
            ).create_engine_config()

        try:
            config(8)
            print("REFUSED no")
        except Exception as exc:
            print("REFUSED", str(exc).splitlines()[1].strip()[:400])
        c = config(16)
        print("PASSED", c.cache_config.block_size, c.cache_config.mamba_cache_mode)
        for name, path in (("CAUSAL", {str(model)!r}), ("COMPOSITE", {str(composite)!r})):
            try:
                EngineArgs(
                    model=path, dtype="float32", enable_lora=True,
                    max_num_seqs=4, max_model_len=64,
                ).create_engine_config()
                print("LORA", name, "accepted")
            except Exception as exc:
                print("LORA", name, " ".join(str(exc).split())[:600])
        """,
        env={"VLLM_KUNLUN_HOST_EMULATION": "1"},
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    refused = next(x for x in proc.stdout.splitlines() if x.startswith("REFUSED"))
    assert (
        "max_num_batched_tokens=8 is smaller than this hybrid model's attention "
        "page of 16 tokens" in refused
    ), refused
    assert "--max-num-batched-tokens 16 or more" in refused
    assert "PASSED 16 align" in proc.stdout
    # The causal Qwen3.5 is served with LoRA; the composite (text layers under
    # model.language_model.*, which a peft adapter's names would not match) is refused.
    assert "LORA CAUSAL accepted" in proc.stdout, proc.stdout[-2000:]
    lora = next(x for x in proc.stdout.splitlines() if x.startswith("LORA COMPOSITE"))
    assert "--enable-lora: Qwen3_5ForConditionalGeneration" in lora, lora
    assert "model.language_model" in lora and "Qwen3_5ForCausalLM" in lora, lora
