"""Check ``ray``: the Ray cluster the engine will run on can hold it.

Runs when Ray is in play (``--distributed-executor-backend ray`` or ``RAY_ADDRESS``).
What it asks every node (doctor/ray_probe.py, in a child process, bounded) and what
it fails on, each a failure seen across hosts (docs/distributed.md):

- the cluster does not answer;
- fewer GPU resources than tensor x pipeline parallel (Ray detects no Kunlun card:
  a host started without ``--num-gpus`` counts 0, and the engine would wait);
- a node whose GPU count is not its ``/dev/xpuN`` count;
- a node with other vllm / torch / transformers / kunlun_ops / vllm-kunlun / ray
  versions than this host (its stage would be another model);
- two nodes on one address (vLLM refuses them), a ``VLLM_HOST_IP`` that is not its
  node's Ray address (the engine's first worker is pinned to ``node:<VLLM_HOST_IP>``);
- and warns on interface variables (``GLOO_SOCKET_IFNAME``, ``NCCL_SOCKET_IFNAME``) set
  on some nodes only.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable, Mapping
from typing import Any

from vllm_kunlun import envs
from vllm_kunlun.checks.finding import Context, Finding, Status
from vllm_kunlun.doctor.ray_probe import (
    DISTRIBUTIONS,
    EMULATION_VARIABLE,
    NETWORK_VARIABLES,
)
from vllm_kunlun.hardware.device import probe_devices
from vllm_kunlun.platforms.ray_auth import (
    AUTH_FIX,
    AUTH_MODE,
    auth_cause,
    auth_mode_mismatch,
)
from vllm_kunlun.platforms.ray_patches import cluster_summary
from vllm_kunlun.versions import RAY_INSTALL, installed_version

PROBE_TIMEOUT_S = 60
DEVICE_KEY = "GPU"
"""The resource each worker asks for on both platforms (docs/distributed.md)."""
START_FIX = (
    "start every host with its cards as GPUs: `ray start --head --port 6379 "
    "--num-gpus 8` on the head, `ray start --address HEAD_IP:6379 --num-gpus 8` on "
    "the others (docs/distributed.md)"
)
Probe = Callable[[str, bool], dict[str, Any]]
"""(address, token_auth) -> the probe's result."""
_ORDER: dict[Status, int] = {"ok": 0, "skip": 0, "warn": 1, "fail": 2}


def run_probe(
    address: str, token_auth: bool = False, timeout: float = PROBE_TIMEOUT_S
) -> dict[str, Any]:
    """doctor/ray_probe.py in a child process: at most ``timeout`` seconds.
    ``token_auth``: connect with Ray's token authentication (RAY_AUTH_MODE=token)."""
    env = {**os.environ, AUTH_MODE: "token"} if token_auth else None
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "vllm_kunlun.doctor.ray_probe", address],
            capture_output=True,
            text=True,
            timeout=timeout,
            env=env,
        )
    except subprocess.TimeoutExpired:
        return {"connected": False, "error": f"no answer within {timeout:g} s"}
    lines = proc.stdout.strip().splitlines()
    try:
        return dict(json.loads(lines[-1]))
    except (IndexError, ValueError):
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        return {"connected": False, "error": f"the probe failed: {tail}"}


def _ray_reason(ctx: Context, environ: Mapping[str, str]) -> str | None:
    if ctx.distributed_executor_backend == "ray":
        return "--distributed-executor-backend ray"
    if environ.get("RAY_ADDRESS"):
        return f"RAY_ADDRESS={environ['RAY_ADDRESS']}"
    return None


def _local_cards() -> int | None:
    """Cards a Ray that vLLM starts on this host counts; None: any (host emulation
    gives every worker its own emulated card)."""
    if envs.VLLM_KUNLUN_HOST_EMULATION:
        return None
    return probe_devices().count


class _Problems:
    def __init__(self) -> None:
        self.items: list[tuple[Status, str, str]] = []

    def add(self, status: Status, cause: str, fix: str) -> None:
        self.items.append((status, cause, fix))

    def finding(self, ok_cause: str, details: dict[str, Any]) -> Finding:
        if not self.items:
            return Finding("ray", "ok", ok_cause, details=details)
        worst = max((s for s, _, _ in self.items), key=_ORDER.__getitem__)
        fixes = list(dict.fromkeys(f for _, _, f in self.items if f))
        return Finding(
            "ray",
            worst,
            "; ".join(c for _, c, _ in self.items),
            "; ".join(fixes),
            details,
        )


def _versions_line(versions: Mapping[str, str | None]) -> str:
    return ", ".join(f"{n} {v}" for n, v in versions.items() if v)


def assess(
    probe: Mapping[str, Any],
    ask: int,
    local_versions: Mapping[str, str | None],
    host_ip: str | None,
    auth_refused: str | None = None,
) -> Finding:
    """The finding for a connected probe (doctor/ray_probe.py's result).
    ``auth_refused``: why the cluster answered only with token authentication."""
    nodes = [n for n in probe["nodes"] if n.get("alive")]
    details = {"address": probe.get("address"), "asked": ask, "nodes": probe["nodes"]}
    problems = _Problems()
    if auth_refused:
        problems.add("fail", auth_refused, AUTH_FIX)
    if not nodes:
        problems.add("fail", "the Ray cluster has no live node", START_FIX)
        return problems.finding("", details)
    ray_nodes = [
        {"NodeManagerAddress": n["ip"], "Resources": n["resources"], "Alive": True}
        for n in nodes
    ]
    summary = cluster_summary(ray_nodes, DEVICE_KEY)
    ips = [n["ip"] for n in nodes]
    for ip in sorted({ip for ip in ips if ips.count(ip) > 1}):
        problems.add(
            "fail",
            f"{ips.count(ip)} nodes have the address {ip} (vLLM refuses two nodes on "
            "one IP)",
            "give every node its own address (`ray start --node-ip-address`)",
        )
    total = sum(n["resources"].get(DEVICE_KEY, 0) for n in nodes)
    if total < ask:
        problems.add(
            "fail",
            f"tensor x pipeline parallel = {ask} cards asked; the cluster has "
            f"{summary} (the engine would wait for {ask} {DEVICE_KEY})",
            START_FIX + f", or ask for at most {total:g}",
        )
    for node in nodes:
        ip, gpus = node["ip"], node["resources"].get(DEVICE_KEY, 0)
        report = node.get("report")
        if report is None:
            problems.add(
                "fail",
                f"node {ip} did not report ({node.get('error', 'no answer')})",
                f"check node {ip}'s Python and raylet (`ray status`, its "
                "/tmp/ray/session_latest/logs)",
            )
            continue
        _node_devices(problems, ip, gpus, report)
        differ = [
            f"{name} {report['versions'].get(name) or 'missing'} (this host "
            f"{local_versions.get(name) or 'missing'})"
            for name in DISTRIBUTIONS
            if report["versions"].get(name) != local_versions.get(name)
        ]
        if differ:
            problems.add(
                "fail",
                f"node {ip} has {', '.join(differ)}",
                "install the same versions on every node ("
                + _versions_line(local_versions)
                + " here)",
            )
        node_host_ip = report["env"].get("VLLM_HOST_IP")
        if node_host_ip and node_host_ip != ip:
            problems.add(
                "fail",
                f"node {ip} has VLLM_HOST_IP={node_host_ip}, not its Ray address",
                f"set VLLM_HOST_IP={ip} on that host before `ray start` (or unset it)",
            )
    if host_ip and host_ip not in ips:
        problems.add(
            "fail",
            f"VLLM_HOST_IP={host_ip} here is no node's address (the engine's first "
            f"worker asks for node:{host_ip}; nodes: {', '.join(ips)})",
            "set VLLM_HOST_IP to this host's Ray node address, or run the engine on a "
            "node of the cluster",
        )
    _network_consistency(problems, nodes)
    shown = _versions_line(local_versions)
    return problems.finding(
        f"{len(nodes)} node(s) ({summary}) for tensor x pipeline parallel = {ask}; "
        f"the same {shown} on every node",
        details,
    )


def _node_devices(
    problems: _Problems, ip: str, gpus: float, report: Mapping[str, Any]
) -> None:
    if _emulated(report):
        return  # emulated cards have no device node
    cards = int(report.get("device_nodes", 0))
    if gpus and gpus > cards:
        problems.add(
            "fail",
            f"node {ip} declares {gpus:g} {DEVICE_KEY} but has {cards} /dev/xpuN "
            "device node(s)",
            f"restart its Ray with `ray start --num-gpus {cards}` (and map every "
            "/dev/xpuN into the container)",
        )
    elif cards and gpus < cards:
        problems.add(
            "warn" if gpus else "fail",
            f"node {ip} has {cards} Kunlun card(s) but Ray counts {gpus:g} "
            f"{DEVICE_KEY}",
            f"restart its Ray with `ray start --num-gpus {cards}` (Ray detects no "
            "Kunlun card)",
        )


def _emulated(report: Mapping[str, Any]) -> bool:
    raw = report["env"].get(EMULATION_VARIABLE)
    if raw is None:
        return False
    try:
        return bool(envs.registry()[EMULATION_VARIABLE].parse(EMULATION_VARIABLE, raw))
    except ValueError:  # a node that refuses to start says so itself
        return False


def _network_consistency(problems: _Problems, nodes: list[dict[str, Any]]) -> None:
    """The interface variables: on every node or on none. (An unset VLLM_HOST_IP is
    fine: vLLM then takes the node's own address; a set one is checked above.)"""
    reports = [(n["ip"], n["report"]) for n in nodes if n.get("report")]
    for name in NETWORK_VARIABLES:
        if name == "VLLM_HOST_IP":
            continue
        set_on = [ip for ip, r in reports if r["env"].get(name)]
        unset_on = [ip for ip, r in reports if not r["env"].get(name)]
        if set_on and unset_on:
            problems.add(
                "warn",
                f"{name} is set on {', '.join(set_on)} and not on "
                f"{', '.join(unset_on)}",
                f"set {name} on every host before `ray start` (or on none)",
            )


def check_ray(
    ctx: Context,
    environ: Mapping[str, str] | None = None,
    probe: Probe = run_probe,
    installed: Callable[[str], str | None] = installed_version,
    local_cards: Callable[[], int | None] = _local_cards,
    ray_token: Callable[[Mapping[str, str]], str | None] = auth_mode_mismatch,
) -> Finding:
    env = os.environ if environ is None else environ
    reason = _ray_reason(ctx, env)
    if reason is None:
        return Finding(
            "ray",
            "skip",
            "Ray is not the executor (no --distributed-executor-backend ray, "
            "RAY_ADDRESS unset)",
        )
    try:
        import ray  # noqa: F401
    except ImportError:
        return Finding(
            "ray",
            "fail",
            f"{reason}, but Ray is not installed",
            f"{RAY_INSTALL} (on every host)",
        )
    ask = ctx.tensor_parallel_size * ctx.pipeline_parallel_size
    address = env.get("RAY_ADDRESS") or "auto"
    result = probe(address, False)
    auth_refused = None
    token = ray_token(env)
    if not result.get("connected") and address != "auto" and token is not None:
        # Ray 2.60 never turns token authentication on for an explicit address: try
        # again as `RAY_AUTH_MODE=token` would, to tell a refused token from no cluster.
        retry = probe(address, True)
        if retry.get("connected"):
            result = retry
            auth_refused = (
                auth_cause(address, token, env.get(AUTH_MODE), seen=True)
                + " (it answered the doctor once it used the token; vLLM's engine "
                "fails with 'Failed to connect to Ray cluster')"
            )
    if result.get("connected"):
        local = {name: installed(name) for name in DISTRIBUTIONS}
        return assess(result, ask, local, env.get("VLLM_HOST_IP"), auth_refused)
    error = result.get("error", "no answer")
    if address != "auto":
        return Finding(
            "ray",
            "fail",
            f"cannot reach the Ray cluster at RAY_ADDRESS={address}: {error}",
            "start it (" + START_FIX + ") or set RAY_ADDRESS to HEAD_IP:6379",
            {"address": address, "asked": ask},
        )
    cards = local_cards()
    if cards is not None and cards < ask:
        return Finding(
            "ray",
            "fail",
            f"no Ray cluster is running and this host has {cards} card(s) for "
            f"tensor x pipeline parallel = {ask}",
            START_FIX + ", then run the engine on the head host",
            {"address": None, "asked": ask, "local_cards": cards},
        )
    return Finding(
        "ray",
        "ok",
        "no Ray cluster is running: vLLM starts one on this host for "
        f"tensor x pipeline parallel = {ask} "
        + ("(emulated cards)" if cards is None else f"({cards} card(s) here)"),
        details={"address": None, "asked": ask, "local_cards": cards},
    )
