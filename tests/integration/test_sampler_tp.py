"""Tensor-parallel consistency: every TP rank emits TP rank 0's tokens; the TP group's
collectives work under inference mode on gloo.

Two CPU processes form a real vLLM TP group (gloo) under the host emulation platform,
with the runtime patches applied by the plugin's own general-plugin entry point. Their
RNGs are seeded differently (as Kunlun ranks' device RNGs may be); with the broadcast on
they must sample identical tokens, with VLLM_KUNLUN_TP_SAMPLE_BROADCAST=0 they must not.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import textwrap

import pytest

from tests.conftest import REPO, child_env

pytestmark = pytest.mark.slow

RANK_SCRIPT = textwrap.dedent(
    """
    import json, os, sys
    import torch
    rank, port = int(sys.argv[1]), sys.argv[2]
    from vllm.platforms import current_platform
    assert type(current_platform).__name__ == "KunlunHostEmulationPlatform"
    from vllm.plugins import load_general_plugins
    load_general_plugins()  # the plugin's register_runtime_fixes applies the patches
    from vllm.distributed import parallel_state as ps
    ps.init_distributed_environment(
        world_size=2, rank=rank, local_rank=rank, backend="gloo",
        distributed_init_method=f"tcp://127.0.0.1:{port}",
    )
    ps.initialize_model_parallel(tensor_model_parallel_size=2)
    result = {}
    # The collectives vLLM's model runner calls, under its inference mode (logits).
    tp = ps.get_tp_group()
    with torch.inference_mode():
        part = (torch.arange(3.0) + 10 * rank).view(1, 3)
        gathered = tp.all_gather(part, dim=-1)
        collected = tp.gather(part, dst=0, dim=0)
    result["communicator"] = type(tp.device_communicator).__name__
    result["all_gather"] = gathered.tolist()
    result["gather"] = None if collected is None else collected.tolist()
    from vllm.v1.sample.logits_processor import LogitsProcessors
    from vllm.v1.sample.metadata import SamplingMetadata
    from vllm.v1.sample.sampler import Sampler

    def metadata(batch, generators):
        return SamplingMetadata(
            temperature=torch.ones(batch), all_greedy=False, all_random=True,
            top_p=torch.full((batch,), 0.95), top_k=None, generators=generators,
            max_num_logprobs=None, no_penalties=True, prompt_token_ids=None,
            frequency_penalties=torch.zeros(batch),
            presence_penalties=torch.zeros(batch),
            repetition_penalties=torch.ones(batch),
            output_token_ids=[[] for _ in range(batch)], allowed_token_ids_mask=None,
            bad_words_token_ids={}, logitsprocs=LogitsProcessors(),
        )

    sampler = Sampler()
    assert type(sampler.topk_topp_sampler).__name__ == "KunlunTopKTopPSampler"
    torch.manual_seed(1000 + rank)  # the ranks' RNGs differ
    logits = torch.randn(16, 2000, generator=torch.Generator().manual_seed(5))
    for setting in ("1", "0"):
        os.environ["VLLM_KUNLUN_TP_SAMPLE_BROADCAST"] = setting
        drawn = []
        for step in range(3):
            out = sampler(logits.clone(), metadata(16, {}))
            drawn.append(out.sampled_token_ids.view(-1).tolist())
            # A seeded request whose generator differs per rank, too.
            gens = {3: torch.Generator().manual_seed(77 + rank)}
            out = sampler(logits.clone(), metadata(16, gens))
            drawn.append(out.sampled_token_ids.view(-1).tolist())
        result[setting] = drawn
    print("RESULT " + json.dumps(result), flush=True)
    ps.destroy_model_parallel()
    ps.destroy_distributed_environment()
    """
)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_tp_ranks_with_different_rngs_emit_identical_tokens() -> None:
    env = child_env({"VLLM_KUNLUN_HOST_EMULATION": "1", "VLLM_LOGGING_LEVEL": "INFO"})
    port = str(_free_port())
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", RANK_SCRIPT, str(rank), port],
            env=env,
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for rank in (0, 1)
    ]
    outputs = []
    try:
        for proc in procs:
            out, _ = proc.communicate(timeout=480)
            assert proc.returncode == 0, out[-4000:]
            outputs.append(out)
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
    results = []
    for out in outputs:
        line = next(x for x in out.splitlines() if x.startswith("RESULT "))
        results.append(json.loads(line[len("RESULT ") :]))
    rank0, rank1 = results
    for r in results:
        assert r["communicator"] == "KunlunCommunicator"
        assert r["all_gather"] == [[0.0, 1.0, 2.0, 10.0, 11.0, 12.0]]
    assert rank0["gather"] == [[0.0, 1.0, 2.0], [10.0, 11.0, 12.0]]
    assert rank1["gather"] is None
    assert rank0["1"] == rank1["1"]  # broadcast on (the default)
    assert rank0["0"] != rank1["0"]  # negative control: the RNGs really differ
    assert "TP rank 0 samples for its 2-rank TP group" in outputs[1]
