"""A bounded wait for the Ray placement group of vLLM 0.15.1's Ray executor.

* ``kunlun_ray_placement_wait``: ``vllm.v1.executor.ray_utils._wait_until_pg_ready``
  waits ``VLLM_KUNLUN_RAY_PG_TIMEOUT`` seconds (default 60), then fails naming what the
  engine asked for, what each node of the cluster has and the fix.

Why: vLLM waits 1800 s and meanwhile only logs; Ray's autoscaler repeats "No available
node types can fulfill resource request" until the process is killed. On Kunlun the
usual cause is a cluster started without ``--num-gpus`` (Ray detects no Kunlun card,
see platforms/kunlun_defaults.py), or a VLLM_HOST_IP that is not the address of a Ray
node (vLLM pins the first worker to ``node:<VLLM_HOST_IP>``).

Applied in the engine core (``Phase.FRONT_END``: vLLM loads general plugins at the top
of ``EngineCore.__init__``, before it builds the executor), when it runs the Ray
executor. Removal: when vLLM's wait is bounded and says the fix.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from types import ModuleType
from typing import Any

from vllm_kunlun import envs
from vllm_kunlun.logger import init_logger
from vllm_kunlun.patching.attribute import (
    AttributePatch,
    expect_caller,
    expect_params,
    platform_resolved,
)

logger = init_logger(__name__)

RAY_UTILS = "vllm.v1.executor.ray_utils"


def _check(module: ModuleType, original: Any) -> str | None:
    return expect_params(
        original, "_wait_until_pg_ready", ("current_placement_group",)
    ) or expect_caller(module, "initialize_ray_cluster", "_wait_until_pg_ready")


def ask_summary(bundles: Sequence[Mapping[str, float]]) -> str:
    """What a placement group asks: its bundles and the total of each resource."""
    totals: dict[str, float] = {}
    pinned = []
    for bundle in bundles:
        for name, amount in bundle.items():
            if name.startswith("node:"):
                pinned.append(name)
            else:
                totals[name] = totals.get(name, 0.0) + amount
    what = ", ".join(f"{amount:g} {name}" for name, amount in sorted(totals.items()))
    where = f", the first on {pinned[0]}" if pinned else ""
    return f"{len(bundles)} bundles ({what}{where})"


def cluster_summary(nodes: Sequence[Mapping[str, Any]], device_key: str) -> str:
    """Each live node's address and the resources it declares (what `ray status`
    calls total)."""
    parts = []
    for node in nodes:
        if not node.get("Alive", True):
            continue
        res = node.get("Resources", {})
        parts.append(
            f"{node.get('NodeManagerAddress', '?')}: {res.get(device_key, 0):g} "
            f"{device_key}, {res.get('CPU', 0):g} CPU"
        )
    return "; ".join(parts) if parts else "no live node"


def unmet_message(
    bundles: Sequence[Mapping[str, float]],
    nodes: Sequence[Mapping[str, Any]],
    timeout: float,
    device_key: str,
) -> str:
    """``device_key``: the platform's ``ray_device_key``, the resource each worker
    asks for."""
    devices = sum(b.get(device_key, 0) for b in bundles)
    return (
        f"Ray could not place the engine's workers within {timeout:g} s "
        f"(VLLM_KUNLUN_RAY_PG_TIMEOUT): asked {ask_summary(bundles)}; the cluster has "
        f"{cluster_summary(nodes, device_key)}. Ray detects no Kunlun card: start "
        f"every host with its cards as GPUs (`ray start --head --num-gpus 8`, then "
        f"`ray start --address HEAD_IP:6379 --num-gpus 8` on the others), or ask for "
        f"at most the cluster's {device_key}s (tensor x pipeline parallel = "
        f"{devices:g} now). The first worker goes on the engine's node: VLLM_HOST_IP, "
        "if set, must be that node's Ray address. `ray status` shows what each node "
        "has, `vllm-kunlun doctor --distributed-executor-backend ray` checks each "
        "node; see docs/distributed.md."
    )


def _make(original: Any) -> Any:
    def wait_until_pg_ready(current_placement_group: Any) -> None:
        import ray
        from vllm.platforms import current_platform

        timeout = envs.VLLM_KUNLUN_RAY_PG_TIMEOUT
        bundles = current_placement_group.bundle_specs
        logger.info(
            "vllm-kunlun: waiting at most %g s (VLLM_KUNLUN_RAY_PG_TIMEOUT) for Ray to "
            "place %s",
            timeout,
            ask_summary(bundles),
        )
        ready, _ = ray.wait([current_placement_group.ready()], timeout=timeout)
        if ready:
            return
        message = unmet_message(
            bundles, ray.nodes(), timeout, current_platform.ray_device_key
        )
        try:  # leave no pending request behind on a shared cluster
            ray.util.remove_placement_group(current_placement_group)
        except Exception:  # the error below is what matters
            logger.debug("vllm-kunlun: removing the placement group failed")
        raise ValueError(message)

    wait_until_pg_ready.__wrapped__ = original  # type: ignore[attr-defined]
    return wait_until_pg_ready


PATCH = AttributePatch(
    "kunlun_ray_placement_wait", RAY_UTILS, "_wait_until_pg_ready", _make, _check
)
PATCHES = (PATCH,)


def apply_wait(phase: object = None) -> bool:
    """Install the bounded wait where an engine core runs vLLM's Ray executor: there
    ``ray_utils`` is already imported (the engine core process receives the executor
    class, which imports it; in-process, the front end resolved it before it builds
    the engine core), so other engines neither import Ray nor pay for it."""
    if PATCH.applied() or not platform_resolved() or RAY_UTILS not in sys.modules:
        return False
    return PATCH.apply_or_warn("vLLM waits up to 1800 s for the placement group")


RUNTIME_PATCHES = {PATCH.name: apply_wait}
