"""What every node of a Ray cluster has: run as ``python -m vllm_kunlun.doctor.ray_probe
ADDRESS`` by the doctor's ``ray`` check (doctor/ray_cluster.py), in a child process so
that a cluster that does not answer costs a bounded wait and leaves the doctor's own
process without a Ray driver.

It connects as a driver, lists the nodes Ray knows, and runs ``node_report`` once on
each live node (pinned by node id, zero CPUs, so a busy cluster still answers). The
report is built on the node, by the node's Python: its installed versions, its device
nodes and its network variables are what vLLM's workers there will see. Run as
``__main__``, ``node_report`` travels by value (Ray's cloudpickle pickles ``__main__``
functions whole), so a node without vllm-kunlun still reports.

Prints one JSON object on the last line of stdout.
"""

from __future__ import annotations

import json
import sys
from typing import Any

DISTRIBUTIONS = ("vllm", "torch", "transformers", "kunlun_ops", "vllm-kunlun", "ray")
"""Compared across nodes: a stage built by another vLLM or plugin loads other layers."""
NETWORK_VARIABLES = ("VLLM_HOST_IP", "GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME")
"""vLLM's address for this node's workers, and the interfaces torch's gloo and the
NCCL-compatible collectives bind to."""
EMULATION_VARIABLE = "VLLM_KUNLUN_HOST_EMULATION"
REPORTED_VARIABLES = (*NETWORK_VARIABLES, EMULATION_VARIABLE)
"""Reported raw; the doctor parses the emulation switch as envs.py does (a node has no
card nodes to count in host emulation)."""
NODE_TIMEOUT_S = 20.0


def node_report() -> dict[str, Any]:
    """Runs on one node. Self-contained (stdlib only): it must work on a node whose
    stack is the broken one."""
    import glob
    import importlib.metadata
    import os
    import re
    import socket

    versions: dict[str, str | None] = {}
    for name in DISTRIBUTIONS:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = None
    cards = [
        p
        for p in glob.glob("/dev/xpu*")
        if re.fullmatch(r"xpu\d+", os.path.basename(p))
    ]
    return {
        "hostname": socket.gethostname(),
        "versions": versions,
        "device_nodes": len(cards),
        "env": {name: os.environ.get(name) for name in REPORTED_VARIABLES},
    }


def probe(address: str) -> dict[str, Any]:
    """The cluster at ``address`` ("auto": the one running on this host) and each live
    node's report; ``{"connected": False, "error": ...}`` when there is none."""
    import logging

    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    try:
        ray.init(address=address, log_to_driver=False, logging_level=logging.ERROR)
    except Exception as exc:
        return {"connected": False, "error": f"{type(exc).__name__}: {exc}"}
    try:
        report = ray.remote(num_cpus=0)(node_report)
        nodes = []
        pending = {}
        for node in ray.nodes():
            entry = {
                "node_id": node["NodeID"],
                "ip": node.get("NodeManagerAddress"),
                "alive": bool(node.get("Alive")),
                "resources": {
                    k: v
                    for k, v in node.get("Resources", {}).items()
                    if not k.startswith("node:") and "_group_" not in k
                },
            }
            nodes.append(entry)
            if entry["alive"]:
                strategy = NodeAffinitySchedulingStrategy(node["NodeID"], soft=False)
                ref = report.options(scheduling_strategy=strategy).remote()
                pending[ref] = entry
        ready, late = ray.wait(
            list(pending), num_returns=len(pending), timeout=NODE_TIMEOUT_S
        )
        for ref in ready:
            try:
                pending[ref]["report"] = ray.get(ref)
            except Exception as exc:
                pending[ref]["error"] = f"{type(exc).__name__}: {exc}"
        for ref in late:
            pending[ref]["error"] = f"no answer within {NODE_TIMEOUT_S:g} s"
        return {"connected": True, "address": address, "nodes": nodes}
    finally:
        ray.shutdown()


def main(argv: list[str]) -> int:
    address = argv[1] if len(argv) > 1 else "auto"
    print(json.dumps(probe(address)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
