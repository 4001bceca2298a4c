"""KunlunPlatform's methods, called directly (no engine)."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from vllm.platforms.interface import Platform, PlatformEnum
from vllm.v1.attention.backends.registry import AttentionBackendEnum
from vllm.v1.attention.selector import AttentionSelectorConfig

from vllm_kunlun.platforms.kunlun import KunlunPlatform

SEL = AttentionSelectorConfig(
    head_size=128, dtype=torch.bfloat16, kv_cache_dtype=None, block_size=16
)


def test_identity() -> None:
    p = KunlunPlatform
    assert issubclass(p, Platform)
    assert p._enum is PlatformEnum.OOT
    assert (p.device_name, p.device_type, p.dispatch_key) == ("cuda", "cuda", "CUDA")
    assert (p.dist_backend, p.ray_device_key) == ("nccl", "GPU")
    assert p.device_control_env_var == "XPU_VISIBLE_DEVICES"
    inst = object.__new__(p)  # no __init__: keep this process's torch untouched
    assert inst.is_cuda() is False and inst.is_out_of_tree() is True


def test_every_base_not_implemented_method_is_overridden() -> None:
    not_implemented = []
    for name, attr in vars(Platform).items():
        func = getattr(attr, "__func__", attr)
        code = getattr(func, "__code__", None)
        if code is not None and "NotImplementedError" in code.co_names:
            not_implemented.append(name)
    assert "get_device_name" in not_implemented  # the scan finds them
    missing = [
        n
        for n in not_implemented
        if not any(n in vars(k) for k in KunlunPlatform.__mro__ if k is not Platform)
    ]
    assert missing == []


def test_device_count_comes_from_torch_xmlir(
    fake_vendor_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_XMLIR_DEVICES", "3")
    assert KunlunPlatform.device_count() == 3


def test_device_count_is_zero_without_torch_xmlir() -> None:
    assert KunlunPlatform.device_count() == 0


def test_total_memory_is_the_device_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    p800 = SimpleNamespace(total_memory=103_100_000_000, uuid=None)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: p800)
    assert KunlunPlatform.get_device_total_memory(0) == 103_100_000_000
    # Without a uuid from the runtime the physical index identifies the card.
    monkeypatch.setenv("XPU_VISIBLE_DEVICES", "4,5")
    assert KunlunPlatform.get_device_uuid(1) == "KUNLUN-5"


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_supported_dtypes(dtype: torch.dtype) -> None:
    KunlunPlatform.check_if_supports_dtype(dtype)


def test_unsupported_dtype_names_the_fix() -> None:
    with pytest.raises(ValueError, match="use --dtype bfloat16"):
        KunlunPlatform.check_if_supports_dtype(torch.float64)


def test_default_attention_backend_is_triton() -> None:
    path = KunlunPlatform.get_attn_backend_cls(None, SEL)
    assert path == AttentionBackendEnum.TRITON_ATTN.get_path()


def test_explicit_triton_choice_is_honoured() -> None:
    path = KunlunPlatform.get_attn_backend_cls(AttentionBackendEnum.TRITON_ATTN, SEL)
    assert path == AttentionBackendEnum.TRITON_ATTN.get_path()


@pytest.mark.parametrize(
    ("backend", "why"),
    [
        (AttentionBackendEnum.FLASH_ATTN, "FlashAttention"),
        (AttentionBackendEnum.FLASHINFER, "flashinfer"),
    ],
)
def test_backends_needing_vllm_c_are_refused(
    backend: AttentionBackendEnum, why: str
) -> None:
    with pytest.raises(ValueError, match=why) as err:
        KunlunPlatform.get_attn_backend_cls(backend, SEL)
    assert "TRITON_ATTN" in str(err.value)


def test_mla_layers_get_the_plugins_mla_backend() -> None:
    path = KunlunPlatform.get_attn_backend_cls(None, SEL._replace(use_mla=True))
    assert path == "vllm_kunlun.ops.mla.backend.PluginMLABackend"
    with pytest.raises(ValueError, match="DSA lightning indexer"):
        KunlunPlatform.get_attn_backend_cls(
            None, SEL._replace(use_mla=True, use_sparse=True)
        )


def test_the_punica_wrapper_is_the_plugins_and_resolves() -> None:
    from vllm.lora.punica_wrapper.punica_base import PunicaWrapperBase
    from vllm.utils.import_utils import resolve_obj_by_qualname

    name = KunlunPlatform.get_punica_wrapper()
    assert name.startswith("vllm_kunlun.ops.lora.")
    assert issubclass(resolve_obj_by_qualname(name), PunicaWrapperBase)


# One rank of the two-rank test: its own input, an all-reduce on the stateless group
# of each platform, the result printed for the parent to check.
_RANK = """
import json, sys
from datetime import timedelta
from vllm_kunlun.patching import schema

schema.apply()  # what the platform does first on torch 2.5.1 (vllm.distributed needs it)
import torch
from torch.distributed import PrefixStore, TCPStore
from vllm_kunlun.platforms.emulation import KunlunHostEmulationPlatform
from vllm_kunlun.platforms.kunlun import KunlunPlatform

rank, port = int(sys.argv[1]), int(sys.argv[2])
store = TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=60))
out = {}
for platform in (KunlunPlatform, KunlunHostEmulationPlatform):
    name = platform.__name__
    pg = platform.stateless_init_device_torch_dist_pg(
        "gloo", PrefixStore(name, store), rank, 2, timedelta(seconds=60)
    )
    t = torch.tensor([1.0 + rank, 10.0 ** (rank + 1)])
    pg.allreduce([t]).wait()
    out[name] = {"sum": t.tolist(), "rank": pg.rank(), "size": pg.size()}
print("RESULT " + json.dumps(out), flush=True)
"""


@pytest.mark.slow
def test_stateless_gloo_group_really_communicates() -> None:
    """Two processes, each with different input, all-reduce through the stateless group
    (vLLM's DP / KV-transfer groups) of both platforms: each rank must hold the sum of
    both inputs, which neither had alone."""
    import json
    import subprocess
    import sys

    from torch.distributed import TCPStore

    from tests.conftest import REPO, child_env

    store = TCPStore("127.0.0.1", 0, is_master=True, timeout=timedelta(seconds=60))
    ranks = [
        subprocess.Popen(
            [sys.executable, "-c", _RANK, str(rank), str(store.port)],
            env=child_env(),
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for rank in range(2)
    ]
    outputs = []
    try:
        for proc in ranks:
            outputs.append(proc.communicate(timeout=300)[0])
    except subprocess.TimeoutExpired:
        for proc in ranks:
            proc.kill()
        tails = [(p.communicate()[0] or "")[-2000:] for p in ranks]
        pytest.fail(f"a rank did not finish in 300 s; their output: {tails}")
    for rank, (proc, output) in enumerate(zip(ranks, outputs, strict=True)):
        assert proc.returncode == 0, f"rank {rank}: {output[-3000:]}"
        line = next(x for x in output.splitlines() if x.startswith("RESULT "))
        for name, got in json.loads(line[len("RESULT ") :]).items():
            # rank 0 sent [1, 10], rank 1 [2, 100]
            assert got == {"sum": [3.0, 110.0], "rank": rank, "size": 2}, (name, got)


def test_nccl_branch_reaches_torchs_nccl_backend() -> None:
    """The nccl branch builds torch's ProcessGroupNCCL (Kunlun's NCCL-compatible library
    on a card), not a quiet gloo fallback: on this host without a GPU torch's own
    constructor refuses, which shows the branch got there. A real NCCL collective
    cannot run here (no device)."""
    from torch.distributed import HashStore, PrefixStore

    if torch.cuda.is_available():
        pytest.skip("a device is visible: the constructor would succeed")
    with pytest.raises(
        ValueError, match="ProcessGroupNCCL is only supported with GPUs"
    ):
        KunlunPlatform.stateless_init_device_torch_dist_pg(
            "nccl", PrefixStore("n", HashStore()), 0, 1, timedelta(seconds=5)
        )


def test_nccl_branch_passes_store_ranks_and_timeout_and_registers_the_backend(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """What the nccl branch hands torch, with torch's real ProcessGroup, real NCCL
    options and real backend registration. Only ProcessGroupNCCL's constructor (it
    needs a GPU) is replaced: by one that records its arguments and returns a real
    gloo backend on the same store, rank and size. What cannot run here: NCCL itself
    (Kunlun's collective library) and a collective on the device group."""
    import torch.distributed.distributed_c10d as c10d
    from torch.distributed import HashStore, PrefixStore, ProcessGroup

    real_nccl = c10d.ProcessGroupNCCL
    calls: list[tuple] = []
    made: list[c10d.ProcessGroupGloo] = []

    class RecordingNCCL:
        Options = real_nccl.Options

        def __new__(cls, store, rank, size, options):  # type: ignore[no-untyped-def]
            calls.append((store, rank, size, options))
            made.append(c10d.ProcessGroupGloo(store, rank, size, options._timeout))
            return made[-1]

    monkeypatch.setattr(c10d, "ProcessGroupNCCL", RecordingNCCL)
    store = PrefixStore("nccl-args", HashStore())
    pg = KunlunPlatform.stateless_init_device_torch_dist_pg(
        "nccl", store, 0, 1, timedelta(seconds=7)
    )
    ((got_store, rank, size, options),) = calls
    assert got_store is store and (rank, size) == (0, 1)
    assert isinstance(options, real_nccl.Options)
    assert options._timeout == timedelta(seconds=7)  # vLLM's timeout, not NCCL's 10 min
    assert isinstance(pg, ProcessGroup) and (pg.rank(), pg.size()) == (0, 1)
    assert pg._get_backend_name() == "nccl"  # the group's default backend
    assert pg._get_backend(torch.device("cuda")) is made[0]  # registered for cuda


def test_unknown_backend_is_refused() -> None:
    from torch.distributed import HashStore, PrefixStore

    with pytest.raises(ValueError, match="nccl and gloo backends"):
        KunlunPlatform.stateless_init_device_torch_dist_pg(
            "mpi", PrefixStore("x", HashStore()), 0, 1, timedelta(seconds=5)
        )


def test_emulation_groups_are_gloo_only() -> None:
    from torch.distributed import HashStore, PrefixStore

    from vllm_kunlun.platforms.emulation import KunlunHostEmulationPlatform

    with pytest.raises(ValueError, match="supports the gloo backends, not 'nccl'"):
        KunlunHostEmulationPlatform.stateless_init_device_torch_dist_pg(
            "nccl", PrefixStore("y", HashStore()), 0, 1, timedelta(seconds=5)
        )


_MASKED_LOOKUP = """
import json
import torch
from torch._dynamo.utils import counters
from vllm.model_executor.layers.vocab_parallel_embedding import (
    get_masked_input_and_mask,
)
from vllm.platforms import current_platform

# TP rank 1 of 2 over a 100-token vocabulary: it holds ids 50..99.
ids = torch.tensor([0, 49, 50, 77, 99, 100, 130])
masked, outside = get_masked_input_and_mask(ids, 50, 100, 0, 100, 100)
print("RESULT " + json.dumps({
    "platform": type(current_platform).__name__,
    "masked": masked.tolist(),
    "outside": outside.tolist(),
    "inductor": dict(counters["inductor"]),
}), flush=True)
"""


@pytest.mark.slow
def test_emulated_tp_vocab_lookup_compiles_without_inductor() -> None:
    """Every TP > 1 worker runs vLLM's torch.compile'd masked vocab lookup at its first
    step. Under host emulation it must go through Dynamo alone, as on Kunlun: with
    vLLM's default (Inductor) each worker would generate and compile C++ with the
    host's toolchain (minutes of CPU on a 2-core runner) and test a path no Kunlun card
    takes."""
    import json

    from tests.conftest import run_python

    proc = run_python(_MASKED_LOOKUP, env={"VLLM_KUNLUN_HOST_EMULATION": "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = next(x for x in proc.stdout.splitlines() if x.startswith("RESULT "))
    got = json.loads(line[len("RESULT ") :])
    assert got["platform"] == "KunlunHostEmulationPlatform"
    # Shard-local ids for 50..99, 0 elsewhere; the mask marks what another rank holds.
    assert got["masked"] == [0, 0, 0, 27, 49, 0, 0]
    assert got["outside"] == [True, True, False, False, False, True, True]
    assert got["inductor"] == {}, got["inductor"]
