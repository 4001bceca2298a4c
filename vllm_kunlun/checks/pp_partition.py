"""``VLLM_PP_LAYER_PARTITION`` against the model and the pipeline size.

Why: vLLM 0.15.1 checks only that the layer counts parse, that there is one per stage
and that they add up to the model's layers (``vllm.distributed.utils.get_pp_indices``).
``-1,5`` passes those checks on a 4-layer model and fails in the weight loader with a
message that blames the checkpoint; ``0,4`` ends in ``AssertionError: group_size must be
greater than 0``. The engine guard runs this check before vLLM builds a stage.
"""

from __future__ import annotations


def even_split(num_layers: int, pp: int) -> str:
    """A valid partition to suggest: as even as possible, extra layers in front."""
    base, extra = divmod(num_layers, pp)
    return ",".join(str(base + (1 if i < extra else 0)) for i in range(pp))


def pp_partition_problem(raw: str | None, pp: int, num_layers: int) -> str | None:
    """What is wrong with ``raw`` as the layer partition of ``num_layers`` layers over
    ``pp`` stages (cause and fix in one sentence), or None when it is usable."""
    if raw is None:
        return None
    fix = (
        f"set it to {pp} positive whole numbers that add up to {num_layers}, e.g. "
        f"VLLM_PP_LAYER_PARTITION={even_split(num_layers, pp)} "
        "(or unset it for vLLM's own split)"
    )
    if num_layers < pp:
        return (
            f"the model has {num_layers} layer(s), fewer than the {pp} pipeline "
            "stages; use a --pipeline-parallel-size of at most "
            f"{max(num_layers, 1)}"
        )
    try:
        parts = [int(x) for x in raw.split(",")]
    except ValueError:
        return f"VLLM_PP_LAYER_PARTITION={raw!r} is not a list of whole numbers: {fix}"
    if len(parts) != pp:
        return (
            f"VLLM_PP_LAYER_PARTITION={raw!r} names {len(parts)} stage(s) for "
            f"--pipeline-parallel-size {pp}: {fix}"
        )
    bad = [(i, n) for i, n in enumerate(parts) if n < 1]
    if bad:
        stage, n = bad[0]
        return (
            f"VLLM_PP_LAYER_PARTITION={raw!r} gives stage {stage} {n} layer(s); every "
            f"stage needs at least one: {fix}"
        )
    if sum(parts) != num_layers:
        return (
            f"VLLM_PP_LAYER_PARTITION={raw!r} adds up to {sum(parts)} layers; the "
            f"model has {num_layers}: {fix}"
        )
    return None
