"""The KV / state budget under MTP speculative decoding (doctor ``kv_budget`` with
``--num-speculative-tokens``, and the engine guard's estimate).

vLLM 0.15.1 keeps, per GDN layer and sequence, one state block per query token of a
speculative step (``MambaSpec.num_speculative_blocks``) whose conv state is
``num_spec`` columns wider (``gated_delta_net_state_shape(..., num_spec)``); the draft's
attention layer holds KV for every token; the sampler verifies ``1 + num_spec`` rows
per sequence. Numbers from vLLM's own calculator where it has one.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from tests.unit.checks.hybrid_budget_cases import (
    FLAT,
    NESTED,
    P800,
    check_budget,
    write_model_dir,
)
from vllm_kunlun.checks.memory_budget import estimate
from vllm_kunlun.checks.model_shape import ModelShape

WITH_MTP = {
    **NESTED,
    "text_config": {**NESTED["text_config"], "mtp_num_hidden_layers": 1},
}


def test_state_page_grows_as_vllms_calculator_says() -> None:
    from vllm.model_executor.layers.mamba.mamba_utils import MambaStateShapeCalculator

    for n in (1, 2, 3):
        conv, rec = MambaStateShapeCalculator.gated_delta_net_state_shape(
            8, 16, 48, 128, 128, 4, n
        )
        elems = conv[0] * conv[1] + rec[0] * rec[1] * rec[2]
        shape = ModelShape.from_config(FLAT).with_speculation(n)
        assert shape.state_page_bytes(8) == elems * 2  # bf16
        # 1 + n blocks per layer and sequence, each padded to one attention page
        assert shape.state_bytes_per_seq(8) == 48 * (1 + n) * (
            shape.padded_state_page_bytes(8)
        )


def test_the_draft_layer_adds_kv_per_token_only_with_speculation() -> None:
    shape = ModelShape.from_config(WITH_MTP)
    assert shape.mtp_layers == 1
    assert shape.kv_bytes_per_token(8) == 16 * 2 * 256 * 2  # the checkpoint's head idle
    assert shape.with_speculation(2).kv_bytes_per_token(8) == 17 * 2 * 256 * 2


def test_sampler_rows_and_state_count_in_the_estimate() -> None:
    shape = ModelShape.from_config(WITH_MTP)
    plain = estimate(
        shape, device_bytes=P800, utilization=0.8, tp=8, max_num_seqs=64,
        weights_bytes=3 << 30,
    )  # fmt: skip
    spec = estimate(
        shape, device_bytes=P800, utilization=0.8, tp=8, max_num_seqs=64,
        weights_bytes=3 << 30, num_spec=3,
    )  # fmt: skip
    assert spec.sampler_bytes == 4 * plain.sampler_bytes
    # 4 blocks per layer and sequence; the 3 extra conv columns (3 x 1280 bf16
    # elements) fit in the padding to one 208-token attention page.
    assert spec.padded_state_page_bytes == plain.padded_state_page_bytes
    assert spec.state_page_bytes > plain.state_page_bytes
    assert spec.state_bytes == 4 * plain.state_bytes
    assert spec.max_safe_utilization < plain.max_safe_utilization
    assert any("speculative decoding: 3 tokens" in a for a in spec.arithmetic())
    assert dataclasses.replace(spec, num_spec=0).arithmetic() != spec.arithmetic()


def test_the_doctor_counts_speculative_tokens(tmp_path: Path) -> None:
    model = write_model_dir(tmp_path, WITH_MTP)
    kw = {"tensor_parallel_size": 8, "max_num_seqs": 256, "gpu_memory_utilization": 0.8}
    plain = check_budget(model, **kw)
    spec = check_budget(model, num_speculative_tokens=2, **kw)
    # 3 blocks per layer and sequence (the conv columns fit in the page padding)
    assert spec.details["state_bytes"] == 3 * plain.details["state_bytes"]
    assert spec.details["max_safe_utilization"] < plain.details["max_safe_utilization"]
    assert "speculative decoding: 2 tokens" in "\n".join(spec.details["arithmetic"])
