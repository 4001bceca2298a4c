"""One kind of parameter in a model's layer, as the weight budgets count it.

Why its own module: the Qwen3.5-MoE count (``moe_params.py``) and the other MoE
families' counts (``moe_families.py``) both build lists of these, and the first hands
the second's families over to it; with the type here neither imports the other for it.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Tensor:
    """Parameters of one kind in one layer (``count`` copies: experts, or 1)."""

    group: str  # "embeddings", "lm_head", "attention", "gdn", "router", "experts", ...
    name: str  # module name as the checkpoint spells it, for the ignore list
    rows: int  # output channels of a linear; numel for anything else (cols 1)
    cols: int
    count: int = 1
    linear: bool = True
    split: str = "tp"  # "tp": over the ranks; "replicated": on every card; "kv"
    kv_heads: int = 0  # split "kv": heads, replicated once TP exceeds them

    @property
    def params(self) -> int:
        return self.rows * self.cols * self.count

    def rows_per_card(self, tp: int) -> float:
        if self.split == "replicated":
            return self.rows
        if self.split == "kv":
            return self.rows / self.kv_heads * max(1, self.kv_heads // tp)
        return self.rows / tp
