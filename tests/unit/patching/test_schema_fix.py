"""Runtime patch schema_pep585: torch 2.5.1 infers schemas from modern annotations.

No ``from __future__ import annotations`` here: the ops need real annotation objects,
as in vLLM's modules.
"""

import collections.abc
import typing

import pytest
import torch
from torch._library import infer_schema as infer_mod

from vllm_kunlun.patching import schema

pytestmark = pytest.mark.skipif(not schema.needed(), reason="torch >= 2.6 needs no fix")


def op_modern(
    x: torch.Tensor,
    seq: collections.abc.Sequence[int],
    shape: list[int],
    scale: float | None = None,
    maybe: torch.Tensor | None = None,
    sizes: list[int] | None = None,
) -> list[torch.Tensor]:
    raise NotImplementedError


def op_typing(
    x: torch.Tensor,
    seq: typing.Sequence[int],
    shape: typing.List[int],  # noqa: UP006
    scale: typing.Optional[float] = None,  # noqa: UP045
    maybe: typing.Optional[torch.Tensor] = None,  # noqa: UP045
    sizes: typing.Optional[typing.List[int]] = None,  # noqa: UP006, UP045
) -> typing.List[torch.Tensor]:  # noqa: UP006
    raise NotImplementedError


@pytest.fixture(autouse=True)
def unpatched() -> typing.Iterator[None]:
    """Each test starts from torch's own tables (conftest applies the fix globally)."""
    was_applied = schema.applied()
    schema.revert()
    yield
    schema.revert()
    if was_applied:
        schema.apply()


@pytest.fixture
def patched(unpatched: None) -> None:
    assert schema.apply() is True


def test_torch_251_rejects_list_int_without_the_fix() -> None:
    with pytest.raises(ValueError, match="has unsupported type"):
        torch.library.infer_schema(op_modern, mutates_args=())


def test_modern_annotations_give_the_same_schema_as_typing_ones(patched: None) -> None:
    expected = torch.library.infer_schema(op_typing, mutates_args=())
    assert torch.library.infer_schema(op_modern, mutates_args=()) == expected
    assert "SymInt[] shape" in expected and "Tensor? maybe=None" in expected


def test_apply_is_idempotent_and_revert_restores_the_tables(patched: None) -> None:
    assert schema.apply() is False  # second call changes nothing
    schema.revert()
    assert list[int] not in infer_mod.SUPPORTED_PARAM_TYPES
    assert typing.List[int] in infer_mod.SUPPORTED_PARAM_TYPES  # noqa: UP006
    assert schema.apply() is True


def test_modern_spelling() -> None:
    assert schema.modern_spelling(typing.List[int]) == list[int]  # noqa: UP006
    opt = schema.modern_spelling(typing.Optional[typing.List[int]])  # noqa: UP006, UP045
    assert opt == (list[int] | None)
    assert schema.modern_spelling(int) is int


def test_unexpected_torch_internals_fail_with_a_fix(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delattr(infer_mod, "SUPPORTED_RETURN_TYPES")
    with pytest.raises(RuntimeError, match="VLLM_KUNLUN_SCHEMA_FIX=0"):
        schema.apply()
    assert not schema.applied()
