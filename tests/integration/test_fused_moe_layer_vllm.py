"""vLLM's own ``FusedMoE`` layer built as a model builds it, on the host emulation platform.

One fresh interpreter (the real platform hooks and general plugin, world size 1, vLLM's
config in place): ``FusedMoE(...)`` must come out as the plugin's layer with the
plugin's method, its ``weight_loader`` fills the experts from per-expert checkpoint
tensors, and the layer's method computes the routed block equal to a float64 loop here.
Then the variants the plugin does not serve (EPLB, an activation the kernel lacks, int4
compressed-tensors experts) are refused while the layer is built (what an engine start
hits in its first seconds), naming the layer and the fix. (Other quantization methods,
FP8 included, are refused earlier, by the platform's ``verify_quantization``.)
"""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
import torch

from tests.conftest import run_python

pytestmark = pytest.mark.slow

E, K, H, INTER, T = 8, 2, 32, 16, 5

SCRIPT = """
import torch
from vllm.platforms import current_platform
assert type(current_platform).__name__ == "KunlunHostEmulationPlatform"
from vllm.plugins import load_general_plugins
load_general_plugins()
from vllm.config import VllmConfig, set_current_vllm_config
from vllm.distributed import parallel_state as ps
ps.init_distributed_environment(world_size=1, rank=0, local_rank=0, backend="gloo",
    distributed_init_method=f"tcp://127.0.0.1:{PORT}")
ps.initialize_model_parallel(1)
from vllm.model_executor.layers.fused_moe import FusedMoE
from vllm_kunlun.ops.moe import fused_moe_method
fused_moe_method.register_all()  # (already done by the general plugin: a no-op)

def build(prefix, **kw):
    return FusedMoE(num_experts=E, top_k=K, hidden_size=H, intermediate_size=INTER,
                    params_dtype=torch.float32, reduce_results=True, renormalize=True,
                    prefix=prefix, **kw)

out = {}
with set_current_vllm_config(VllmConfig()):
    layer = build("model.layers.0.mlp.experts")
    out["layer"] = type(layer).__name__
    out["method"] = type(layer.quant_method).__name__
    ck = DATA
    for e in range(E):
        for shard, name in (("w1", "gate"), ("w3", "up"), ("w2", "down")):
            param = layer.w2_weight if shard == "w2" else layer.w13_weight
            layer.weight_loader(param, ck[name][e], "w13_weight" if shard != "w2"
                                else "w2_weight", shard_id=shard, expert_id=e)
    layer.quant_method.process_weights_after_loading(layer)
    out["y"] = layer.quant_method.apply_monolithic(layer, ck["x"], ck["logits"])
    from vllm.model_executor.layers.quantization.compressed_tensors.compressed_tensors \
        import CompressedTensorsConfig
    int4 = CompressedTensorsConfig.from_config({
        "quant_method": "compressed-tensors", "format": "pack-quantized",
        "config_groups": {"g": {"targets": ["Linear"], "weights": {
            "num_bits": 4, "type": "int", "symmetric": True, "strategy": "group",
            "group_size": 32, "dynamic": False}}},
        "ignore": []})
    refusals = {}
    for name, kw in {"eplb": {"enable_eplb": True},
                     "activation": {"activation": "swiglustep"},
                     "int4": {"quant_config": int4}}.items():
        try:
            build(f"model.layers.{len(refusals) + 1}.mlp.experts", **kw)
            refusals[name] = None
        except ValueError as exc:
            refusals[name] = str(exc)
    out["refusals"] = refusals
torch.save(out, OUT)
ps.destroy_model_parallel()
ps.destroy_distributed_environment()
"""


def checkpoint() -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)

    def rand(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen)

    return {
        "gate": rand(E, INTER, H) / H**0.5,
        "up": rand(E, INTER, H) / H**0.5,
        "down": rand(E, H, INTER) / INTER**0.5,
        "x": rand(T, H),
        "logits": 3 * rand(T, E),
    }


def expected(ck: dict[str, torch.Tensor]) -> torch.Tensor:
    """float64: softmax top-k renormalised, each expert silu(gate x) * (up x), down."""
    probs = torch.softmax(ck["logits"].double(), dim=-1)
    w, ids = probs.topk(K, dim=-1)
    w = w / w.sum(dim=-1, keepdim=True)
    out = torch.zeros(T, H, dtype=torch.float64)
    for t in range(T):
        x = ck["x"][t].double()
        for j in range(K):
            e = int(ids[t, j])
            h = torch.nn.functional.silu(ck["gate"][e].double() @ x)
            h = h * (ck["up"][e].double() @ x)
            out[t] += w[t, j] * (ck["down"][e].double() @ h)
    return out


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> dict:
    tmp: Path = tmp_path_factory.mktemp("fused-moe-layer")
    ck = checkpoint()
    torch.save(ck, tmp / "data.pt")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    prelude = (
        f"import torch\nPORT = {port}\nE, K, H, INTER = {E}, {K}, {H}, {INTER}\n"
        f"DATA = torch.load({str(tmp / 'data.pt')!r}, weights_only=True)\n"
        f"OUT = {str(tmp / 'out.pt')!r}\n"
    )
    proc = run_python(
        prelude + SCRIPT,
        env={"VLLM_KUNLUN_HOST_EMULATION": "1", "VLLM_LOGGING_LEVEL": "INFO"},
        fakes=False,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    out = torch.load(tmp / "out.pt", weights_only=True)
    out["want"] = expected(ck)
    return out


def test_vllms_fused_moe_is_built_as_the_plugins_layer(results: dict) -> None:
    assert results["layer"] == "KunlunFusedMoE"
    assert results["method"] == "KunlunUnquantizedFusedMoEMethod"


def test_the_loaded_layer_computes_the_routed_block(results: dict) -> None:
    y = results["y"]
    assert y.shape == (T, H) and y.dtype == torch.float32
    torch.testing.assert_close(y.double(), results["want"], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    ("variant", "words"),
    [
        ("eplb", "--enable-eplb"),
        ("activation", "'swiglustep'"),
        ("int4", "CompressedTensorsWNA16MoEMethod"),
    ],
)
def test_unserved_variants_are_refused_while_the_layer_is_built(
    results: dict, variant: str, words: str
) -> None:
    why = results["refusals"][variant]
    assert why is not None, variant
    assert why.startswith("vllm-kunlun cannot serve the MoE layer 'model.layers.")
    assert words in why
