"""What the fake compute kernels share: call records and the input checks.

Records go to ``kunlun_ops.CALLS`` (as ``KernelCall``: tensors described, not copied;
a KV cache is too big to clone on every call) and, when ``FAKE_KUNLUN_OPS_RECORD`` names
a file, as one JSON line per call appended to it: engine processes a test did not
start itself (vLLM's spawned engine core) leave their calls there too.

The checks raise what a real kernel's argument validation would: a wrong dtype, a
non-contiguous tensor, tensors on different devices, mismatched shapes.
"""

from __future__ import annotations

import itertools
import json
import os
import sys
from dataclasses import asdict, dataclass
from typing import Any

import torch

RECORD_ENV = "FAKE_KUNLUN_OPS_RECORD"
FLOATS = (torch.float16, torch.bfloat16, torch.float32)


@dataclass
class KernelCall:
    name: str
    args: dict[str, Any]
    pid: int


def describe(value: Any) -> Any:
    if torch.is_tensor(value):
        return {
            "shape": list(value.shape),
            "dtype": str(value.dtype).removeprefix("torch."),
            "device": str(value.device),
            "contiguous": value.is_contiguous(),
            "ptr": value.data_ptr(),
        }
    if isinstance(value, (list, tuple)):
        return [describe(v) for v in value]
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return repr(value)


def record(name: str, **args: Any) -> None:
    call = KernelCall(name, {k: describe(v) for k, v in args.items()}, os.getpid())
    sys.modules["kunlun_ops"].CALLS.append(call)
    write_record(asdict(call))


def write_record(entry: dict[str, Any]) -> None:
    """Append ``entry`` as one JSON line to the file ``FAKE_KUNLUN_OPS_RECORD`` names."""
    path = os.environ.get(RECORD_ENV)
    if path:
        with open(path, "a") as f:
            f.write(json.dumps(entry) + "\n")


def fail(kernel: str, what: str) -> None:
    raise ValueError(f"kunlun_ops.{kernel}: {what}")


def check_tensor(
    kernel: str,
    name: str,
    t: Any,
    *,
    dtypes: tuple[torch.dtype, ...] | None = None,
    dim: int | None = None,
    device: torch.device | None = None,
) -> torch.Tensor:
    if not torch.is_tensor(t):
        fail(kernel, f"{name} must be a tensor, got {type(t).__name__}")
    if not t.is_contiguous():
        fail(
            kernel,
            f"{name} must be contiguous (shape {tuple(t.shape)} strides {t.stride()})",
        )
    if dtypes is not None and t.dtype not in dtypes:
        fail(kernel, f"{name} has dtype {t.dtype}; the kernel takes {dtypes}")
    if dim is not None and t.dim() != dim:
        fail(kernel, f"{name} must be {dim}-D, got shape {tuple(t.shape)}")
    if device is not None and t.device != device:
        fail(kernel, f"{name} is on {t.device}, the other inputs on {device}")
    return t


def check_same(kernel: str, ref_name: str, ref: torch.Tensor, **others: Any) -> None:
    """Every other tensor has the reference's dtype and device."""
    for name, t in others.items():
        check_tensor(kernel, name, t, dtypes=(ref.dtype,), device=ref.device)


def check_lod(
    kernel: str, name: str, cpu: Any, xpu: Any, device: torch.device, count: int
) -> list[int]:
    """Host and device copies of int32 offsets [0, ...] with ``count`` entries."""
    check_tensor(kernel, f"{name}_cpu", cpu, dtypes=(torch.int32,), dim=1)
    check_tensor(
        kernel, f"{name}_xpu", xpu, dtypes=(torch.int32,), dim=1, device=device
    )
    if cpu.device.type != "cpu":
        fail(kernel, f"{name}_cpu must be on the host, got {cpu.device}")
    values = cpu.tolist()
    if len(values) != count or values[0] != 0 or xpu.cpu().tolist() != values:
        fail(
            kernel,
            f"{name}: host {values} and device {xpu.cpu().tolist()} differ or are no offsets of {count - 1}",
        )
    if any(b < a for a, b in itertools.pairwise(values)):
        fail(kernel, f"{name} is not ascending: {values}")
    return values


def unmodeled(kernel: str, **args: Any) -> None:
    """Arguments the fake does not model must keep their defaults."""
    for name, (value, default) in args.items():
        if value is not default and value != default:
            raise NotImplementedError(
                f"fake kunlun_ops.{kernel} does not model {name}={value!r}"
            )
