"""The platforms under vLLM's Ray executor: resource name, card count, device
visibility, and the bounded placement-group wait (no cluster: Ray's calls faked)."""

from __future__ import annotations

import json
import time
from types import SimpleNamespace
from typing import Any

import pytest
import ray

from vllm_kunlun.platforms import kunlun_defaults, ray_patches
from vllm_kunlun.platforms.emulation import KunlunHostEmulationPlatform
from vllm_kunlun.platforms.kunlun import KunlunPlatform
from vllm_kunlun.platforms.worker import align_ray_visible_devices


def config(backend: str, world_size: int = 2) -> Any:
    """What the defaults read: vLLM's own ParallelConfig (its ``use_ray``)."""
    from vllm.config import ParallelConfig

    parallel = ParallelConfig(
        distributed_executor_backend=backend,  # type: ignore[arg-type]
        tensor_parallel_size=world_size,
    )
    return SimpleNamespace(parallel_config=parallel)


@pytest.fixture(autouse=True)
def _no_ray_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("RAY_ADDRESS", "RAY_OVERRIDE_RESOURCES"):
        monkeypatch.setenv(name, "")  # recorded: what the code sets is undone after
        monkeypatch.delenv(name)


def test_both_platforms_ask_ray_for_gpus() -> None:
    # vLLM's Ray worker reads its ids from Ray's accelerator table: "GPU" is in it,
    # "CPU" and custom resource names are not.
    assert KunlunPlatform.ray_device_key == "GPU"
    assert KunlunHostEmulationPlatform.ray_device_key == "GPU"
    assert KunlunPlatform.device_control_env_var == "XPU_VISIBLE_DEVICES"
    assert KunlunHostEmulationPlatform.ray_host_cards(config("ray", 4)) == 4


def test_a_ray_vllm_starts_counts_the_hosts_cards() -> None:
    import os

    kunlun_defaults.apply_ray_defaults(config("ray"), 8)  # type: ignore[arg-type]
    assert json.loads(os.environ["RAY_OVERRIDE_RESOURCES"]) == {"GPU": 8}


@pytest.mark.parametrize(
    ("backend", "env"),
    [
        ("mp", {}),
        ("ray", {"RAY_ADDRESS": "10.0.0.1:6379"}),  # a cluster counts its own cards
        ("ray", {"RAY_OVERRIDE_RESOURCES": '{"GPU": 2}'}),  # the user's
    ],
)
def test_the_card_count_is_left_alone(
    monkeypatch: pytest.MonkeyPatch, backend: str, env: dict[str, str]
) -> None:
    import os

    for name, value in env.items():
        monkeypatch.setenv(name, value)
    kunlun_defaults.apply_ray_defaults(config(backend), 8)  # type: ignore[arg-type]
    assert os.environ.get("RAY_OVERRIDE_RESOURCES") == env.get("RAY_OVERRIDE_RESOURCES")


def test_a_ray_worker_sees_the_hosts_cards_through_cuda_visible_devices() -> None:
    # Ray gave this worker card 2; vLLM set XPU_VISIBLE_DEVICES to the host's cards
    # and will open cuda:<local rank>.
    environ = {"CUDA_VISIBLE_DEVICES": "2", "XPU_VISIBLE_DEVICES": "0,1,2,3"}
    assert align_ray_visible_devices(config("ray").parallel_config.use_ray, environ)
    assert environ["CUDA_VISIBLE_DEVICES"] == "0,1,2,3"
    assert align_ray_visible_devices(True, environ) is False  # already aligned


def test_outside_ray_visibility_is_the_users() -> None:
    environ = {"CUDA_VISIBLE_DEVICES": "2", "XPU_VISIBLE_DEVICES": "0,1,2,3"}
    assert not align_ray_visible_devices(config("mp").parallel_config.use_ray, environ)
    assert environ["CUDA_VISIBLE_DEVICES"] == "2"


def test_the_wait_patch_fits_the_installed_vllm() -> None:
    assert ray_patches.PATCH.mismatch() is None


NODES = [
    {"Alive": True, "NodeManagerAddress": "10.0.0.1", "Resources": {"CPU": 64.0}},
    {"Alive": False, "NodeManagerAddress": "10.0.0.9", "Resources": {"GPU": 8.0}},
    {
        "Alive": True,
        "NodeManagerAddress": "10.0.0.2",
        "Resources": {"CPU": 64.0, "GPU": 8.0},
    },
]
BUNDLES = [{"GPU": 1.0, "node:10.0.0.1": 0.001}] + [{"GPU": 1.0}] * 15


def test_the_message_names_ask_cluster_and_fix() -> None:
    message = ray_patches.unmet_message(BUNDLES, NODES, 60, "GPU")
    assert "within 60 s (VLLM_KUNLUN_RAY_PG_TIMEOUT)" in message
    assert "asked 16 bundles (16 GPU, the first on node:10.0.0.1)" in message
    assert "10.0.0.1: 0 GPU, 64 CPU; 10.0.0.2: 8 GPU, 64 CPU" in message
    assert "10.0.0.9" not in message  # a dead node offers nothing
    assert "ray start --head --num-gpus 8" in message
    assert "VLLM_HOST_IP" in message
    assert "vllm-kunlun doctor --distributed-executor-backend ray" in message


class FakePG:
    bundle_specs = BUNDLES

    def ready(self) -> str:
        return "ref"


def test_the_wait_ends_with_the_error_and_frees_the_request(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    waited: list[float] = []
    removed: list[Any] = []
    monkeypatch.setenv("VLLM_KUNLUN_RAY_PG_TIMEOUT", "2")
    monkeypatch.setattr(
        ray, "wait", lambda refs, timeout: (waited.append(timeout), ([], refs))[1]
    )
    monkeypatch.setattr(ray, "nodes", lambda: NODES)
    monkeypatch.setattr(ray.util, "remove_placement_group", removed.append)
    import vllm.platforms

    # the message counts the resource the active platform asks Ray for
    monkeypatch.setattr(
        vllm.platforms, "_current_platform", KunlunHostEmulationPlatform()
    )
    wait = ray_patches._make(None)
    pg = FakePG()
    start = time.monotonic()
    with pytest.raises(ValueError, match="asked 16 bundles") as err:
        wait(pg)
    assert time.monotonic() - start < 1  # bounded by ray.wait's timeout alone
    assert waited == [2.0]
    assert removed == [pg]
    assert "10.0.0.2: 8 GPU" in str(err.value)


def test_a_placed_group_returns(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ray, "wait", lambda refs, timeout: (refs, []))
    monkeypatch.setattr(
        ray, "nodes", lambda: pytest.fail("no cluster lookup when placed")
    )
    ray_patches._make(None)(FakePG())
