"""gpt-oss's released MXFP4 experts are refused when vLLM reads the method, with the
way to the unquantized model the plugin serves (the family matrix serves gpt-oss bf16)."""

from __future__ import annotations

import pytest

from vllm_kunlun.ops.int8.schemes import refuse_method


def test_mxfp4_refusal_names_the_dequantizing_fix() -> None:
    with pytest.raises(ValueError) as info:
        refuse_method("mxfp4", "on the host")
    message = str(info.value)
    assert message.startswith("mxfp4 quantization cannot run on the host")
    assert "Mxfp4Config(dequantize=True)" in message and "save_pretrained" in message


def test_other_methods_get_no_gpt_oss_hint() -> None:
    with pytest.raises(ValueError) as info:
        refuse_method("fp8", "on the host")
    assert "Mxfp4Config" not in str(info.value)
    refuse_method("compressed-tensors", "on the host")  # served: no error
    refuse_method(None, "on the host")
