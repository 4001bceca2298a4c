"""Doctor check ``ray`` on probe results as doctor/ray_probe.py writes them (the probe
against a real two-node Ray cluster runs in tests/integration/test_e2e_ray.py)."""

from __future__ import annotations

import copy
import importlib.metadata
from pathlib import Path
from typing import Any

import pytest

from vllm_kunlun.checks.finding import Context
from vllm_kunlun.doctor import ray_cluster
from vllm_kunlun.doctor.ray_cluster import assess, check_ray, run_probe
from vllm_kunlun.doctor.ray_probe import DISTRIBUTIONS, node_report
from vllm_kunlun.versions import RAY_VERSION

HERE = {
    "vllm": "0.15.1",
    "torch": "2.5.1",
    "transformers": "5.2.0",
    "kunlun_ops": "0.1.58",
    "vllm-kunlun": "0.1.0",
    "ray": "2.60.0",
}
RAY_CTX = Context(
    tensor_parallel_size=8, pipeline_parallel_size=2, distributed_executor_backend="ray"
)


def node(ip: str, gpus: float = 8, cards: int = 8, **env: str) -> dict[str, Any]:
    return {
        "node_id": f"id-{ip}",
        "ip": ip,
        "alive": True,
        "resources": {"GPU": gpus, "CPU": 64.0},
        "report": {
            "hostname": f"host-{ip}",
            "versions": dict(HERE),
            "device_nodes": cards,
            "env": {
                "VLLM_HOST_IP": env.get("VLLM_HOST_IP", ip),
                "GLOO_SOCKET_IFNAME": env.get("GLOO_SOCKET_IFNAME"),
                "NCCL_SOCKET_IFNAME": env.get("NCCL_SOCKET_IFNAME"),
                "VLLM_KUNLUN_HOST_EMULATION": env.get("VLLM_KUNLUN_HOST_EMULATION"),
            },
        },
    }


def cluster(*nodes: dict[str, Any]) -> dict[str, Any]:
    return {"connected": True, "address": "10.0.0.1:6379", "nodes": list(nodes)}


HEALTHY = cluster(node("10.0.0.1"), node("10.0.0.2"))


def test_two_full_hosts_for_tp8_pp2_are_ok() -> None:
    f = assess(HEALTHY, 16, HERE, "10.0.0.1")
    assert f.status == "ok", f.cause
    assert "2 node(s) (10.0.0.1: 8 GPU, 64 CPU; 10.0.0.2: 8 GPU, 64 CPU)" in f.cause
    assert "tensor x pipeline parallel = 16" in f.cause
    assert "vllm 0.15.1" in f.cause and "kunlun_ops 0.1.58" in f.cause


def test_hosts_started_without_num_gpus_fail_naming_ask_cluster_and_fix() -> None:
    probe = cluster(node("10.0.0.1", gpus=0), node("10.0.0.2", gpus=0))
    f = assess(probe, 16, HERE, None)
    assert f.status == "fail"
    assert "16 cards asked; the cluster has 10.0.0.1: 0 GPU, 64 CPU" in f.cause
    assert "node 10.0.0.1 has 8 Kunlun card(s) but Ray counts 0 GPU" in f.cause
    assert "ray start --head --port 6379 --num-gpus 8" in f.fix
    assert "ray start --num-gpus 8" in f.fix


def test_a_dead_node_does_not_count() -> None:
    dead = node("10.0.0.2")
    dead["alive"] = False
    f = assess(cluster(node("10.0.0.1"), dead), 16, HERE, None)
    assert f.status == "fail" and "10.0.0.2" not in f.cause.split(";")[0]
    assert "16 cards asked; the cluster has 10.0.0.1: 8 GPU, 64 CPU (" in f.cause


def test_no_live_node_fails() -> None:
    dead = node("10.0.0.1")
    dead["alive"] = False
    assert assess(cluster(dead), 8, HERE, None).status == "fail"


def test_a_node_with_another_version_fails_naming_node_component_and_both() -> None:
    probe = copy.deepcopy(HEALTHY)
    probe["nodes"][1]["report"]["versions"]["vllm"] = "0.14.0"
    probe["nodes"][1]["report"]["versions"]["kunlun_ops"] = None
    f = assess(probe, 16, HERE, None)
    assert f.status == "fail"
    assert (
        "node 10.0.0.2 has vllm 0.14.0 (this host 0.15.1), kunlun_ops missing "
        "(this host 0.1.58)" in f.cause
    )
    assert "10.0.0.1 has" not in f.cause
    assert f.fix.startswith("install the same versions on every node (vllm 0.15.1")


def test_every_compared_distribution_is_one_the_issue_names() -> None:
    assert set(DISTRIBUTIONS) >= {
        "vllm",
        "torch",
        "transformers",
        "kunlun_ops",
        "vllm-kunlun",
    }


def test_two_nodes_on_one_address_fail() -> None:
    f = assess(cluster(node("10.0.0.1"), node("10.0.0.1")), 16, HERE, None)
    assert f.status == "fail"
    assert "2 nodes have the address 10.0.0.1" in f.cause
    assert "--node-ip-address" in f.fix


def test_vllm_host_ip_that_is_not_the_nodes_address_fails() -> None:
    probe = cluster(node("10.0.0.1"), node("10.0.0.2", VLLM_HOST_IP="127.0.0.1"))
    f = assess(probe, 16, HERE, None)
    assert f.status == "fail"
    assert "node 10.0.0.2 has VLLM_HOST_IP=127.0.0.1, not its Ray address" in f.cause
    assert "VLLM_HOST_IP=10.0.0.2" in f.fix


def test_unset_vllm_host_ip_on_a_node_is_fine() -> None:
    probe = copy.deepcopy(HEALTHY)
    probe["nodes"][1]["report"]["env"]["VLLM_HOST_IP"] = None
    assert assess(probe, 16, HERE, None).status == "ok"


def test_this_hosts_vllm_host_ip_must_be_a_node() -> None:
    f = assess(HEALTHY, 16, HERE, "127.0.0.1")
    assert f.status == "fail"
    assert "VLLM_HOST_IP=127.0.0.1 here is no node's address" in f.cause
    assert "node:127.0.0.1" in f.cause


def test_more_gpus_than_device_nodes_fails() -> None:
    f = assess(cluster(node("10.0.0.1", gpus=8, cards=4)), 8, HERE, None)
    assert f.status == "fail"
    assert "declares 8 GPU but has 4 /dev/xpuN device node(s)" in f.cause


def test_fewer_gpus_than_cards_warns() -> None:
    f = assess(cluster(node("10.0.0.1", gpus=4, cards=8)), 4, HERE, None)
    assert f.status == "warn"
    assert "has 8 Kunlun card(s) but Ray counts 4 GPU" in f.cause


def test_emulated_nodes_have_no_device_nodes_to_compare() -> None:
    probe = cluster(node("10.0.0.1", gpus=2, cards=0))
    probe["nodes"][0]["report"]["env"]["VLLM_KUNLUN_HOST_EMULATION"] = "true"
    assert assess(probe, 2, HERE, None).status == "ok"
    probe["nodes"][0]["report"]["env"]["VLLM_KUNLUN_HOST_EMULATION"] = "0"
    assert assess(probe, 2, HERE, None).status == "fail"


def test_interface_variable_on_some_nodes_only_warns() -> None:
    probe = cluster(node("10.0.0.1", GLOO_SOCKET_IFNAME="eth0"), node("10.0.0.2"))
    f = assess(probe, 16, HERE, None)
    assert f.status == "warn"
    assert "GLOO_SOCKET_IFNAME is set on 10.0.0.1 and not on 10.0.0.2" in f.cause
    both = cluster(
        node("10.0.0.1", GLOO_SOCKET_IFNAME="eth0"),
        node("10.0.0.2", GLOO_SOCKET_IFNAME="eth1"),
    )
    assert assess(both, 16, HERE, None).status == "ok"


def test_a_node_that_does_not_report_fails_naming_it() -> None:
    probe = copy.deepcopy(HEALTHY)
    del probe["nodes"][1]["report"]
    probe["nodes"][1]["error"] = "no answer within 20 s"
    f = assess(probe, 16, HERE, None)
    assert f.status == "fail"
    assert "node 10.0.0.2 did not report (no answer within 20 s)" in f.cause


# ---- check_ray: when it runs, and the cluster it cannot reach --------------------


def never(address: str, token_auth: bool = False) -> dict[str, Any]:
    raise AssertionError("probed without Ray in play")


def test_skipped_without_ray() -> None:
    f = check_ray(Context(tensor_parallel_size=8), environ={}, probe=never)
    assert f.status == "skip" and "Ray is not the executor" in f.cause


def test_ray_address_alone_turns_it_on_and_is_the_probed_address() -> None:
    asked: list[str] = []

    def probe(address: str, token_auth: bool = False) -> dict[str, Any]:
        asked.append(address)
        return HEALTHY

    f = check_ray(
        Context(tensor_parallel_size=8, pipeline_parallel_size=2),
        environ={"RAY_ADDRESS": "10.0.0.1:6379"},
        probe=probe,
        installed=HERE.get,
    )
    assert asked == ["10.0.0.1:6379"] and f.status == "ok", f.cause


def test_unreachable_address_fails_naming_it_and_the_fix() -> None:
    f = check_ray(
        RAY_CTX,
        environ={"RAY_ADDRESS": "10.9.9.9:6379"},
        probe=lambda a, t: {"connected": False, "error": "no answer within 60 s"},
        ray_token=lambda env: None,
    )
    assert f.status == "fail"
    assert "cannot reach the Ray cluster at RAY_ADDRESS=10.9.9.9:6379" in f.cause
    assert "ray start --head" in f.fix


def no_cluster(address: str, token_auth: bool = False) -> dict[str, Any]:
    assert address == "auto"
    return {"connected": False, "error": "ConnectionError: no running Ray"}


def test_no_cluster_and_too_few_local_cards_fails() -> None:
    f = check_ray(RAY_CTX, environ={}, probe=no_cluster, local_cards=lambda: 8)
    assert f.status == "fail"
    assert "this host has 8 card(s) for tensor x pipeline parallel = 16" in f.cause


def test_no_cluster_and_enough_local_cards_is_a_local_ray() -> None:
    ctx = Context(tensor_parallel_size=8, distributed_executor_backend="ray")
    f = check_ray(ctx, environ={}, probe=no_cluster, local_cards=lambda: 8)
    assert f.status == "ok" and "vLLM starts one on this host" in f.cause


def test_ray_not_installed_names_the_install(monkeypatch: pytest.MonkeyPatch) -> None:
    import builtins

    real_import = builtins.__import__

    def no_ray(name: str, *args: Any, **kwargs: Any) -> Any:
        if name == "ray":
            raise ImportError("No module named 'ray'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_ray)
    f = check_ray(RAY_CTX, environ={}, probe=never)
    assert f.status == "fail" and "Ray is not installed" in f.cause
    assert f.fix.startswith(f"pip install ray=={RAY_VERSION}")


def test_ray_pin_is_the_locks() -> None:
    lock = Path(__file__).parents[3] / "requirements" / "stack.lock"
    assert f"ray=={RAY_VERSION}\n" in lock.read_text()
    assert importlib.metadata.version("ray") == RAY_VERSION


def test_a_probe_that_does_not_answer_is_bounded() -> None:
    f = run_probe("10.9.9.9:6379", False, timeout=0.01)
    assert f == {"connected": False, "error": "no answer within 0.01 s"}


def test_the_node_report_reads_this_python() -> None:
    """What a node reports is its own installed stack (here: this process's)."""
    report = node_report()
    assert report["versions"]["vllm"] == importlib.metadata.version("vllm")
    assert report["versions"]["ray"] == RAY_VERSION
    assert set(report["env"]) >= set(ray_cluster.NETWORK_VARIABLES)


def refused_without_token(address: str, token_auth: bool = False) -> dict[str, Any]:
    """A cluster with Ray's token authentication, as a client sees it."""
    if token_auth:
        return HEALTHY
    return {"connected": False, "error": "ConnectionError: Failed to connect"}


def test_a_cluster_that_answers_only_with_the_token_fails_naming_auth_mode() -> None:
    f = check_ray(
        RAY_CTX,
        environ={"RAY_ADDRESS": "10.0.0.1:6379"},
        probe=refused_without_token,
        installed=HERE.get,
        ray_token=lambda env: "/root/.ray/auth_token",
    )
    assert f.status == "fail"
    assert "the Ray cluster at 10.0.0.1:6379 requires token authentication" in (f.cause)
    assert "RAY_AUTH_MODE is unset here" in f.cause
    assert "/root/.ray/auth_token" in f.cause
    assert "export RAY_AUTH_MODE=token" in f.fix and "auth_token copied" in f.fix
    assert "it answered the doctor once it used the token" in f.cause
    assert [n["ip"] for n in f.details["nodes"]] == ["10.0.0.1", "10.0.0.2"]


def test_no_token_here_means_no_second_try() -> None:
    f = check_ray(
        RAY_CTX,
        environ={"RAY_ADDRESS": "10.0.0.1:6379"},
        probe=lambda a, t: never(a) if t else refused_without_token(a),
        ray_token=lambda env: None,
    )
    assert f.status == "fail" and "cannot reach the Ray cluster" in f.cause


def test_token_mode_already_set_means_no_second_try(tmp_path: Path) -> None:
    from vllm_kunlun.platforms.ray_auth import auth_mode_mismatch

    (tmp_path / ".ray").mkdir()
    (tmp_path / ".ray" / "auth_token").write_text("t")
    env = {"RAY_ADDRESS": "10.0.0.1:6379", "RAY_AUTH_MODE": "token"}
    f = check_ray(
        RAY_CTX,
        environ=env,
        probe=lambda a, t: never(a) if t else refused_without_token(a),
        ray_token=lambda e: auth_mode_mismatch(e, home=tmp_path),
    )
    assert f.status == "fail" and "cannot reach the Ray cluster" in f.cause
