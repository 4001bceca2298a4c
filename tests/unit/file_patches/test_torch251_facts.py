"""The torch 2.5.1 / xgrammar 0.1.29 facts each patch of patch_torch251 rests on.

When one of these starts failing, the stack changed and the matching patch (named in
each test) is probably unnecessary: check its header's Unnecessary-from line.
"""

from __future__ import annotations

import inspect

import pytest
import torch

pytestmark = pytest.mark.skipif(
    not torch.__version__.startswith("2.5.1"), reason="facts about torch 2.5.1"
)


def test_01_dynamo_calls_inline_call_with_four_arguments() -> None:
    from torch._dynamo.symbolic_convert import InliningInstructionTranslator

    raw = inspect.getattr_static(InliningInstructionTranslator, "inline_call_")
    assert isinstance(raw, staticmethod)
    params = list(inspect.signature(raw.__func__).parameters)
    assert params == ["parent", "func", "args", "kwargs"]


def _trace(fn):  # type: ignore[no-untyped-def]
    torch._dynamo.reset()
    x = torch.randn(5, 8)
    torch._dynamo.mark_dynamic(x, 0)
    return torch.compile(fn, backend="eager", fullgraph=True)(x)


def test_02_dynamo_cannot_build_torch_size_from_a_symbolic_shape() -> None:
    def with_size(q: torch.Tensor) -> torch.Tensor:
        return torch.empty(torch.Size((q.shape[0], 8)), dtype=q.dtype)

    def with_tuple(q: torch.Tensor) -> torch.Tensor:
        shape = (q.shape[0], 8)
        return torch.empty(shape, dtype=q.dtype).view(-1, 2, shape[-1] // 2)

    with pytest.raises(torch._dynamo.exc.Unsupported, match=r"torch\.Size"):
        _trace(with_size)
    assert _trace(with_tuple).shape == (5, 2, 4)


def test_03_04_functorch_has_no_bundled_autograd_cache() -> None:
    config = torch._functorch.config
    assert not hasattr(config, "bundled_autograd_cache")
    with pytest.raises(KeyError), config.patch("bundled_autograd_cache", True):
        pass
    with pytest.raises(AttributeError, match="does not exist"):
        config.bundled_autograd_cache = False


def test_06_torch_compile_has_no_guard_filter_fn() -> None:
    params = inspect.signature(torch._dynamo.eval_frame._optimize).parameters
    assert "guard_filter_fn" not in params

    seen: list[dict[str, object]] = []

    def backend(gm, example_inputs, **kwargs):  # type: ignore[no-untyped-def]
        seen.append(kwargs)
        return gm.forward

    torch._dynamo.reset()
    fn = torch.compile(
        lambda x: x + 1, backend=backend, options={"guard_filter_fn": list}
    )
    fn(torch.ones(2))
    # The option is not consumed by torch.compile: it reaches the backend.
    assert seen and "guard_filter_fn" in seen[0]["options"]  # type: ignore[operator]


def test_07_xgrammar_bitmask_has_no_backend_choice() -> None:
    xgr = pytest.importorskip("xgrammar")
    params = inspect.signature(xgr.apply_token_bitmask_inplace).parameters
    assert list(params) == ["logits", "bitmask", "vocab_size", "indices"]
    source = inspect.getsource(xgr.apply_token_bitmask_inplace)
    assert "apply_token_bitmask_inplace_triton" in source  # what "cuda" tensors get


def test_08_10_transformers_knows_qwen3_5_configs() -> None:
    """Why there is no registry patch: AutoConfig (vLLM's fallback) has both types."""
    from transformers import AutoConfig

    assert type(AutoConfig.for_model("qwen3_5")).__name__ == "Qwen3_5Config"
    assert type(AutoConfig.for_model("qwen3_5_moe")).__name__ == "Qwen3_5MoeConfig"
