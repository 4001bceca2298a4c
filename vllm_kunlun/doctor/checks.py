"""The doctor's checks, in report order: one small function per failure class of the
deployment log (docs/deployment-log.md), each in the module of its family. Engine-start guards
(vllm_kunlun/guards/) reuse the same functions."""

from __future__ import annotations

from vllm_kunlun.checks.budget import check_kv_budget
from vllm_kunlun.checks.finding import Check
from vllm_kunlun.checks.model_path import check_model_path
from vllm_kunlun.checks.stack import check_stack_versions
from vllm_kunlun.doctor.devices import check_devices, check_platform
from vllm_kunlun.doctor.environment import check_environment
from vllm_kunlun.doctor.patchset import check_patchset
from vllm_kunlun.doctor.plugins import check_plugins
from vllm_kunlun.doctor.ray_cluster import check_ray
from vllm_kunlun.doctor.sampler_path import check_sampler_path
from vllm_kunlun.doctor.source_sync import check_source_sync
from vllm_kunlun.doctor.transformers_compat import check_transformers_compat
from vllm_kunlun.doctor.vendor_contract import check_vendor_contract

CHECKS: list[tuple[str, Check]] = [
    # First: a malformed variable stops the engine, and other checks read them too.
    ("environment", check_environment),
    # Before platform: a VLLM_PLUGINS that leaves ours out explains a wrong platform.
    ("plugins", check_plugins),
    ("platform", check_platform),
    ("devices", check_devices),
    ("stack_versions", check_stack_versions),
    ("transformers_compat", check_transformers_compat),
    ("vendor_contract", check_vendor_contract),
    ("patchset", check_patchset),
    ("model_path", check_model_path),
    ("kv_budget", check_kv_budget),
    # After the budget: how many cards the engine asks of the cluster.
    ("ray", check_ray),
    ("source_sync", check_source_sync),
    # Last: it may touch the device (a short noise-generation probe).
    ("sampler_path", check_sampler_path),
]
