"""SiLU-and-mul as an out-of-tree CustomOp (see ``__init__.py``): vLLM's
``SiluAndMul`` with a ``forward_oot`` on the vendor kernel (``ops/custom_ops/activation_vendor.py``),
falling back to ``forward_native`` (logged once per reason) when it is missing or
refuses.

Removal: when vLLM dispatches SiLU-and-mul to a Kunlun kernel itself.
"""

from __future__ import annotations

from typing import Any

import torch
from vllm.model_executor.layers.activation import SiluAndMul

from vllm_kunlun.ops.custom_ops import activation_vendor as activation
from vllm_kunlun.ops.routes import Route


class KunlunSiluAndMul(SiluAndMul):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.kunlun_route = Route("silu_and_mul", ("silu_and_mul",))

    def forward_oot(self, x: torch.Tensor) -> torch.Tensor:
        return self.kunlun_route.run(activation.silu_and_mul, self.forward_native, x)
