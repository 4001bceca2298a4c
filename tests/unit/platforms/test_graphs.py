"""Graph-capture policy of KunlunPlatform (vllm_kunlun/platforms/graphs.py), no engine.

The resolved engine configs are in tests/integration/test_graph_config.py.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
from vllm.config import CompilationConfig, CUDAGraphMode, VllmConfig

from vllm_kunlun.file_patches import engine
from vllm_kunlun.platforms import graphs
from vllm_kunlun.platforms.emulation import KunlunHostEmulationPlatform
from vllm_kunlun.platforms.kunlun import KunlunPlatform


def test_kunlun_platform_declares_piecewise_graphs() -> None:
    assert KunlunPlatform.support_static_graph_mode() is True
    assert KunlunPlatform.get_static_graph_wrapper_cls() == (
        "vllm.compilation.cuda_graph.CUDAGraphWrapper"
    )
    assert KunlunPlatform.opaque_attention_op() is True  # attention = split point
    assert KunlunPlatform.get_compile_backend() == "eager"  # no Inductor


def test_host_emulation_keeps_vllms_no_graph_defaults() -> None:
    assert KunlunHostEmulationPlatform.support_static_graph_mode() is False
    assert KunlunHostEmulationPlatform.opaque_attention_op() is False


def test_capture_sizes_for_256_way_decode() -> None:
    assert graphs.capture_sizes(256, 1, 8192) == [1, 2, 4, *range(8, 257, 8)]


@pytest.mark.parametrize(
    ("shape", "expected"),
    [
        ((100, 1, 8192), [1, 2, 4, *range(8, 97, 8), 100]),  # the top itself
        ((3, 1, 8192), [1, 2, 3]),
        ((1, 1, 8192), [1]),
        ((64, 4, 8192), [1, 2, 4, *range(8, 257, 8)]),  # 3 speculative tokens
        ((256, 1, 100), [1, 2, 4, *range(8, 97, 8), 100]),  # token budget caps it
    ],
)
def test_capture_sizes_end_at_the_largest_decode_batch(
    shape: tuple[int, int, int], expected: list[int]
) -> None:
    assert graphs.capture_sizes(*shape) == expected


def _vllm_sizes(max_num_seqs: int, spec_tokens: int, max_tokens: int) -> list[int]:
    """vLLM 0.15.1's own VllmConfig._set_cudagraph_sizes on these inputs."""
    fake: Any = SimpleNamespace(
        model_config=SimpleNamespace(enforce_eager=False),
        compilation_config=CompilationConfig(cudagraph_mode=CUDAGraphMode.PIECEWISE),
        scheduler_config=SimpleNamespace(
            max_num_seqs=max_num_seqs, max_num_batched_tokens=max_tokens
        ),
        speculative_config=(
            SimpleNamespace(num_speculative_tokens=spec_tokens) if spec_tokens else None
        ),
        parallel_config=SimpleNamespace(tensor_parallel_size=1),
    )
    VllmConfig._set_cudagraph_sizes(fake)
    return list(fake.compilation_config.cudagraph_capture_sizes)


@pytest.mark.parametrize(
    ("seqs", "spec_tokens", "max_tokens"),
    [(256, 0, 8192), (1024, 0, 8192), (100, 0, 8192), (3, 0, 8192), (256, 0, 300),
     (64, 3, 8192), (128, 0, 2048), (1, 0, 16)],
)  # fmt: skip
def test_default_size_replica_matches_vllm(
    seqs: int, spec_tokens: int, max_tokens: int
) -> None:
    # The replica is how the platform tells vLLM's default from sizes a user gave.
    replica = graphs.vllm_default_capture_sizes(seqs, 1 + spec_tokens, max_tokens)
    assert replica == _vllm_sizes(seqs, spec_tokens, max_tokens)


def _report(states: dict[str, str], pair_problem: object = None) -> Any:
    patches = [SimpleNamespace(id=i, state=s) for i, s in states.items()]
    return SimpleNamespace(patches=patches, pair_problem=pair_problem)


ALL = (*graphs.COMPILE_PATCHES, graphs.INDUCTOR_PATCH, "05-custom-op-list-annotation")


def test_missing_compile_patches_are_named() -> None:
    states = dict.fromkeys(ALL, engine.APPLIED)
    states["03-piecewise-autograd-cache-option"] = engine.NOT_APPLIED
    states[graphs.INDUCTOR_PATCH] = engine.DRIFTED
    found = graphs.missing_patches("eager", inspect=lambda **_: _report(states))
    assert found == (["03-piecewise-autograd-cache-option"], None)
    # Inductor needs one more.
    found = graphs.missing_patches("inductor", inspect=lambda **_: _report(states))
    assert found[0] == ["03-piecewise-autograd-cache-option", graphs.INDUCTOR_PATCH]


def test_applied_set_or_another_stack_needs_nothing() -> None:
    applied = dict.fromkeys(ALL, engine.APPLIED)
    assert graphs.missing_patches("eager", inspect=lambda **_: _report(applied)) == (
        [],
        None,
    )
    # e.g. torch 2.9.1, which does not need the set: the version guard speaks there.
    pristine = dict.fromkeys(ALL, engine.NOT_APPLIED)
    other = _report(pristine, pair_problem=RuntimeError("torch 2.9.1"))
    assert graphs.missing_patches("eager", inspect=lambda **_: other) == ([], None)


def test_unreadable_patch_set_counts_as_missing() -> None:
    def broken(**_: Any) -> Any:
        raise FileNotFoundError("manifest.json")

    missing, why = graphs.missing_patches("eager", inspect=broken)
    assert missing == list(graphs.COMPILE_PATCHES)
    assert why is not None and "could not be checked" in why and "manifest" in why


def _config(**parallel: int) -> Any:
    """What apply_graph_defaults reads, with vLLM's own CompilationConfig as resolved
    by vLLM for -O2 before the platform hook (tests/integration: the real path)."""
    from vllm.config import CompilationMode

    compilation = CompilationConfig(
        mode=CompilationMode.VLLM_COMPILE,
        backend="eager",
        cudagraph_mode=CUDAGraphMode.FULL_AND_PIECEWISE,
        cudagraph_capture_sizes=[1, 2, 4, 8],
        max_cudagraph_capture_size=8,
    )
    return SimpleNamespace(
        compilation_config=compilation,
        model_config=SimpleNamespace(enforce_eager=False),
        parallel_config=SimpleNamespace(
            tensor_parallel_size=parallel.get("tp", 1),
            pipeline_parallel_size=parallel.get("pp", 1),
        ),
    )


@pytest.fixture
def warnings(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    said: list[str] = []
    monkeypatch.setattr(
        graphs.logger, "warning", lambda msg, *args: said.append(msg % args)
    )
    return said


def test_unpatched_vllm_runs_eagerly_and_names_the_fix(warnings: list[str]) -> None:
    # The test venv's vLLM is pristine on purpose (docs/patches.md): the real check.
    report = engine.inspect_tree()
    if report.pair_problem is not None or report.applied == report.total:
        pytest.skip("needs the pristine vLLM 0.15.1 on torch 2.5.1 of the test venv")
    cfg = _config()
    graphs.apply_graph_defaults(cfg)
    cc = cfg.compilation_config
    assert (cc.mode.name, cc.cudagraph_mode.name) == ("NONE", "NONE")
    assert (cc.cudagraph_capture_sizes, cc.max_cudagraph_capture_size) == ([], 0)
    (said,) = warnings
    assert "CUDA graphs OFF, the model runs eagerly" in said
    for patch_id in graphs.COMPILE_PATCHES:
        assert patch_id in said
    assert "Fix: run `vllm-kunlun patch apply`" in said


@pytest.mark.parametrize(("tp", "pp"), [(8, 1), (1, 2)])
def test_tensor_or_pipeline_parallel_runs_eagerly(
    tp: int, pp: int, warnings: list[str]
) -> None:
    cfg = _config(tp=tp, pp=pp)
    graphs.apply_graph_defaults(cfg)
    assert cfg.compilation_config.cudagraph_mode.name == "NONE"
    (said,) = warnings
    assert f"tensor/pipeline parallel ({tp}/{pp})" in said
