"""The torch-level runtime fixes that stand in for file patches, and their state.

``vllm-kunlun patch status`` and the doctor list them beside the file patch set. This
module imports neither vLLM nor the plugin's logger: the patch CLI must work on a vLLM
tree that does not import.
"""

from __future__ import annotations

from vllm_kunlun.patching import schema, wrap_triton


def runtime_fix_states() -> dict[str, str]:
    """Name -> one line: needed or not on this torch, applied, or why it cannot be."""
    return {schema.NAME: schema.state(), wrap_triton.NAME: wrap_triton.state()}
