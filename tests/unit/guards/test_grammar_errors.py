"""``grammar_error_cause``: vLLM's own validator, wrapped, names xgrammar's reason for
a bad grammar or schema; a good request passes untouched."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from vllm.sampling_params import SamplingParams, StructuredOutputsParams

from tests.conftest import patch_state
from vllm_kunlun.guards import grammar_errors


def _validate(**constraint: object) -> None:
    import vllm.v1.engine.input_processor as input_processor

    params = SamplingParams(structured_outputs=StructuredOutputsParams(**constraint))
    input_processor.validate_xgrammar_grammar(params)


@pytest.fixture
def installed() -> Iterator[None]:
    # Whatever an earlier test in this process left (a platform hook applies the phase).
    with patch_state(grammar_errors, on=True):
        assert grammar_errors.installed()
        yield


@pytest.mark.parametrize(
    ("constraint", "vllm_says", "reason"),
    [
        ({"grammar": "root ::= undefined_rule"}, "Invalid grammar", '"undefined_rule"'),
        ({"grammar": 'root ::= "a" (b'}, "Invalid grammar", "is not defined"),
        ({"json": "{not json"}, "Invalid JSON", "double quotes"),
    ],
)
def test_the_reason_is_named(
    installed: None, constraint: dict, vllm_says: str, reason: str
) -> None:
    with pytest.raises(ValueError) as caught:
        _validate(**constraint)
    message = str(caught.value)
    assert message.startswith(vllm_says) and reason in message, message
    assert "[" not in message.split(": ", 1)[1][:1]  # no xgrammar log prefix


def test_without_the_patch_the_reason_is_dropped() -> None:
    with patch_state(grammar_errors, on=False), pytest.raises(ValueError) as caught:
        _validate(grammar="root ::= undefined_rule")
    assert "undefined_rule" not in str(caught.value)


def test_good_constraints_pass(installed: None) -> None:
    _validate(grammar='root ::= "a" | "b"')
    _validate(regex="[a-z]+")
    _validate(json={"type": "object"})


def test_cause_text_drops_the_log_prefix() -> None:
    raw = "[03:48:23] /project/cpp/ebnf_parser.cc:52: Rule x is not defined\n"
    assert grammar_errors.cause_text(ValueError(raw)) == "Rule x is not defined"


class _Platform:
    is_vllm_kunlun_platform = True

    def __init__(self, device_type: str) -> None:
        self.device_type = device_type


def test_kunlun_without_patch_07_is_refused_with_the_fix() -> None:
    import vllm.v1.structured_output.utils as unpatched  # the shared venv: no patch

    assert not hasattr(unpatched, grammar_errors.PATCH_07_FUNCTION)
    refusal = grammar_errors.patch_07_refusal(_Platform("cuda"), unpatched)
    assert refusal is not None and "vllm-kunlun patch apply" in refusal


def test_patch_07_or_emulation_or_another_platform_serve() -> None:
    class Patched:
        _apply_token_bitmask_torch_native = staticmethod(lambda *a: None)

    import vllm.v1.structured_output.utils as unpatched

    assert grammar_errors.patch_07_refusal(_Platform("cuda"), Patched()) is None
    assert grammar_errors.patch_07_refusal(_Platform("cpu"), unpatched) is None
    other = type("Other", (), {"device_type": "cuda"})()
    assert grammar_errors.patch_07_refusal(other, unpatched) is None
