"""Broken checkpoints refused at engine start: real ``vllm.LLM`` in host emulation.

One engine start per path to a refusal (a deleted W8A8 ``weight_scale``, a Qwen3.5
``in_proj_a`` with 3 extra rows, an FP8 config), in one interpreter, one after the other, each
with vLLM's multiprocessing engine: the checkpoint guard must be in place in the
spawned engine core (the plugin's worker installs it there), and the front end must
fail to start. The refusal is logged by the engine core (its stderr), which the front
end answers with vLLM's "Engine core initialization failed"; the FP8 config is refused
by the front end itself, before any process starts. That untouched checkpoints still
serve is what the e2e tests (test_e2e_w8a8.py, test_e2e_hybrid.py) show.
"""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from tests.conftest import run_python
from tests.integration.checkpoint_mutations import CASES, write_case

pytestmark = pytest.mark.slow

# One start per path to the refusal: a quantized scale missing (vLLM's own check skips
# quantized models), the plugin's Qwen3.5 loader with an oversize tensor, the front
# end's scheme refusal. Every other kind of damage goes through the same guard in the
# same loader and is covered in-process by test_checkpoint_guard.py.
ENGINE_CASES = (
    "w8a8_missing_scale",
    "qwen3_5_in_proj_a_3_extra",
    "fp8_config",
)
# The engine arguments of the e2e tests, smaller: the engine never gets to serve.
LLM_ARGS = {"dtype": "float32", "max_model_len": 256, "max_num_seqs": 2, "seed": 0}

SCRIPT = r"""
import json, sys, traceback
from vllm import LLM
for name, path in CASES.items():
    print(f"=== START {name}", file=sys.stderr, flush=True)
    try:
        llm = LLM(model=path, **LLM_ARGS)
        outcome = {"started": True}
        del llm
    except Exception as exc:
        outcome = {"started": False, "error": f"{type(exc).__name__}: {exc}"}
    print(f"=== END {name} " + json.dumps(outcome), file=sys.stderr, flush=True)
"""


def _selected(request: pytest.FixtureRequest) -> list[str]:
    """The cases this session runs (``-k`` picks some: only those engines start)."""
    names = {
        item.callspec.params.get("name")
        for item in request.session.items
        if item.module is request.module and hasattr(item, "callspec")
    }
    return [n for n in ENGINE_CASES if n in names]


@pytest.fixture(scope="module")
def starts(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, Any]:
    tmp = tmp_path_factory.mktemp("checkpoint-engines")
    selected = _selected(request)
    paths = {n: str(write_case(CASES[n], tmp / n)) for n in selected}
    code = SCRIPT.replace("CASES.items()", f"{paths!r}.items()").replace(
        "**LLM_ARGS", f"**{LLM_ARGS!r}"
    )
    # Each start ends at model loading (or before): 30-180 s each on a loaded host
    # (18 min for six on a loaded host; three here, the rest covered in-process).
    proc = run_python(
        code,
        env={"VLLM_KUNLUN_HOST_EMULATION": "1", "VLLM_LOGGING_LEVEL": "INFO"},
        timeout=1200,
    )
    out: dict[str, Any] = {}
    for m in re.finditer(
        r"=== START (\w+)\n(.*?)=== END \1 (\{.*?\})\n", proc.stderr, re.S
    ):
        out[m.group(1)] = {**json.loads(m.group(3)), "log": m.group(2)}
    missing = [n for n in selected if n not in out]
    if proc.returncode != 0 or missing:
        pytest.fail(
            f"exit {proc.returncode}, no result for {missing}\n{proc.stderr[-6000:]}"
        )
    return out


@pytest.mark.parametrize("name", ENGINE_CASES)
def test_engine_refuses_to_start_naming_the_damage(
    starts: dict[str, Any], name: str
) -> None:
    got = starts[name]
    assert not got["started"], f"the engine started on {name}"
    where = got["error"] if name == "fp8_config" else got["log"]
    for words in CASES[name].expect:
        assert words in where, (words, got["error"], got["log"][-3000:])
    if name != "fp8_config":
        # Refused while the engine core loaded the checkpoint, by the plugin's check.
        assert "CheckpointError" in got["log"], got["log"][-3000:]
