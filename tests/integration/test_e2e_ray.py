"""vLLM's own Ray executor in host emulation (issue 24).

- ``local``: ``LLM(tensor_parallel_size=2, distributed_executor_backend="ray")`` with no
  cluster: vLLM starts Ray itself, which counts the two emulated cards as GPUs
  (RAY_OVERRIDE_RESOURCES, platforms/kunlun_defaults.py).
- ``two_nodes``: a Ray cluster of two nodes on this host (``ray.cluster_utils.Cluster``,
  one emulated card each, distinct node addresses as vLLM requires), the engine at
  TP 1 x PP 2, one stage per node. Not TP 2 x PP 2: four workers, two raylets and the
  engine on a 2-core CI machine cost minutes; TP under Ray is ``local``'s.
- ``too_small``: the same cluster asked for four cards fails within
  VLLM_KUNLUN_RAY_PG_TIMEOUT naming the ask, the cluster and the fix
  (platforms/ray_patches.py), where vLLM alone waits 1800 s.

Greedy output is transformers' on the same checkpoint, decoded in the runner's process.
Tests run in file order: ``local`` must not find the module's cluster (``ray.init()``
joins a cluster running on this host).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import REPO, child_env, run_python
from tests.integration.test_e2e_emulation import EMULATION, req
from vllm_kunlun.demo.tiny_model import write_tiny_model

pytestmark = pytest.mark.slow

RUNNER = Path(__file__).with_name("e2e_runner.py")
LLM_ARGS = {
    "dtype": "float32",
    "max_model_len": 128,
    "max_num_seqs": 4,
    "block_size": 16,
    "seed": 0,
    "distributed_executor_backend": "ray",
}
JOBS = [
    {
        "name": "greedy",
        "requests": [
            req("the quick brown fox jumps over the lazy dog", 8),
            req("one two three", 8),
            req("kunlun", 8),
        ],
    }
]
ENGINE_TIMEOUT = 240  # seconds, one engine on vLLM's Ray executor


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("e2e_ray")


@pytest.fixture(scope="module")
def model_dir(work: Path) -> str:
    return str(write_tiny_model(work / "tiny-qwen3"))


def run_engine(
    work: Path, name: str, model: str, llm: dict[str, Any], env: dict[str, str]
) -> tuple[dict, str]:
    """The runner on a greedy spec with its transformers reference; its result and
    its log (vLLM's, the Ray workers' included)."""
    spec = {"backend": "vllm", "model": model, "llm": llm, "jobs": JOBS}
    spec["hf_jobs"] = JOBS
    spec_path, out_path = work / f"{name}.spec.json", work / f"{name}.out.json"
    spec_path.write_text(json.dumps(spec))
    proc = subprocess.run(
        [sys.executable, str(RUNNER), str(spec_path), str(out_path)],
        env=child_env({**EMULATION, "VLLM_LOGGING_LEVEL": "DEBUG", **env}),
        capture_output=True,
        text=True,
        timeout=ENGINE_TIMEOUT,
        cwd=REPO,
    )
    result = json.loads(out_path.read_text()) if out_path.exists() else {}
    log = proc.stdout + proc.stderr
    if proc.returncode != 0 or result.get("error"):
        pytest.fail(
            f"{name}: exit {proc.returncode}\n{result.get('error')}\n{log[-6000:]}"
        )
    return result, log


def assert_greedy_is_transformers(result: dict) -> None:
    got = [r["token_ids"] for r in result["jobs"]["greedy"]]
    want = [r["token_ids"] for r in result["hf"]["greedy"]]
    assert len(got) == 3 and all(len(ids) == 8 for ids in got)
    assert got == want


def test_local_ray_tp2_generates_what_transformers_does(
    work: Path, model_dir: str
) -> None:
    result, log = run_engine(
        work, "local", model_dir, {**LLM_ARGS, "tensor_parallel_size": 2}, {}
    )
    assert_greedy_is_transformers(result)
    assert 'RAY_OVERRIDE_RESOURCES={"GPU": 2}' in log
    assert "RayWorkerWrapper" in log  # the workers were Ray actors
    assert len(result["serving"]) == 2


@pytest.fixture(scope="module")
def cluster() -> Iterator[Any]:
    """Two Ray nodes on this host, one emulated card and one CPU each. The second
    node has its own address (vLLM refuses two nodes on one IP) and its workers say
    so through VLLM_HOST_IP."""
    from ray.cluster_utils import Cluster

    env = {"VLLM_KUNLUN_HOST_EMULATION": "1"}
    cluster = Cluster(
        initialize_head=True,
        head_node_args={"num_cpus": 1, "num_gpus": 1, "env_vars": env},
    )
    head_ip = cluster.head_node.node_ip_address
    other_ip = "127.0.0.2" if head_ip == "127.0.0.1" else "127.0.0.1"
    cluster.add_node(
        num_cpus=1,
        num_gpus=1,
        node_ip_address=other_ip,
        env_vars={**env, "VLLM_HOST_IP": other_ip},
    )
    cluster.wait_for_nodes()
    cluster.ips = (head_ip, other_ip)  # type: ignore[attr-defined]
    try:
        yield cluster
    finally:
        cluster.shutdown()


def test_two_nodes_pp2_generates_what_transformers_does(
    work: Path, model_dir: str, cluster: Any
) -> None:
    head_ip, other_ip = cluster.ips
    result, log = run_engine(
        work,
        "two_nodes",
        model_dir,
        {**LLM_ARGS, "pipeline_parallel_size": 2},
        {"RAY_ADDRESS": cluster.address, "VLLM_HOST_IP": head_ip},
    )
    assert_greedy_is_transformers(result)
    workers = next(line for line in log.splitlines() if "workers: [" in line)
    assert f"ip='{head_ip}'" in workers and f"ip='{other_ip}'" in workers, workers
    assert "RAY_OVERRIDE_RESOURCES" not in log  # a cluster counts its own cards


TOO_SMALL = """
import time
from vllm import LLM
start = time.monotonic()
try:
    LLM(model={model!r}, dtype="float32", max_model_len=128, tensor_parallel_size=4,
        distributed_executor_backend="ray")
except Exception as exc:
    print("ERROR", type(exc).__name__, exc)
print("SECONDS", time.monotonic() - start)
"""


def test_too_small_cluster_fails_in_time_naming_ask_cluster_and_fix(
    model_dir: str, cluster: Any
) -> None:
    head_ip, other_ip = cluster.ips
    start = time.monotonic()
    proc = run_python(
        TOO_SMALL.format(model=model_dir),
        env={
            **EMULATION,
            "RAY_ADDRESS": cluster.address,
            "VLLM_HOST_IP": head_ip,
            "VLLM_KUNLUN_RAY_PG_TIMEOUT": "5",
        },
        timeout=ENGINE_TIMEOUT,
    )
    elapsed = time.monotonic() - start
    out = proc.stdout + proc.stderr
    assert "within 5 s (VLLM_KUNLUN_RAY_PG_TIMEOUT)" in out, out[-4000:]
    assert "asked 4 bundles (4 GPU" in out  # the ask
    assert f"{head_ip}: 1 GPU" in out and f"{other_ip}: 1 GPU" in out  # the cluster
    assert "ray start --head --num-gpus 8" in out  # the fix
    assert elapsed < 120, elapsed
