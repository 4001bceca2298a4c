"""vLLM's own W8A8-INT8 scheme on a fused layer, through the plugin's kernel.

One fresh interpreter under the host emulation platform (the real platform hooks and
general plugin): ``verify_quantization`` registers the kernel, vLLM's
``CompressedTensorsConfig`` picks ``CompressedTensorsW8A8Int8`` from a config per case
(per-channel / per-tensor weights, dynamic / static, symmetric / asymmetric
activations), the scheme creates its parameters on a fused layer of two shards, the
checkpoint values are put in, and ``process_weights_after_loading`` + ``apply_weights``
run as in a model. The expected output is computed here in float64 from the checkpoint
values with vLLM's quantization rules.
"""

from __future__ import annotations

import itertools
import socket
from typing import Any

import pytest
import torch

from tests.conftest import run_python

pytestmark = pytest.mark.slow

SHARDS, K = (16, 8), 40
CASES = {
    "channel_dynamic_sym": ("channel", True, True),
    "tensor_dynamic_sym": ("tensor", True, True),
    "channel_dynamic_azp": ("channel", True, False),
    "channel_static_sym": ("channel", False, True),
    "tensor_static_azp": ("tensor", False, False),
}

SCRIPT = """
import sys, torch
from vllm.platforms import current_platform
assert type(current_platform).__name__ == "KunlunHostEmulationPlatform"
from vllm.plugins import load_general_plugins
load_general_plugins()
from vllm.distributed import parallel_state as ps
ps.init_distributed_environment(world_size=1, rank=0, local_rank=0, backend="gloo",
    distributed_init_method=f"tcp://127.0.0.1:{PORT}")
ps.initialize_model_parallel(1)
current_platform.verify_quantization("compressed-tensors")  # registers the kernel
from vllm.model_executor.layers.quantization.compressed_tensors.compressed_tensors import (
    CompressedTensorsConfig,
)

def args(strategy, dynamic, symmetric, observer):
    return {"num_bits": 8, "type": "int", "symmetric": symmetric,
            "strategy": strategy, "dynamic": dynamic, "observer": observer}

out = {}
for name, (w_strategy, dynamic, symmetric) in CASES.items():
    a_strategy = "token" if dynamic else "tensor"
    cfg = CompressedTensorsConfig.from_config({
        "quant_method": "compressed-tensors", "format": "int-quantized",
        "config_groups": {"g": {"targets": ["Linear"],
            "weights": args(w_strategy, False, True, "minmax"),
            "input_activations": args(a_strategy, dynamic, symmetric, None)}},
        "ignore": [],
    })
    (group,) = cfg.target_scheme_map.values()
    scheme = cfg._get_scheme_from_parts(group["weights"], group["input_activations"])
    layer = torch.nn.Module()
    scheme.create_weights(layer=layer, input_size_per_partition=K,
        output_partition_sizes=list(SHARDS), input_size=K, output_size=sum(SHARDS),
        params_dtype=torch.float32, weight_loader=lambda *a, **k: None)
    ckpt = DATA[name]
    with torch.no_grad():
        for key, value in ckpt["params"].items():
            getattr(layer, key).copy_(value.reshape(getattr(layer, key).shape))
    scheme.process_weights_after_loading(layer)
    y = scheme.apply_weights(layer, ckpt["x"], ckpt["bias"])
    out[name] = {"y": y, "scheme": type(scheme).__name__,
                 "kernel": type(scheme.kernel).__name__,
                 "static": scheme.is_static_input_scheme,
                 "symmetric": scheme.input_symmetric}
torch.save(out, OUT)
ps.destroy_model_parallel()
ps.destroy_distributed_environment()
"""


def checkpoint(name: str) -> dict[str, Any]:
    w_strategy, dynamic, symmetric = CASES[name]
    gen = torch.Generator().manual_seed(len(name))
    n = sum(SHARDS)
    params: dict[str, torch.Tensor] = {
        "weight": torch.randint(-128, 128, (n, K), generator=gen).to(torch.int8)
    }
    if w_strategy == "channel":
        params["weight_scale"] = torch.rand(n, 1, generator=gen) / 50 + 1e-3
    else:
        params["weight_scale"] = torch.tensor([0.01, 0.03])  # one per shard
    if not dynamic:
        params["input_scale"] = torch.tensor([0.03])
        if not symmetric:
            params["input_zero_point"] = torch.tensor([6], dtype=torch.int8)
    x = torch.randn(5, K, generator=gen) * 2
    x[0] = 0.0  # an all-zero token
    x[1, 3] = 50.0  # an outlier
    return {"params": params, "x": x, "bias": torch.randn(n, generator=gen)}


def expected(ckpt: dict[str, Any]) -> torch.Tensor:
    """float64, vLLM's rules: quantize x, exact integer product, both scales, bias."""
    p = ckpt["params"]
    x = ckpt["x"].double()
    if "input_scale" in p:  # static, per tensor
        s = p["input_scale"].double()
        zp = p.get("input_zero_point", torch.zeros(1)).double()
        q = ((x / s).round() + zp).clamp(-128, 127)
        xs, xzp = s.reshape(1, 1), zp.reshape(1, 1)
    elif "azp" in ckpt["kind"]:  # dynamic asymmetric, per token
        lo, hi = x.amin(1, keepdim=True), x.amax(1, keepdim=True)
        # vLLM divides by zero on a constant row; the plugin's documented rule widens
        # the range to include 0 (an all-zero row: scale 1, zero point -128)
        lo, hi = torch.where(lo == hi, lo.clamp(max=0), lo), hi.clamp(min=0)
        xs = (hi - lo) / 255
        xs = torch.where(xs == 0, 1.0, xs)
        xzp = (-128 - lo / xs).round()
        q = ((x / xs).round() + xzp).clamp(-128, 127)
    else:  # dynamic symmetric, per token
        absmax = x.abs().amax(1, keepdim=True)
        xs = absmax / 127
        q = torch.where(absmax > 0, x / xs, 0.0).round()
        xzp = torch.zeros_like(xs)
    ws = p["weight_scale"].double().reshape(-1)
    if ws.numel() != p["weight"].shape[0]:
        ws = torch.repeat_interleave(ws, torch.tensor(SHARDS))
    acc = (q - xzp) @ p["weight"].double().t()
    return acc * xs * ws.reshape(1, -1) + ckpt["bias"].double()


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    tmp = tmp_path_factory.mktemp("int8-layers")
    data = {name: checkpoint(name) for name in CASES}
    torch.save(data, tmp / "data.pt")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    prelude = (
        f"import torch\nPORT = {port}\nK = {K}\nSHARDS = {SHARDS}\nCASES = {CASES}\n"
        f"DATA = torch.load({str(tmp / 'data.pt')!r}, weights_only=True)\nOUT = {str(tmp / 'out.pt')!r}\n"
    )
    proc = run_python(
        prelude + SCRIPT,
        env={"VLLM_KUNLUN_HOST_EMULATION": "1", "VLLM_LOGGING_LEVEL": "INFO"},
        fakes=False,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "Selected KunlunInt8ScaledMMLinearKernel for CompressedTensorsW8A8Int8" in (
        proc.stdout + proc.stderr
    )
    out = torch.load(tmp / "out.pt", weights_only=True)
    for name in CASES:
        out[name]["ckpt"] = {**data[name], "kind": name}
    return out


@pytest.mark.parametrize("name", list(CASES))
def test_vllm_scheme_through_the_plugin_kernel(results: dict, name: str) -> None:
    r = results[name]
    _, dynamic, symmetric = CASES[name]
    assert (r["scheme"], r["kernel"]) == (
        "CompressedTensorsW8A8Int8",
        "KunlunInt8ScaledMMLinearKernel",
    )
    assert (r["static"], r["symmetric"]) == (not dynamic, symmetric)
    want = expected(r["ckpt"])
    assert r["y"].shape == want.shape and r["y"].dtype == torch.float32
    torch.testing.assert_close(r["y"].double(), want, rtol=1e-5, atol=1e-4)


def test_the_cases_are_not_trivially_equal(results: dict) -> None:
    # the scales and schemes differ enough that a mixed-up case would be caught
    ys = [results[name]["y"] for name in CASES]
    assert all(not torch.allclose(a, b) for a, b in itertools.pairwise(ys))


def test_the_expected_values_depend_on_the_rounding_rule(results: dict) -> None:
    """A reference with compressed-tensors' absmax / 127.5 would not pass: the check
    distinguishes the two conventions."""
    ckpt = results["channel_dynamic_sym"]["ckpt"]
    x = ckpt["x"].double()
    absmax = x.abs().amax(1, keepdim=True)
    q = torch.where(absmax > 0, x / (absmax / 127.5), 0.0).round().clamp(-128, 127)
    ws = ckpt["params"]["weight_scale"].double().reshape(1, -1)
    other = (q @ ckpt["params"]["weight"].double().t()) * (absmax / 127.5) * ws
    other = other + ckpt["bias"].double()
    got = results["channel_dynamic_sym"]["y"].double()
    assert not torch.allclose(got, other, rtol=1e-5, atol=1e-4)
