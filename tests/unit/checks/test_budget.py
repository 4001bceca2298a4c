"""Doctor check 7 (KV / linear-attention state budget) on local hybrid configs.

The configs follow transformers 5.2.0's Qwen3NextConfig / Qwen3_5TextConfig field names
(layer_types, linear_num_key_heads, linear_num_value_heads, linear_key_head_dim,
linear_value_head_dim, linear_conv_kernel_dim; Qwen3.5 nests them in text_config).
Expected numbers are worked out by hand in the comments.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
from pathlib import Path

import pytest

from tests.unit.checks.hybrid_budget_cases import (
    FLAT,
    GIB,
    NESTED,
    P800,
    TEXT,
    check_budget,
    write_model_dir,
)
from vllm_kunlun.checks.budget import check_kv_budget
from vllm_kunlun.checks.config_file import ConfigRangeError
from vllm_kunlun.checks.finding import Context
from vllm_kunlun.checks.model_shape import ModelShape, check_config_ranges

# Per GDN layer and sequence at TP 8 (vLLM gated_delta_net_state_shape):
#   conv      (4 - 1) x (2*16*128 + 48*128) / 8 = 3 x 1280 = 3840 elements
#   recurrent 48 / 8 heads x 128 x 128          = 98304 elements
STATE_ELEMS_PER_LAYER_TP8 = 102144
# vLLM pads each state page to one attention page (HybridAttentionMambaModelConfig):
#   attention page per token at TP 8: K,V x max(1, 4 // 8) head x 256 x 2 B = 1024 B
#   float32 page 102144 x 4 = 408576 B -> block 16 x ceil(408576 / (16 x 1024)) = 400
#   tokens -> padded page 400 x 1024 = 409600 B (the figure)
#   bfloat16 page 204288 B -> block 16 x 13 = 208 tokens -> 212992 B
FP32_PAGE_TP8, BF16_PAGE_TP8 = 409_600, 212_992
FP32_STATE_256 = 256 * 48 * FP32_PAGE_TP8  # 5_033_164_800 B = 4.6875 GiB -> "4.69 GiB"
# logits + probabilities, float32 (the device sampler makes no noise or sorted copy)
SAMPLER_256 = 2 * 256 * 151936 * 4  # 311_164_928 B = 0.29 GiB


def test_shape_reads_both_config_styles() -> None:
    flat, nested = ModelShape.from_config(FLAT), ModelShape.from_config(NESTED)
    for s in (flat, nested):
        assert (s.num_layers, s.linear_layers, s.attention_layers) == (64, 48, 16)
        assert s.state_page_bytes(8) == STATE_ELEMS_PER_LAYER_TP8 * 2  # bf16
        assert s.attention_block_size(8) == 208
        assert s.state_bytes_per_seq(8) == 48 * BF16_PAGE_TP8
        # 16 layers x K,V x max(1, 4 // 8) head x 256 x 2 B
        assert s.kv_bytes_per_token(8) == 16 * 2 * 1 * 256 * 2


def test_state_shape_agrees_with_vllm() -> None:
    from vllm.model_executor.layers.mamba.mamba_utils import MambaStateShapeCalculator

    conv, recurrent = MambaStateShapeCalculator.gated_delta_net_state_shape(
        8, 16, 48, 128, 128, 4
    )
    per_layer = conv[0] * conv[1] + recurrent[0] * recurrent[1] * recurrent[2]
    shape = ModelShape.from_config(FLAT).with_mamba_cache_dtype("float32")
    assert shape.state_page_bytes(8) == per_layer * 4
    assert shape.padded_state_page_bytes(8) == FP32_PAGE_TP8
    assert shape.state_bytes_per_seq(8) == 48 * FP32_PAGE_TP8


def test_a_larger_block_size_pads_more() -> None:
    # --block-size 512 beats vLLM's 400: the page is one 512-token attention page.
    shape = ModelShape.from_config(FLAT).with_mamba_cache_dtype("float32")
    larger = dataclasses.replace(shape, block_size=512)
    assert larger.padded_state_page_bytes(8) == 512 * 1024
    assert dataclasses.replace(shape, block_size=16).padded_state_page_bytes(8) == (
        FP32_PAGE_TP8
    )


def test_the_logs_oom_at_0_9_and_the_largest_safe_utilization(tmp_path: Path) -> None:
    """TP 8, 256 seqs, float32 GDN state: 4.69 GiB, the log's figure.

    beside the KV cache at 0.9: 0.1 x 96 GiB = 9.60 GiB
    needed: 4.6875 state + 0.29 sampler + 6.00 reserve = 10.98 GiB  -> warn
    largest safe: floor((96 - 10.9773) / 96, 0.01) = floor(0.8857) = 0.88
    """
    model = write_model_dir(tmp_path, FLAT)
    f = check_budget(
        model,
        tensor_parallel_size=8,
        max_num_seqs=256,
        gpu_memory_utilization=0.9,
        mamba_cache_dtype="float32",
    )
    assert f.status == "warn", f
    assert f.details["state_bytes"] == FP32_STATE_256
    assert f.details["headroom_bytes"] == SAMPLER_256 + 6 * GIB
    assert f.details["weights_bytes"] == 3_500_000_000  # 28 GB / TP 8
    assert f.details["max_safe_utilization"] == 0.88
    assert "leaves 9.60 GiB" in f.cause and "4.69 GiB for 256 seqs" in f.cause
    assert f.fix.startswith("use --gpu-memory-utilization 0.88")
    arithmetic = "\n".join(f.details["arithmetic"])
    assert "vLLM budget = 0.90 x 96.00 GiB = 86.40 GiB" in arithmetic
    assert "KV cache <= budget - weights = 83.14 GiB" in arithmetic
    assert "needed beside = 10.98 GiB > 9.60 GiB" in arithmetic
    assert (
        "state page per GDN layer and sequence = 408576 B, padded by vLLM to one "
        "attention page of 400 tokens = 409600 B" in arithmetic
    )


def test_0_75_worked_in_the_log(tmp_path: Path) -> None:
    model = write_model_dir(tmp_path, FLAT)
    f = check_budget(
        model,
        tensor_parallel_size=8,
        max_num_seqs=256,
        gpu_memory_utilization=0.75,
        mamba_cache_dtype="float32",
    )
    assert f.status == "ok", f
    assert "fit in 24.00 GiB" in f.cause


def test_bf16_state_pads_to_a_smaller_block(tmp_path: Path) -> None:
    # 256 x 48 x 212992 B = 2.44 GiB state + 6.29 headroom = 8.73 GiB <= 9.60: fits
    model = write_model_dir(tmp_path, NESTED)
    f = check_budget(model, tensor_parallel_size=8, max_num_seqs=256)
    assert f.details["state_bytes"] == 256 * 48 * BF16_PAGE_TP8
    assert f.status == "ok", f


@pytest.mark.parametrize(
    ("key", "value", "words"),
    [
        ("linear_num_value_heads", 0, "text_config.linear_num_value_heads = 0 is out"),
        (
            "linear_key_head_dim",
            "128",
            "text_config.linear_key_head_dim = '128' is not",
        ),
        ("num_hidden_layers", -1, "text_config.num_hidden_layers = -1 is out of range"),
        ("layer_types", ["linear_attention"] * 3, "must list num_hidden_layers = 64"),
        # Hostile values: 1e30 layers on a hybrid model_type used to build a 1e30-entry
        # layer list (GBs, never ending); negative or NaN heads crashed or passed.
        (
            "num_hidden_layers",
            1e30,
            "text_config.num_hidden_layers = 1e+30 is out of range (1 to 4096)",
        ),
        ("num_attention_heads", -24, "num_attention_heads = -24 is out of range"),
        ("num_attention_heads", 0, "num_attention_heads = 0 is out of range"),
        ("num_attention_heads", float("nan"), "num_attention_heads = nan is not a"),
        ("num_key_value_heads", "4", "num_key_value_heads = '4' is not an integer"),
        ("head_dim", 1e9, "text_config.head_dim = 1000000000.0 is out of range"),
        ("vocab_size", 1 << 40, "text_config.vocab_size = 1099511627776 is out of"),
        ("num_hidden_layers", None, "text_config.num_hidden_layers = None is not an"),
        ("layer_types", "linear_attention", "layer_types must be a list of strings"),
    ],
)
def test_out_of_range_config_values_are_named(
    tmp_path: Path, key: str, value: object, words: str
) -> None:
    model = write_model_dir(
        tmp_path, {**NESTED, "text_config": {**TEXT, key: value}}, weights_bytes=0
    )
    f = check_budget(model, tensor_parallel_size=8)
    assert f.status == "fail" and words in f.cause, f
    assert "config.json" in f.fix


def test_engine_range_check_bounds_what_a_config_sets_and_requires_nothing() -> None:
    """The engine-start guard's check: the same bounds and words as the doctor, but a
    field the config does not set (or sets to null) is no refusal: architectures name
    their dimensions differently, and the guard runs for every engine."""
    check_config_ranges({"model_type": "whisper", "d_model": 512})  # nothing to bound
    check_config_ranges({**TEXT, "head_dim": None, "linear_num_key_heads": 0})
    refused: list[tuple[dict[str, object], str]] = [
        ({**TEXT, "num_hidden_layers": 100_000}, "num_hidden_layers = 100000 is out"),
        (
            {"text_config": {"vocab_size": 1 << 30}},
            "text_config.vocab_size = 1073741824",
        ),
        ({"num_attention_heads": 0}, "num_attention_heads = 0 is out of range (1 to"),
        ({"num_key_value_heads": "4"}, "num_key_value_heads = '4' is not an integer"),
    ]
    for config, words in refused:
        with pytest.raises(ConfigRangeError, match=re.escape(words)):
            check_config_ranges(config)


def test_nothing_fits_at_any_utilization(tmp_path: Path) -> None:
    # TP 1: 48 x (3 x 10240 + 48 x 16384) x 4 B x 1024 seqs = 150 GiB of state alone
    model = write_model_dir(tmp_path, FLAT)
    f = check_budget(model, max_num_seqs=1024, mamba_cache_dtype="float32")
    assert f.status == "fail"
    assert "at any --gpu-memory-utilization" in f.cause
    assert "--tensor-parallel-size" in f.fix


def test_weights_fill_the_budget(tmp_path: Path) -> None:
    # 26.08 GiB of weights > 0.2 x 96 GiB = 19.2 GiB
    model = write_model_dir(tmp_path, FLAT)
    f = check_budget(model, max_num_seqs=1, gpu_memory_utilization=0.2)
    assert f.status == "fail" and "no room for a KV cache" in f.cause


def test_dense_model_has_no_state(tmp_path: Path) -> None:
    dense = {k: v for k, v in TEXT.items() if not k.startswith("linear_")}
    model = write_model_dir(tmp_path, {**dense, "model_type": "qwen3"}, weights_bytes=0)
    f = check_budget(model, tensor_parallel_size=8)
    assert f.status == "ok", f
    assert f.details["state_bytes"] == 0 and f.details["linear_attention_layers"] == 0
    assert any("unknown (no weight files)" in line for line in f.details["arithmetic"])


@pytest.mark.parametrize("model", [None, "Qwen/Qwen3-8B"])
def test_skipped_without_a_local_config(model: str | None) -> None:
    assert check_budget(model).status == "skip"  # type: ignore[arg-type]


def test_relative_model_resolved_against_cwd(tmp_path: Path) -> None:
    model = write_model_dir(tmp_path, FLAT)
    rel = os.path.relpath(model, tmp_path)
    f = check_kv_budget(Context(model=rel, cwd=str(tmp_path), device_memory_bytes=P800))
    assert f.status in ("ok", "warn") and f.details["linear_attention_layers"] == 48


@pytest.mark.parametrize(
    ("drop", "words"),
    [
        ("num_hidden_layers", "text_config.num_hidden_layers is missing"),
        ("num_attention_heads", "text_config.num_attention_heads is missing"),
        ("vocab_size", "text_config.vocab_size is missing"),
    ],
)
def test_missing_fields_are_named_not_a_crash(
    tmp_path: Path, drop: str, words: str
) -> None:
    text = {k: v for k, v in TEXT.items() if k != drop}
    model = write_model_dir(tmp_path, {**NESTED, "text_config": text}, weights_bytes=0)
    f = check_budget(model, tensor_parallel_size=8)
    assert f.status == "fail" and f.cause == f"config.json: {words}", f
    assert "traceback" not in f.details


def test_text_config_that_is_not_an_object(tmp_path: Path) -> None:
    model = write_model_dir(
        tmp_path, {**NESTED, "text_config": "qwen"}, weights_bytes=0
    )
    f = check_budget(model)
    assert f.status == "fail" and "text_config must be an object" in f.cause


def test_unreadable_config_is_a_skip_naming_the_file(tmp_path: Path) -> None:
    model = write_model_dir(tmp_path, FLAT, weights_bytes=0)
    (Path(model) / "config.json").write_bytes(b"\xff{}")
    f = check_budget(model)
    assert f.status == "skip" and "config.json is not UTF-8" in f.cause


# ---- which backend serves the page ----------------------------------------------
KUNLUN = "vllm_kunlun.ops.attention.kunlun.KunlunAttentionBackend"
PORTABLE = "vllm_kunlun.ops.attention.backend.PortableAttentionBackend"


@pytest.fixture
def vendor_ops(fake_vendor_path: Path, monkeypatch: pytest.MonkeyPatch) -> object:
    import kunlun_ops  # the fake, from tests/fakes
    from vllm.v1.attention.backends.registry import AttentionBackendEnum

    kunlun_ops.reset()
    monkeypatch.delenv("VLLM_KUNLUN_HOST_EMULATION", raising=False)
    yield kunlun_ops
    AttentionBackendEnum.CUSTOM.clear_override()


def _log_at_tp8(tmp_path: Path):  # type: ignore[no-untyped-def]
    return check_budget(
        write_model_dir(tmp_path, FLAT),
        tensor_parallel_size=8,
        max_num_seqs=256,
        gpu_memory_utilization=0.75,
        mamba_cache_dtype="float32",
    )


def test_the_logs_400_token_page_is_served_by_the_kunlun_kernels(
    tmp_path: Path, vendor_ops: object
) -> None:
    f = _log_at_tp8(tmp_path)
    assert f.details["attention_block_size"] == 400
    assert f.details["kernel_block_size"] == 400
    assert f.details["attention_backend"] == KUNLUN
    assert f.details["attention_platform"] == "KunlunPlatform"
    assert "attention: 400-token pages, kernel block 400, KunlunAttentionBackend" in (
        f.cause
    )


def test_without_the_vendor_kernels_the_page_goes_to_triton(
    tmp_path: Path, vendor_ops: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delattr(vendor_ops, "prefill_attention")
    f = _log_at_tp8(tmp_path)
    assert f.details["attention_backend"].endswith("TritonAttentionBackend")
    assert f.details["kernel_block_size"] == 400  # Triton: multiples of 16


def test_host_emulation_serves_the_page_on_the_portable_backend(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from vllm.v1.attention.backends.registry import AttentionBackendEnum

    monkeypatch.setenv("VLLM_KUNLUN_HOST_EMULATION", "1")
    monkeypatch.delenv("VLLM_KUNLUN_EMULATION_VENDOR", raising=False)
    try:
        f = _log_at_tp8(tmp_path)
    finally:
        AttentionBackendEnum.CUSTOM.clear_override()
    assert f.details["attention_backend"] == PORTABLE
    assert f.details["attention_platform"] == "KunlunHostEmulationPlatform"
    assert f.details["kernel_block_size"] == 400


def test_a_refused_selection_is_reported_not_raised(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from vllm_kunlun.checks import attention_path

    class Refusing:
        @classmethod
        def get_attn_backend_cls(cls, selected: object, config: object) -> str:
            raise ValueError(f"no backend for head size {config.head_size}")  # type: ignore[attr-defined]

    monkeypatch.setattr(attention_path, "platform_class", lambda: Refusing)
    f = _log_at_tp8(tmp_path)
    assert f.status == "fail", f
    assert f.details["attention_backend"] is None
    assert "the attention selection refused: no backend for head size 256" in f.cause
    assert "--attention-backend" in f.fix


class Only32Backend:
    """A backend whose kernels run 32-token blocks only (none divides a 400 page)."""

    @staticmethod
    def get_supported_kernel_block_sizes() -> list[int]:
        return [32]


def test_a_page_the_kernel_blocks_cannot_split_fails_naming_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from vllm_kunlun.checks import attention_path

    class Picks32:
        @classmethod
        def get_attn_backend_cls(cls, selected: object, config: object) -> str:
            return f"{__name__}.Only32Backend"

    monkeypatch.setattr(attention_path, "platform_class", lambda: Picks32)
    f = _log_at_tp8(tmp_path)
    assert f.status == "fail", f
    assert f.details["kernel_block_size"] is None
    assert "kernel blocks (32) do not divide the page" in f.cause
    assert "No common block size" in f.cause
    assert "--attention-backend CUSTOM" in f.fix


class _RaisingRuntime:
    """A device runtime that sees a card but fails to describe it, as torch.cuda does
    when the driver and the runtime libraries disagree."""

    def is_available(self) -> bool:
        return True

    def get_device_properties(self, index: int) -> object:
        raise RuntimeError("driver version is insufficient for runtime version")


class _NoDeviceRuntime:
    def is_available(self) -> bool:
        return False

    def get_device_properties(self, index: int) -> object:  # pragma: no cover
        raise AssertionError("not asked without a visible device")


def _log_at_0_75(tmp_path: Path, runtime: object):  # type: ignore[no-untyped-def]
    ctx = Context(
        model=write_model_dir(tmp_path, FLAT),
        tensor_parallel_size=8,
        max_num_seqs=256,
        gpu_memory_utilization=0.75,
        mamba_cache_dtype="float32",
    )  # no --device-memory-gib: the runtime is asked
    return check_kv_budget(ctx, device_runtime=runtime)


def test_a_raising_device_runtime_is_named_not_called_no_device(
    tmp_path: Path,
) -> None:
    # It used to be swallowed: "no device visible: assumed a P800", status ok.
    f = _log_at_0_75(tmp_path, _RaisingRuntime())
    assert f.status == "warn", f
    error = "RuntimeError: driver version is insufficient for runtime version"
    assert f"reading device 0's memory raised {error}" in f.cause
    assert "assumed a P800" in f.cause
    assert "fit in 24.00 GiB" in f.cause  # the estimate itself is still given
    assert "fix the device runtime" in f.fix and "--device-memory-gib" in f.fix
    assert f.details["device_runtime_error"] == error
    assert "no device visible" not in json.dumps(f.details)
    assert f"the device runtime raised ({error})" in f.details["arithmetic"][0]


def test_no_visible_device_still_assumes_a_p800_quietly(tmp_path: Path) -> None:
    f = _log_at_0_75(tmp_path, _NoDeviceRuntime())
    assert f.status == "ok", f
    assert "device_runtime_error" not in f.details
    assert "no device visible: assumed a P800" in f.details["arithmetic"][0]


# Every released Qwen3.5 / Qwen3-Next config (and so the log's model) names the
# recurrent state's dtype beside the model's bf16.
LOG_CONFIG = {**NESTED, "text_config": {**TEXT, "mamba_ssm_dtype": "float32"}}


def test_the_logs_config_keeps_the_recurrent_state_in_float32(tmp_path: Path) -> None:
    """The log's settings (TP 8, 256 seqs, vLLM's default flags) give the log's
    4.69 GiB again: conv state bf16 3840 x 2 B + recurrent float32 98304 x 4 B =
    400896 B per page, padded to 400 attention tokens = 409600 B, as all-float32."""
    model = write_model_dir(tmp_path, LOG_CONFIG)
    f = check_budget(model, tensor_parallel_size=8, max_num_seqs=256)
    assert f.details["state_dtype"] == "bfloat16"
    assert f.details["ssm_state_dtype"] == "float32"
    assert f.details["state_bytes"] == FP32_STATE_256
    assert "4.69 GiB for 256 seqs" in f.cause
    shape = ModelShape.from_config(LOG_CONFIG)
    assert shape.state_page_bytes(8) == 3840 * 2 + 98304 * 4


def test_the_operator_flag_overrides_the_checkpoints_state_dtype(
    tmp_path: Path,
) -> None:
    model = write_model_dir(tmp_path, LOG_CONFIG)
    f = check_budget(
        model, tensor_parallel_size=8, max_num_seqs=256, mamba_ssm_cache_dtype="float16"
    )
    assert f.details["ssm_state_dtype"] == "float16"
    assert f.details["state_bytes"] == 256 * 48 * BF16_PAGE_TP8
