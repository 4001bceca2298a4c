"""``ServingInfo``'s ``kv_blocks``: the page the KV manager allocates and the block the
kernels index, read from vLLM's own KV cache config and block tables.

The e2e geometry tests only meet backends whose kernel block equals the page, so a report
that echoed the page as the kernel block would pass them; here the runner's block table
splits a 400-token page into 16-token kernel blocks, as vLLM's runner does for a backend
that declares ``MultipleOf(16)`` without 400 being one of its sizes.
"""

from __future__ import annotations

from types import SimpleNamespace

import torch
from vllm.v1.kv_cache_interface import (
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
    MambaSpec,
)
from vllm.v1.worker.block_table import MultiGroupBlockTable

from vllm_kunlun.demo.serving_info import _kv_blocks


def _runner(kernel_block: int) -> SimpleNamespace:
    attention = FullAttentionSpec(
        block_size=400, num_kv_heads=1, head_size=64, dtype=torch.float32
    )
    mamba = MambaSpec(block_size=400, shapes=((4, 8),), dtypes=(torch.float32,))
    config = KVCacheConfig(
        num_blocks=4,
        kv_cache_tensors=[],
        kv_cache_groups=[
            KVCacheGroupSpec(["model.layers.3.self_attn.attn"], attention),
            KVCacheGroupSpec(
                ["model.layers.0.linear_attn", "model.layers.1.linear_attn"], mamba
            ),
        ],
    )
    tables = MultiGroupBlockTable(
        max_num_reqs=2,
        max_model_len=800,
        max_num_batched_tokens=800,
        pin_memory=False,
        device=torch.device("cpu"),
        block_sizes=[400, 400],
        kernel_block_sizes=[kernel_block, 400],
        max_num_blocks=[2, 2],
    )
    return SimpleNamespace(
        kv_cache_config=config, input_batch=SimpleNamespace(block_table=tables)
    )


def test_a_split_page_reports_the_kernel_block_the_table_indexes() -> None:
    groups = _kv_blocks(_runner(kernel_block=16))
    assert groups == [
        {
            "kind": "FullAttentionSpec",
            "layers": 1,
            "manager_block_size": 400,
            "kernel_block_size": 16,
        },
        {
            "kind": "MambaSpec",
            "layers": 2,
            "manager_block_size": 400,
            "kernel_block_size": 400,
        },
    ]


def test_an_unsplit_page_reports_the_page() -> None:
    groups = _kv_blocks(_runner(kernel_block=400))
    assert [g["kernel_block_size"] for g in groups] == [400, 400]


def test_a_runner_without_a_kv_cache_reports_nothing() -> None:
    assert _kv_blocks(SimpleNamespace()) == []
