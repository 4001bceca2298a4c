"""Let the checks import vLLM modules that need ``vllm.config`` on torch 2.5.1.

``register()`` applies the schema fix whenever vLLM resolves its platform; checks that
import vLLM's model registry or sampler apply the same fix, and only that one (not the
platform's other runtime patches), in case the doctor's process has not resolved a
platform yet. The fix is reached through ``patching`` (checks sit below platforms).
"""

from __future__ import annotations

from vllm_kunlun.patching.phases import Phase, apply_phase


def ensure_vllm_importable() -> None:
    apply_phase(Phase.PROCESS_START)  # the schema fix, as register() applies it
