"""One opaque torch custom op in the plugin's ``vllm_kunlun`` namespace, defined the
first time it is asked for.

Why: a kernel family whose paths differ by device (vendor, portable) hides the choice
behind one op, so torch.compile traces a single node with a fake (shape-only)
implementation instead of the Python that picks a path; each family's seam holds one
``PluginOp`` and keeps its own schema, implementation and fake.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

NAMESPACE = "vllm_kunlun"


class PluginOp:
    """``torch.ops.vllm_kunlun.<name>``, defined once per process by ``get()``."""

    def __init__(
        self,
        schema: str,
        impl: Callable[..., torch.Tensor],
        fake: Callable[..., torch.Tensor],
    ) -> None:
        self.name = schema.split("(", 1)[0]
        self.schema = schema
        self.impl = impl
        self.fake = fake
        self._library: torch.library.Library | None = None

    @property
    def qualname(self) -> str:
        return f"{NAMESPACE}::{self.name}"

    def get(self) -> Callable[..., Any]:
        if self._library is None:
            lib = torch.library.Library(NAMESPACE, "FRAGMENT")
            lib.define(self.schema)
            lib.impl(self.name, self.impl, "CompositeExplicitAutograd")
            torch.library.register_fake(self.qualname, self.fake, lib=lib)
            self._library = lib
        return getattr(getattr(torch.ops, NAMESPACE), self.name)  # type: ignore[no-any-return]
