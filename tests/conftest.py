"""Shared test helpers.

Vendor fakes live in tests/fakes and are only ever put on the path of a subprocess
(``run_python``) or inserted for one test (``fake_vendor_path``); the package never
imports them.
"""

from __future__ import annotations

import contextlib
import gc
import importlib.util
import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

REPO = Path(__file__).resolve().parent.parent
FAKES = REPO / "tests" / "fakes"
CHILD_SITE = REPO / "tests" / "childsite"  # sitecustomize.py: a quick exit, see there

# Variables that would change plugin or vLLM behaviour in a child process.
_SCRUB = (
    "VLLM_PLUGINS",
    "VLLM_KUNLUN_",
    "FAKE_",
    "XPU_VISIBLE_DEVICES",
    "VLLM_LOGGING_STREAM",  # a --json run in this process sets it for its children
)


def child_env(
    extra: dict[str, str] | None = None, fakes: bool = True
) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(_SCRUB)}
    first = [str(CHILD_SITE), *([str(FAKES)] if fakes else [])]
    env["PYTHONPATH"] = os.pathsep.join(
        [*first, *filter(None, [env.get("PYTHONPATH")])]
    )
    env.setdefault("VLLM_LOGGING_LEVEL", "DEBUG")
    env.update(extra or {})
    return env


def run_bounded(
    args: list[str], env: dict[str, str], timeout: float, cwd: str | Path = REPO
) -> subprocess.CompletedProcess[str]:
    """``subprocess.run(..., capture_output=True, text=True, timeout=...)`` for a child
    that starts processes of its own (an engine core, its workers, a Ray driver).

    Why: on a timeout ``subprocess.run`` kills the child alone. Its engine core lives
    on, holding its Ray placement group (the next engine on the cluster then finds no
    card) and its cores. Here the child leads a new process group and a timeout kills
    the whole group; ``TimeoutExpired`` carries what the child printed."""
    with subprocess.Popen(
        args,
        env=env,
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    ) as proc:
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            try:
                out, err = proc.communicate(timeout=30)
            except subprocess.TimeoutExpired:
                out, err = "", ""  # a process outside the group holds a pipe
            raise subprocess.TimeoutExpired(args, timeout, out, err) from None
    return subprocess.CompletedProcess(args, proc.returncode, out, err)


def run_python(
    code: str,
    env: dict[str, str] | None = None,
    fakes: bool = True,
    timeout: float = 600,
    cwd: str | Path | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run ``code`` in a fresh interpreter of this venv (real vLLM, real plugin)."""
    return run_bounded(
        [sys.executable, "-c", textwrap.dedent(code)],
        env=child_env(env, fakes=fakes),
        timeout=timeout,
        cwd=cwd or REPO,
    )


@contextlib.contextmanager
def patch_state(module: Any, on: bool) -> Iterator[None]:
    """A runtime patch module (its ``install`` / ``installed`` / ``uninstall``) on or
    off for one test, whatever an earlier test in this process left; as it was after."""
    was = module.installed()
    if on:
        module.install()
    else:
        module.uninstall()
    try:
        yield
    finally:
        if was:
            module.install()
        else:
            module.uninstall()


def load_benchmark(name: str) -> ModuleType:
    """``benchmarks/<name>.py`` as a module (benchmarks are scripts, not a package)."""
    spec = importlib.util.spec_from_file_location(
        f"bench_{name}", REPO / "benchmarks" / f"{name}.py"
    )
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def pytest_configure(config: pytest.Config) -> None:
    # Unit tests import vLLM modules (vllm.config, samplers, attention) in this process
    # without activating a platform. On torch 2.5.1 that needs the schema fix the
    # platform applies in production; apply it here the same way.
    from vllm_kunlun.patching import schema

    schema.apply()


def pytest_unconfigure(config: pytest.Config) -> None:
    """This process exits quickly too (tests/childsite/sitecustomize.py says why): an
    xdist worker that ran engines in process holds vLLM's and transformers' heaps."""
    gc.freeze()


# The longest test modules, longest first (seconds of test time each in a fresh-clone
# run of e62835d on the 2-core VM, two xdist workers: w8a8_hybrid 549, ray 490, moe 326,
# emulation 325, geometry 200, geometry_vendor 193, mtp_w8a8 139, mtp 110). Each worker
# takes one file at a time in this order (scripts/test.sh passes
# --no-loadscope-reorder): a long module started last would leave the other worker idle
# at the end.
LONGEST_FIRST = (
    "test_e2e_w8a8_hybrid.py",
    "test_e2e_fused_moe.py",
    "test_e2e_mla.py",
    "test_e2e_family_matrix.py",
    "test_e2e_ray.py",
    "test_e2e_moe.py",
    "test_e2e_emulation.py",
    "test_e2e_qwen3_next.py",
    "test_e2e_hybrid_geometry.py",
    "test_e2e_hybrid_geometry_vendor.py",
    "test_e2e_lora.py",
    "test_e2e_lora_hybrid.py",
    "test_serve_structured.py",
    "test_e2e_mtp_w8a8.py",
    "test_e2e_mtp.py",
    "test_e2e_qwen_vl.py",
    "test_e2e_pooling.py",
    "test_e2e_awq.py",
    "test_e2e_w4a16.py",
    "test_e2e_gptq.py",
    "test_engine_start_death.py",
)


def pytest_collection_modifyitems(config: pytest.Config, items: list) -> None:
    """The modules of LONGEST_FIRST first; otherwise collection order (a stable sort:
    each module keeps its own test order)."""
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))


@pytest.fixture
def fake_vendor_path(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """Put tests/fakes on sys.path for this test and drop cached fake modules after."""
    monkeypatch.syspath_prepend(str(FAKES))
    yield FAKES
    for name in list(sys.modules):
        if name.split(".")[0] in ("torch_xmlir", "kunlun_ops", "xspeedgate_ops"):
            del sys.modules[name]


def serve_platform(monkeypatch: pytest.MonkeyPatch, platform: object) -> object:
    """Make ``platform`` vLLM's current platform for one test: the seams ask vLLM's
    ``current_platform`` for the vendor-kernel policy (vllm_kunlun/ops/chooser.py)."""
    import vllm.platforms

    monkeypatch.setattr(vllm.platforms, "_current_platform", platform)
    return platform


@pytest.fixture
def kunlun_platform(monkeypatch: pytest.MonkeyPatch) -> object:
    """KunlunPlatform is vLLM's current platform (it wants the vendor kernels)."""
    from vllm_kunlun.platforms.kunlun import KunlunPlatform

    return serve_platform(monkeypatch, KunlunPlatform)


@pytest.fixture
def emulation_platform(monkeypatch: pytest.MonkeyPatch) -> object:
    """Host emulation is vLLM's current platform (vendor kernels only with
    VLLM_KUNLUN_EMULATION_VENDOR=1)."""
    from vllm_kunlun.platforms.emulation import KunlunHostEmulationPlatform

    return serve_platform(monkeypatch, KunlunHostEmulationPlatform)
