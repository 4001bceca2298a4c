"""Check 5: the patch_torch251 file patch set for the installed vLLM / torch pair."""

from __future__ import annotations

from vllm_kunlun.doctor.finding import Context, Finding


def check_patchset(ctx: Context) -> Finding:
    try:
        from vllm_kunlun.patching import engine  # type: ignore[attr-defined]
    except ImportError as exc:
        return Finding(
            "patchset",
            "fail",
            f"vllm_kunlun.patching.engine is not available ({exc}): the patch set "
            "status cannot be read",
            "install a vllm-kunlun build that includes the patch engine",
        )
    summary = engine.status_summary()
    return Finding("patchset", "ok", str(summary))
