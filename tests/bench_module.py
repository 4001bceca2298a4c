"""Load a script of benchmarks/ as a module (they are scripts, not a package)."""

from __future__ import annotations

import importlib.util
import sys
from types import ModuleType

from tests.conftest import REPO


def load_benchmark(name: str) -> ModuleType:
    """``benchmarks/<name>.py`` as module ``bench_<name>`` (registered in sys.modules,
    where dataclasses look their module up)."""
    spec = importlib.util.spec_from_file_location(
        f"bench_{name}", REPO / "benchmarks" / f"{name}.py"
    )
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module
