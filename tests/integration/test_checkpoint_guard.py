"""A checkpoint loads whole or not at all, through vLLM 0.15.1's real loader.

One fresh interpreter under host emulation (and two, as the ranks of a tensor-parallel
group of 2: the split dimensions) prepares itself as the plugin's workers do
(``prepare_model_process(loads_weights=True)``), then, per case of
``checkpoint_mutations.CASES``, builds vLLM's engine config from the checkpoint
(``EngineArgs.create_engine_config``: the platform's quantization checks) and loads
the model with vLLM's ``DefaultModelLoader.load_model`` (the model's own
``load_weights`` and vLLM's weight loaders), which is what an engine start does
before it profiles memory. The untouched checkpoints must load; every broken one must
be refused naming the tensor, the parameter and the shapes (or what is missing).
``test_checkpoint_guard_engine.py`` starts real engines on a few of them.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import REPO, child_env
from tests.integration.checkpoint_mutations import CASES, FLOAT16_WRITERS, write_case

pytestmark = pytest.mark.slow

SCRIPT = r"""
import json, sys, traceback
from vllm.platforms import current_platform
assert type(current_platform).__name__ == "KunlunHostEmulationPlatform"
from vllm_kunlun.platforms.runtime_fixes import prepare_model_process
prepare_model_process(loads_weights=WITH_GUARD)
from vllm.config import set_current_vllm_config
from vllm.distributed import parallel_state as ps
from vllm.engine.arg_utils import EngineArgs
from vllm.model_executor.model_loader import get_model_loader

ps.init_distributed_environment(world_size=WORLD, rank=RANK, local_rank=RANK,
    backend="gloo", distributed_init_method="tcp://127.0.0.1:PORT")
ps.initialize_model_parallel(WORLD)
out = {}
for name, path in CASES.items():
    try:
        cfg = EngineArgs(model=path, dtype=DTYPES[name], max_model_len=256,
                         enforce_eager=True,
                         tensor_parallel_size=WORLD).create_engine_config()
        with set_current_vllm_config(cfg):
            get_model_loader(cfg.load_config).load_model(cfg, cfg.model_config)
        out[name] = {"ok": True}
    except Exception as exc:
        out[name] = {"ok": False, "error": f"{type(exc).__name__}: {exc}",
                     "trace": traceback.format_exc()[-3000:]}
print("RESULT " + json.dumps(out))
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def load_all(
    tmp: Path,
    with_guard: bool = True,
    world: int = 1,
    names: tuple[str, ...] | None = None,
) -> dict[str, Any]:
    """The cases (all, or ``names``) loaded by ``world`` ranks (one interpreter each);
    rank 0's results, after checking that every rank came to the same verdict."""
    chosen = {n: c for n, c in CASES.items() if names is None or n in names}
    paths = {name: str(write_case(case, tmp / name)) for name, case in chosen.items()}
    dtypes = {
        name: "float16" if case.writer in FLOAT16_WRITERS else "float32"
        for name, case in chosen.items()
    }
    port = _free_port()
    procs = []
    for rank in range(world):
        code = (
            SCRIPT.replace("WITH_GUARD", repr(with_guard))
            .replace("CASES.items()", f"{paths!r}.items()")
            .replace("DTYPES[name]", f"{dtypes!r}[name]")
            .replace("WORLD", str(world))
            .replace("RANK", str(rank))
            .replace("PORT", str(port))
        )
        procs.append(
            subprocess.Popen(
                [sys.executable, "-c", code],
                env=child_env(
                    {"VLLM_KUNLUN_HOST_EMULATION": "1", "VLLM_LOGGING_LEVEL": "WARNING"}
                ),
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                cwd=REPO,
            )
        )
    ranks = []
    try:
        for rank, proc in enumerate(procs):
            out, err = proc.communicate(timeout=1200)
            line = next((x for x in out.splitlines() if x.startswith("RESULT ")), None)
            if proc.returncode != 0 or line is None:
                pytest.fail(f"rank {rank}: exit {proc.returncode}\n{err[-5000:]}")
            ranks.append(json.loads(line[len("RESULT ") :]))
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
    verdicts = [{n: r["ok"] for n, r in got.items()} for got in ranks]
    assert all(v == verdicts[0] for v in verdicts), verdicts
    return dict(ranks[0])


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return load_all(tmp_path_factory.mktemp("checkpoints"))


@pytest.fixture(scope="module")
def results_tp2(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return load_all(tmp_path_factory.mktemp("checkpoints-tp2"), world=2, names=TP2)


LOADS = [n for n, c in CASES.items() if not c.expect]
REFUSED = [n for n, c in CASES.items() if c.expect]
# At TP 2 the cases where a rank's slot is a shard: merged and QKV rows, sharded
# scales, a row-split GDN projection, a split vocabulary (the rest load the same
# way on one rank or two, and each case at TP 2 costs a load on both ranks).
TP2 = (
    "qwen3_ok",
    "w8a8_ok",
    "qwen3_5_ok",
    "w8a8_missing_shard_scale",
    "qwen3_q_proj_8_extra",
    "qwen3_5_in_proj_a_3_extra",
    "qwen3_5_in_proj_b_one_short",
    "qwen3_embed_extra",
)


@pytest.mark.parametrize("name", LOADS)
def test_complete_checkpoints_still_load(results: dict[str, Any], name: str) -> None:
    got = results[name]
    assert got["ok"], got.get("trace")


@pytest.mark.parametrize("name", REFUSED)
def test_broken_checkpoint_is_refused_naming_it(
    results: dict[str, Any], name: str
) -> None:
    got = results[name]
    assert not got["ok"], f"{name} loaded"
    for words in CASES[name].expect:
        assert words in got["error"], (words, got["error"])
    # Refused by a check that names the cause, not by an assert deep in vLLM.
    assert not got["error"].startswith(("AssertionError", "RuntimeError")), got


@pytest.mark.parametrize("name", [n for n in LOADS if n in TP2])
def test_complete_checkpoints_load_split_over_two_ranks(
    results_tp2: dict[str, Any], name: str
) -> None:
    got = results_tp2[name]
    assert got["ok"], got.get("trace")


@pytest.mark.parametrize("name", [n for n in REFUSED if n in TP2])
def test_broken_checkpoint_is_refused_on_every_rank(
    results_tp2: dict[str, Any], name: str
) -> None:
    """Each rank loads half a split dimension: the oversize tensor would be cut on
    both, the undersize one cut short on the last."""
    got = results_tp2[name]
    assert not got["ok"], f"{name} loaded at TP 2"
    for words in CASES[name].expect:
        assert words in got["error"], (words, got["error"])
