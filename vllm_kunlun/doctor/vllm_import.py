"""Let the doctor import vLLM modules that need ``vllm.config`` on torch 2.5.1.

``register()`` applies the schema fix whenever vLLM resolves its platform; checks that
import vLLM's model registry or sampler apply the same fix, and only that one (not the
platform's other runtime patches), in case the doctor's process has not resolved a
platform yet.
"""

from __future__ import annotations

from vllm_kunlun.platforms.runtime_fixes import apply_schema_fix


def ensure_vllm_importable() -> None:
    apply_schema_fix()
