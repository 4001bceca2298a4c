"""Let the doctor import vLLM modules that need ``vllm.config`` on torch 2.5.1.

The platform applies the schema fix when it starts; the doctor may run where vLLM
resolved another platform (a build host, CI), so checks that import vLLM's model
registry or sampler apply the same fix, and only that one (not the platform's other
runtime patches), in the doctor's own process.
"""

from __future__ import annotations

from vllm_kunlun import envs
from vllm_kunlun.patching import schema


def ensure_vllm_importable() -> None:
    if envs.VLLM_KUNLUN_SCHEMA_FIX:
        schema.apply()
