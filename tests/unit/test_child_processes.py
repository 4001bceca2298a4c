"""tests/conftest.py's way of starting children: a timeout ends all they started."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from tests.conftest import child_env, run_bounded

# A child that starts a grandchild (as a runner starts an engine core), says its pid,
# and waits forever.
_PARENT = """
import subprocess, sys, time
grandchild = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
print(grandchild.pid, flush=True)
time.sleep(600)
"""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A killed child of an exited parent may linger as a zombie until init reaps it.
    with open(f"/proc/{pid}/stat") as f:
        return f.read().split(")")[-1].split()[0] != "Z"


def test_timeout_kills_the_childs_own_children_and_keeps_its_output() -> None:
    with pytest.raises(subprocess.TimeoutExpired) as caught:
        run_bounded([sys.executable, "-c", _PARENT], env=child_env(), timeout=5)
    grandchild = int(caught.value.stdout.split()[0])  # what the child printed survives
    deadline = time.monotonic() + 10
    while _alive(grandchild) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _alive(grandchild), "the grandchild outlived its killed parent"


def test_child_env_puts_the_quick_exit_first() -> None:
    proc = run_bounded(
        [sys.executable, "-c", "import sitecustomize; print(sitecustomize.__file__)"],
        env=child_env(fakes=False),
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().endswith("tests/childsite/sitecustomize.py")


@pytest.mark.parametrize(
    ("output", "port"),
    [
        (
            "torch.distributed.DistNetworkError: The server socket has failed to "
            "listen on any local network address. port: 41237, useIpv6: 0, code: -98, "
            "name: EADDRINUSE, message: address already in use",
            "41237",
        ),
        (
            "zmq.error.ZMQError: Address already in use (addr='tcp://127.0.0.1:5555')",
            "?",
        ),
        ("OSError: [Errno 98] Address already in use", "?"),
        ("RuntimeError: CUDA out of memory", None),
    ],
)
def test_an_engine_whose_port_was_taken_is_recognised(
    output: str, port: str | None
) -> None:
    """run_spec starts such an engine once more (the other xdist worker took the port
    between vLLM's choice and its bind); any other failure fails the test at once."""
    from tests.integration.engine_specs import port_taken

    assert port_taken(output) == port
