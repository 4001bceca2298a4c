"""Doctor check 3: the Qwen2-VL image processor attributes vLLM 0.15.1 reads, by
behaviour on an instance (a class-level hasattr is False even on the good release)."""

from __future__ import annotations

from typing import Any

from vllm_kunlun.checks.finding import Context
from vllm_kunlun.doctor.transformers_compat import FIX, check_transformers_compat


class Like520:
    """transformers 5.2.0's shape: attributes set on the instance in __init__."""

    def __init__(self) -> None:
        self.size = {"shortest_edge": 3136, "longest_edge": 1003520}
        self.min_pixels = self.size["shortest_edge"]
        self.max_pixels = self.size["longest_edge"]


class Like553:
    """transformers 5.5.x's shape: only ``size`` is left."""

    def __init__(self) -> None:
        self.size = {"shortest_edge": 3136, "longest_edge": 1003520}


class LikeFast520:
    """transformers 5.2.0's fast processor: the attributes exist but are None, the
    bounds are in ``size``."""

    def __init__(self, size: dict | None = None) -> None:
        self.size = size or {"shortest_edge": 3136, "longest_edge": 1003520}
        self.min_pixels = None
        self.max_pixels = None


def _check(*processors: tuple[str, Any, str]):
    return check_transformers_compat(Context(), list(processors))


def test_instance_attributes_count_not_class_attributes() -> None:
    f = _check(("Qwen2VLImageProcessor", Like520, ""))
    assert f.status == "ok", f
    assert f.details["Qwen2VLImageProcessor"]["class_hasattr_max_pixels"] is False


def test_removed_max_pixels_fails_with_the_downgrade() -> None:
    f = _check(("Qwen2VLImageProcessor", Like553, ""))
    assert f.status == "fail"
    assert "Qwen2VLImageProcessor: instance has no .max_pixels" in f.cause
    assert "min_pixels" in f.cause
    assert f.fix == FIX == "pip install --no-deps --force-reinstall transformers==5.2.0"


def test_fast_processor_missing_torchvision_is_not_a_failure() -> None:
    f = _check(
        ("Qwen2VLImageProcessor", Like520, ""),
        ("Qwen2VLImageProcessorFast", None, "ModuleNotFoundError: torchvision"),
    )
    assert f.status == "ok"
    assert "torchvision" in f.details["Qwen2VLImageProcessorFast"]


def test_fast_processor_with_bounds_in_size_passes_and_without_them_fails() -> None:
    ok = _check(("Qwen2VLImageProcessor", Like520, ""), ("Fast", LikeFast520, ""))
    assert ok.status == "ok", ok
    bad = _check(("Fast", lambda: LikeFast520({"height": 4}), ""))
    assert bad.status == "fail"
    assert '.size["longest_edge"] unreadable' in bad.cause
    assert "Fast: .max_pixels is None, not an int" in bad.cause


def test_slow_processor_not_importable_fails() -> None:
    f = _check(("Qwen2VLImageProcessor", None, "ImportError: gone"))
    assert f.status == "fail" and "does not import" in f.cause


def test_installed_transformers_520_passes() -> None:
    """The real transformers of the validated stack, instance built offline."""
    f = check_transformers_compat(Context())
    assert f.details["transformers"] == "5.2.0"
    assert f.status == "ok", f
    assert f.details["Qwen2VLImageProcessor"]["instance_ok"] is True
