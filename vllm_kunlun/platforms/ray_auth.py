"""Ray's token authentication, named when it is why the engine cannot reach a cluster.

* ``kunlun_ray_auth_hint``: ``vllm.v1.executor.ray_executor.initialize_ray_cluster``
  keeps vLLM's behaviour, and a ``ConnectionError`` it raises while this host has a Ray
  token but ``RAY_AUTH_MODE`` is not ``token`` is raised again with the cause and fix.

Why, measured with the locked Ray 2.60: ``ray start --head`` turns token
authentication on whenever a token already exists on the host (``~/.ray/auth_token``,
which any earlier local ``ray.init()`` writes, e.g. a ``vllm serve`` that started its
own Ray). A client that connects to an explicit address (``RAY_ADDRESS``, or
``ray start --address`` on another host) does not follow: without
``RAY_AUTH_MODE=token`` it is refused, and vLLM's engine fails after about 20 s with
"Failed to connect to Ray cluster at ...", Ray's hint being that an earlier Ray
crashed. The doctor's ``ray`` check finds the same before the engine starts
(doctor/ray_cluster.py); docs/distributed.md has the setup.

Ray's own variables (``RAY_*``) are read from the environment as Ray reads them; the
plugin's settings stay in envs.py. Applied with the placement wait, in an engine core
running the Ray executor (``platforms/ray_patches.py``). Removal: when Ray's error
names the authentication mode.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from pathlib import Path
from types import ModuleType
from typing import Any

from vllm_kunlun.patching.attribute import (
    AttributePatch,
    expect_params,
    platform_resolved,
)

AUTH_MODE = "RAY_AUTH_MODE"
RAY_EXECUTOR = "vllm.v1.executor.ray_executor"
AUTH_FIX = (
    f"export {AUTH_MODE}=token wherever `ray start`, `vllm serve` and the doctor run, "
    "with the head's ~/.ray/auth_token copied to every host (or start every node with "
    f"{AUTH_MODE}=disabled); see docs/distributed.md"
)


def token_source(
    environ: Mapping[str, str] | None = None, home: Path | None = None
) -> str | None:
    """Where Ray would find a token on this host (its documented places, in its
    order), or None."""
    env = os.environ if environ is None else environ
    if env.get("RAY_AUTH_TOKEN"):
        return "RAY_AUTH_TOKEN"
    path = env.get("RAY_AUTH_TOKEN_PATH")
    if path and Path(path).is_file():
        return f"RAY_AUTH_TOKEN_PATH={path}"
    default = (Path.home() if home is None else home) / ".ray" / "auth_token"
    return str(default) if default.is_file() else None


def auth_mode_mismatch(
    environ: Mapping[str, str] | None = None, home: Path | None = None
) -> str | None:
    """The token this host has while ``RAY_AUTH_MODE`` is not ``token``: the case in
    which a token-authenticated cluster refuses this process. None otherwise."""
    env = os.environ if environ is None else environ
    if env.get(AUTH_MODE, "").lower() == "token":
        return None
    return token_source(env, home)


def auth_cause(address: str, source: str, mode: str | None, seen: bool) -> str:
    """``seen``: the cluster was seen to answer with the token (the doctor's retry);
    else it is the likely cause of a refused connection."""
    return (
        f"the Ray cluster at {address} {'requires' if seen else 'may require'} token "
        "authentication (`ray start --head` turns it on when the host has a token; "
        f"this host has one: {source}), but {AUTH_MODE} is {mode or 'unset'} here, so "
        "Ray connects without the token and is refused"
    )


def _check(module: ModuleType, original: Any) -> str | None:
    return expect_params(
        original, "initialize_ray_cluster", ("parallel_config", "ray_address")
    )


def _make(original: Any) -> Any:
    def initialize_ray_cluster(parallel_config: Any, ray_address: Any = None) -> Any:
        try:
            return original(parallel_config, ray_address)
        except ConnectionError as exc:
            source = auth_mode_mismatch()
            address = ray_address or os.environ.get("RAY_ADDRESS")
            if source is None or not address:
                raise
            mode = os.environ.get(AUTH_MODE)
            raise ConnectionError(
                f"{exc}. vllm-kunlun: {auth_cause(address, source, mode, seen=False)}. Fix: "
                f"{AUTH_FIX}. `vllm-kunlun doctor --distributed-executor-backend ray` "
                "checks the cluster."
            ) from exc

    initialize_ray_cluster.__wrapped__ = original  # type: ignore[attr-defined]
    return initialize_ray_cluster


PATCH = AttributePatch(
    "kunlun_ray_auth_hint", RAY_EXECUTOR, "initialize_ray_cluster", _make, _check
)


def apply_auth_hint(phase: object = None) -> bool:
    """Where an engine core runs vLLM's Ray executor (its module already imported),
    as the placement wait."""
    if PATCH.applied() or not platform_resolved() or RAY_EXECUTOR not in sys.modules:
        return False
    return PATCH.apply_or_warn(
        "a refused token shows as Ray's 'Failed to connect to Ray cluster'"
    )


RUNTIME_PATCHES = {PATCH.name: apply_auth_hint}
