"""Runtime patch ``rejection_allowed_token_ids``: ``allowed_token_ids`` under
speculative decoding masks each draft position of its own request, instead of killing
the engine.

Why: vLLM 0.15.1's ``RejectionSampler.apply_logits_processors`` maps draft positions to
requests with ``arange(len(sampling_metadata.output_token_ids)).repeat_interleave(
num_draft_tokens)``. The input batch fills ``output_token_ids`` only when penalties,
bad words or a logits processor need it, so for a plain request with
``allowed_token_ids`` the list is empty: on torch 2.5.1 the index comes out empty
(newer torch raises) and ``masked_fill_`` fails ("size of tensor a (2) must match ...
b (0)"). The engine core dies, the client gets HTTP 200 with an error body and the API
server exits: one request ``{"allowed_token_ids": [id], "temperature": 0}`` against
``--speculative-config '{"method": "mtp", ...}'`` takes the server down.
How: when the batch has an allowed-token mask and no ``output_token_ids``, the wrapper
calls vLLM's method without the mask (penalties are off in that case: vLLM's penalty
path is the one that needs ``output_token_ids``) and applies the mask itself, each
draft position taking its request's row, counting requests by ``num_draft_tokens`` as
the rest of the rejection sampler does. Otherwise vLLM's method runs unchanged.
Applied in every model process (``Phase.MODEL_PROCESS``).
Removal: when vLLM counts requests by ``num_draft_tokens`` there.
"""

from __future__ import annotations

import dataclasses
import functools
from types import ModuleType
from typing import Any

import torch

from vllm_kunlun.patching.attribute import AttributePatch, OptionalPatch, expect_params

NAME = "rejection_allowed_token_ids"
_PARAMS = ("self", "logits", "sampling_metadata", "metadata")


def draft_rows(num_draft_tokens: list[int], device: torch.device) -> torch.Tensor:
    """The request index of every draft position: ``[0, 0, 1, 2, 2, 2]`` for
    ``num_draft_tokens`` ``[2, 1, 3]``."""
    counts = torch.tensor(num_draft_tokens, dtype=torch.long)
    rows = torch.arange(len(num_draft_tokens)).repeat_interleave(counts)
    return rows.to(device)


def _check(module: ModuleType, original: Any) -> str | None:
    return expect_params(original, "RejectionSampler.apply_logits_processors", _PARAMS)


def _make(original: Any) -> Any:
    @functools.wraps(original)
    def apply_logits_processors(
        self: Any, logits: torch.Tensor, sampling_metadata: Any, metadata: Any
    ) -> torch.Tensor:
        mask = sampling_metadata.allowed_token_ids_mask
        if mask is None or sampling_metadata.output_token_ids:
            return original(self, logits, sampling_metadata, metadata)
        unmasked = dataclasses.replace(sampling_metadata, allowed_token_ids_mask=None)
        logits = original(self, logits, unmasked, metadata)
        rows = draft_rows(list(metadata.num_draft_tokens), mask.device)
        logits.masked_fill_(mask[rows].to(logits.device), float("-inf"))
        return logits

    return apply_logits_processors


PATCH = AttributePatch(
    NAME,
    "vllm.v1.sample.rejection_sampler",
    "RejectionSampler.apply_logits_processors",
    _make,
    _check,
)


FIX = OptionalPatch(
    NAME,
    (PATCH,),
    "allowed_token_ids with speculative decoding kills the engine (vLLM 0.15.1)",
)
install, installed, uninstall, RUNTIME_PATCHES = FIX.bindings()
