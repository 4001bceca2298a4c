"""vLLM's own Ray executor in host emulation (issue 24).

- ``local``: ``tensor_parallel_size=2, distributed_executor_backend="ray"`` with no
  cluster: vLLM starts Ray itself, which counts the two emulated cards as GPUs
  (RAY_OVERRIDE_RESOURCES, platforms/kunlun_defaults.py), and places both workers.
- one Ray cluster of two nodes on this host for the rest of the module
  (``ray.cluster_utils.Cluster``, two emulated cards each, distinct node addresses as
  vLLM requires):
  - the doctor's ``ray`` check finds it fit for TP 2 x PP 2, and its nodes' answers
    unfit for TP 4 x PP 2;
  - TP 2 x PP 2 across it, one stage (two TP workers) per node, for the tiny Qwen3
    and a 6-layer Qwen3.5 hybrid with tied embeddings split 2 / 4 (GDN state per
    stage);
  - asked for eight cards, the engine fails within VLLM_KUNLUN_RAY_PG_TIMEOUT naming
    the ask, the cluster and the fix (platforms/ray_patches.py), where vLLM alone
    waits 1800 s;
  - a third node whose Python has another vLLM: the doctor names it.

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

from tests.conftest import REPO, child_env, run_bounded, run_python
from tests.integration.engine_specs import EMULATION, req
from tests.integration.hybrid_jobs import GREEDY_JOBS as HYBRID_JOBS
from tests.integration.hybrid_jobs import LLM_ARGS as HYBRID_ARGS
from tests.integration.pipeline_runs import SIX, stage_layers, tie_lm_head
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
# Seconds for one engine on vLLM's Ray executor, as the other engine tests allow: here
# 98 to 135 s alone and up to 213 s beside another engine; a CI run once needed over
# 420 s (nine processes on two cores). A hung engine still fails with its log.
ENGINE_TIMEOUT = 900


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("e2e_ray")


@pytest.fixture(scope="module")
def model_dir(work: Path) -> str:
    return str(write_tiny_model(work / "tiny-qwen3"))


def run_engine(
    work: Path,
    name: str,
    model: str,
    llm: dict[str, Any],
    env: dict[str, str],
    jobs: list[dict[str, Any]] = JOBS,
) -> tuple[dict, str]:
    """The runner on greedy jobs with their transformers reference; its result and
    its log (vLLM's, the Ray workers' included)."""
    # The reference decodes with transformers' own cache (for the hybrid: its GDN
    # state), not by recomputing the whole sequence per token.
    spec = {"backend": "vllm", "model": model, "llm": llm, "jobs": jobs}
    spec.update(hf_jobs=jobs, hf_cache=True)
    spec_path, out_path = work / f"{name}.spec.json", work / f"{name}.out.json"
    spec_path.write_text(json.dumps(spec))
    proc = run_bounded(
        [sys.executable, str(RUNNER), str(spec_path), str(out_path)],
        env=child_env({**EMULATION, "VLLM_LOGGING_LEVEL": "DEBUG", **env}),
        timeout=ENGINE_TIMEOUT,
    )
    result = json.loads(out_path.read_text()) if out_path.exists() else {}
    log = proc.stdout + proc.stderr
    (work / f"{name}.log").write_text(log)  # beside the spec, for a slow or odd run
    if proc.returncode != 0 or result.get("error"):
        pytest.fail(
            f"{name}: exit {proc.returncode}\n{result.get('error')}\n{log[-6000:]}"
        )
    return result, log


def assert_greedy_is_transformers(result: dict) -> None:
    assert set(result["hf"]) == set(result["jobs"])
    for name, want_rows in result["hf"].items():
        rows = result["jobs"][name]
        assert len(rows) == len(want_rows) and all(r["token_ids"] for r in rows)
        for got, want in zip(rows, want_rows, strict=True):
            assert got["prompt_token_ids"] == want["prompt_token_ids"]
            assert got["token_ids"] == want["token_ids"], (name, got["text"])


LOCAL_RAY = """
import json, os, ray
from vllm.engine.arg_utils import EngineArgs
from vllm.v1.executor.ray_utils import initialize_ray_cluster

cfg = EngineArgs(model={model!r}, dtype="float32", max_model_len=128,
                 tensor_parallel_size=2, distributed_executor_backend="ray"
                 ).create_engine_config()
initialize_ray_cluster(cfg.parallel_config)  # vLLM starts Ray and places the workers
pg = cfg.parallel_config.placement_group
ray.get(pg.ready(), timeout=60)
print("RESULT " + json.dumps({{
    "override": os.environ.get("RAY_OVERRIDE_RESOURCES"),
    "gpus": ray.cluster_resources().get("GPU"),
    "bundles": pg.bundle_specs,
}}))
ray.shutdown()
"""


def test_local_ray_places_tp2_on_this_hosts_cards(model_dir: str) -> None:
    """The measured hang: with no cluster, vLLM starts Ray itself, and Ray (which knows
    no Kunlun card) counted no GPU, so the placement group for two workers never
    formed. The platform now has Ray count the host's emulated cards, and vLLM's own
    ``initialize_ray_cluster`` places both workers. Engines on Ray run on the
    module's cluster below; one on a self-started Ray adds minutes and nothing more."""
    proc = run_python(LOCAL_RAY.format(model=model_dir), env=EMULATION, timeout=300)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    line = next(x for x in proc.stdout.splitlines() if x.startswith("RESULT "))
    found = json.loads(line[len("RESULT ") :])
    assert found["override"] == '{"GPU": 2}'
    assert found["gpus"] == 2.0
    assert [b.get("GPU") for b in found["bundles"]] == [1.0, 1.0]


@pytest.fixture(scope="module")
def cluster() -> Iterator[Any]:
    """Two Ray nodes on this host, two emulated cards and one CPU each. The second
    node has its own address (vLLM refuses two nodes on one IP) and its workers say
    so through VLLM_HOST_IP."""
    from ray.cluster_utils import Cluster

    cluster = Cluster(
        initialize_head=True,
        # No dashboard (and so no dashboard agent on either node): three fewer
        # processes polling beside the engines on two cores; nothing here reads it.
        head_node_args={
            "num_cpus": 1,
            "num_gpus": 2,
            "env_vars": NODE_ENV,
            "include_dashboard": False,
        },
    )
    head_ip = cluster.head_node.node_ip_address
    other_ip = "127.0.0.2" if head_ip == "127.0.0.1" else "127.0.0.1"
    cluster.add_node(
        num_cpus=1,
        num_gpus=2,
        node_ip_address=other_ip,
        env_vars={**NODE_ENV, "VLLM_HOST_IP": other_ip},
    )
    cluster.wait_for_nodes()
    cluster.ips = (head_ip, other_ip)  # type: ignore[attr-defined]
    try:
        yield cluster
    finally:
        cluster.shutdown()


NODE_ENV = {"VLLM_KUNLUN_HOST_EMULATION": "1"}
TP2_PP2 = {"tensor_parallel_size": 2, "pipeline_parallel_size": 2}


def engine_env(cluster: Any) -> dict[str, str]:
    return {"RAY_ADDRESS": cluster.address, "VLLM_HOST_IP": cluster.ips[0]}


def doctor_ray(cluster: Any, tp: int, pp: int) -> dict[str, Any]:
    """``vllm-kunlun doctor --json`` on this host of the cluster: its ray finding."""
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "vllm_kunlun.cli",
            "doctor",
            "--json",
            "--distributed-executor-backend",
            "ray",
            "--tensor-parallel-size",
            str(tp),
            "--pipeline-parallel-size",
            str(pp),
        ],
        env=child_env({**EMULATION, **engine_env(cluster)}),
        capture_output=True,
        text=True,
        timeout=ENGINE_TIMEOUT,
        cwd=REPO,
    )
    findings = json.loads(proc.stdout)["findings"]
    return next(f for f in findings if f["check"] == "ray")


@pytest.fixture(scope="module")
def fit(cluster: Any) -> dict[str, Any]:
    return doctor_ray(cluster, 2, 2)


def test_doctor_finds_the_cluster_fit_for_tp2_pp2(
    cluster: Any, fit: dict[str, Any]
) -> None:
    head_ip, other_ip = cluster.ips
    assert fit["status"] == "ok", fit
    assert f"{head_ip}: 2 GPU, 1 CPU" in fit["cause"]
    assert f"{other_ip}: 2 GPU, 1 CPU" in fit["cause"]
    assert "tensor x pipeline parallel = 4" in fit["cause"]
    host_ips = {n["ip"]: n["report"]["env"] for n in fit["details"]["nodes"]}
    assert host_ips[head_ip]["VLLM_HOST_IP"] is None  # each node's own environment
    assert host_ips[other_ip]["VLLM_HOST_IP"] == other_ip


def test_doctor_fails_the_same_cluster_for_tp4_pp2(
    cluster: Any, fit: dict[str, Any]
) -> None:
    """What the nodes answered the doctor above, judged for eight cards by the
    doctor's own ``assess`` (a second probe of the same cluster would cost an
    interpreter and a Ray driver, and answer the same)."""
    from vllm_kunlun.doctor.ray_cluster import assess
    from vllm_kunlun.doctor.ray_probe import DISTRIBUTIONS
    from vllm_kunlun.versions import installed_version

    local = {name: installed_version(name) for name in DISTRIBUTIONS}
    ray = assess(fit["details"], 8, local, cluster.ips[0]).to_json()
    assert ray["status"] == "fail"
    assert "tensor x pipeline parallel = 8 cards asked" in ray["cause"]
    assert "ray start --head --port 6379 --num-gpus 8" in ray["fix"]
    assert "or ask for at most 4" in ray["fix"]


def _assert_one_stage_per_node(log: str, cluster: Any) -> None:
    workers = next(line for line in log.splitlines() if "workers: [" in line)
    for ip in cluster.ips:
        assert workers.count(f"ip='{ip}'") == 2, workers
    assert "RAY_OVERRIDE_RESOURCES" not in log  # a cluster counts its own cards


def test_two_nodes_tp2_pp2_qwen3_generates_what_transformers_does(
    work: Path, model_dir: str, cluster: Any
) -> None:
    llm = {**LLM_ARGS, **TP2_PP2}
    result, log = run_engine(work, "qwen3", model_dir, llm, engine_env(cluster))
    assert_greedy_is_transformers(result)
    _assert_one_stage_per_node(log, cluster)
    assert len(result["serving"]) == 4


def test_two_nodes_tp2_pp2_hybrid_generates_what_transformers_does(
    work: Path, cluster: Any
) -> None:
    """A Qwen3.5 hybrid of another shape than the tiny composite (6 layers, attention
    every second, ``lm_head`` tied to the embedding) split unevenly
    (``VLLM_PP_LAYER_PARTITION=2,4``, which vLLM hands its Ray workers): chunked
    prefills beside decodes and a 1-token prompt, each stage's GDN state on its own
    node, and the last stage holding the embedding only for its ``lm_head``. The tiny
    composite runs PP 2 on the mp executor (test_e2e_pp.py)."""
    model = tie_lm_head(write_tiny_model(work / "six", SIX))
    llm = {**HYBRID_ARGS, **TP2_PP2, "distributed_executor_backend": "ray"}
    env = {**engine_env(cluster), "VLLM_PP_LAYER_PARTITION": "2,4"}
    result, log = run_engine(
        work, "hybrid", str(model), llm, env, jobs=HYBRID_JOBS[1:3]
    )
    assert_greedy_is_transformers(result)
    _assert_one_stage_per_node(log, cluster)
    # Ranks 0, 1: the first stage (GDN, attention); ranks 2, 3: the second (GDN,
    # attention, GDN, attention).
    first, second = (
        {"MambaSpec": 1, "FullAttentionSpec": 1},
        {"MambaSpec": 2, "FullAttentionSpec": 2},
    )
    assert stage_layers(result) == [first, first, second, second]


TOO_SMALL = """
import time
from vllm import LLM
start = time.monotonic()
try:
    LLM(model={model!r}, dtype="float32", max_model_len=128, tensor_parallel_size=4,
        pipeline_parallel_size=2, distributed_executor_backend="ray")
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
        env={**EMULATION, **engine_env(cluster), "VLLM_KUNLUN_RAY_PG_TIMEOUT": "5"},
        timeout=ENGINE_TIMEOUT,
    )
    elapsed = time.monotonic() - start
    out = proc.stdout + proc.stderr
    assert "within 5 s (VLLM_KUNLUN_RAY_PG_TIMEOUT)" in out, out[-4000:]
    assert "asked 8 bundles (8 GPU" in out  # the ask
    assert f"{head_ip}: 2 GPU" in out and f"{other_ip}: 2 GPU" in out  # the cluster
    assert "ray start --head --num-gpus 8" in out  # the fix
    assert elapsed < 120, elapsed


def test_doctor_names_a_node_with_another_vllm(cluster: Any, work: Path) -> None:
    """A third node whose Python finds another vLLM's metadata first (as a host with
    another install would): the doctor names the node, the version and this host's.
    Last in the module: the node leaves the cluster afterwards."""
    other = work / "other-site"
    dist = other / "vllm-0.14.0.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: vllm\nVersion: 0.14.0\n"
    )
    third = "127.0.0.3"
    node = cluster.add_node(
        num_cpus=1,
        num_gpus=0,
        node_ip_address=third,
        env_vars={**NODE_ENV, "PYTHONPATH": str(other)},
    )
    cluster.wait_for_nodes()
    try:
        ray = doctor_ray(cluster, 2, 2)
    finally:
        cluster.remove_node(node)
    assert ray["status"] == "fail", ray
    assert f"node {third} has vllm 0.14.0 (this host 0.15.1)" in ray["cause"]
    assert ray["cause"].count(" has vllm ") == 1  # the two others agree
    assert ray["fix"].startswith("install the same versions on every node (vllm 0.15.1")
