"""RMSNorm, fused add + RMSNorm, Gemma RMSNorm and gated RMSNorm as out-of-tree
CustomOps: vLLM builds these classes in place of its own (``CustomOp.register_oot``,
see ``__init__.py``) and calls ``forward_oot`` on a vllm-kunlun platform.

Each keeps vLLM's constructor, weights and ``forward_native``; ``forward_oot`` runs the
vendor kernel through ``ops/custom_ops/norms_vendor.py`` and falls back to ``forward_native`` (logged once
per reason) when the kernel is missing or refuses the inputs.

Removal: when vLLM dispatches these ops to Kunlun kernels itself.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from vllm.model_executor.layers.layernorm import GemmaRMSNorm, RMSNorm, RMSNormGated

from vllm_kunlun.ops.custom_ops import norms_vendor as norms
from vllm_kunlun.ops.routes import Kernels, Route


class _ResidualNormRoute:
    """``forward_oot`` of the (x, residual) norms: the vendor kernel through the
    class's route, vLLM's ``forward_native`` where the route falls back."""

    kunlun_route: Route
    _vendor: Callable[..., torch.Tensor | tuple[torch.Tensor, torch.Tensor]]
    forward_native: Callable[..., torch.Tensor | tuple[torch.Tensor, torch.Tensor]]

    def forward_oot(
        self, x: torch.Tensor, residual: torch.Tensor | None = None
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        return self.kunlun_route.run(self._vendor, self.forward_native, x, residual)


class KunlunRMSNorm(_ResidualNormRoute, RMSNorm):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.kunlun_route = Route("rms_norm", ("rmsnorm", "add_rmsnorm"))

    def _vendor(
        self, k: Kernels, x: torch.Tensor, residual: torch.Tensor | None = None
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        return norms.rms_norm(
            k,
            x,
            residual,
            self.weight.data,
            self.variance_epsilon,
            self.variance_size_override,
        )


class KunlunGemmaRMSNorm(_ResidualNormRoute, GemmaRMSNorm):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.kunlun_route = Route(
            "gemma_rms_norm", ("gemma_rmsnorm", "gemma_add_rmsnorm")
        )

    def _vendor(
        self, k: Kernels, x: torch.Tensor, residual: torch.Tensor | None = None
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        return norms.gemma_rms_norm(
            k, x, residual, self.weight.data, self.variance_epsilon
        )


class KunlunRMSNormGated(RMSNormGated):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.kunlun_route = Route("rms_norm_gated", ("rms_norm_gated",))

    def _vendor(
        self, k: Kernels, x: torch.Tensor, z: torch.Tensor | None = None
    ) -> torch.Tensor:
        return norms.rms_norm_gated(
            k, x, z, self.weight, self.eps, self.group_size, self.norm_before_gate
        )

    def forward_oot(
        self, x: torch.Tensor, z: torch.Tensor | None = None
    ) -> torch.Tensor:
        return self.kunlun_route.run(self._vendor, self.forward_native, x, z)
