"""benchmarks/decode.py: the engines it compares, its arithmetic and its refusals.

The benchmark itself starts engines for minutes; these tests check what decides
whether its numbers mean what its table says.
"""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

import pytest

from tests.conftest import REPO, load_benchmark


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    return load_benchmark("decode")


def test_defaults_are_the_logs_shape(bench: ModuleType) -> None:
    args = bench.parse_args([])
    assert (args.num_seqs, args.device) == (256, "cpu")
    assert args.output_len > 4 * args.prompt_len  # decode-dominated
    assert bench.VOCAB == 151_936


def test_cpu_compares_our_sampler_with_vllms_in_emulation(bench: ModuleType) -> None:
    ours, native = bench.engines(bench.parse_args(["--num-seqs", "32"]))
    assert (ours.name, ours.sampler, native.name, native.sampler) == (
        "ours",
        "ours",
        "native",
        "native",
    )
    for e in (ours, native):
        assert e.env["VLLM_KUNLUN_HOST_EMULATION"] == "1"
        assert e.llm["max_num_seqs"] == 32 and e.graphs is False
    # The same environment: the plugin's worker installs our sampler in every model
    # process, so the native engine's child swaps vLLM's back in (a worker extension
    # method), and check_served refuses the run if that did not happen.
    assert ours.env == native.env and "VLLM_PLUGINS" not in native.env
    args = bench.parse_args([])
    assert bench.child_spec(native, args, "m")["vllm_sampler"] is True
    assert bench.child_spec(ours, args, "m")["vllm_sampler"] is False


def test_the_native_engine_worker_gets_vllms_sampler_back() -> None:
    """The worker-extension method the native engine's child calls: the worker's
    sampler, built with ours as the patched worker builds it, samples with vLLM's own
    TopKTopPSampler afterwards, and the method says which forward that is."""
    from types import SimpleNamespace

    from vllm.v1.sample.ops.topk_topp_sampler import TopKTopPSampler
    from vllm.v1.sample.sampler import Sampler

    from vllm_kunlun.demo.serving_info import ServingInfo
    from vllm_kunlun.ops.sampling.topk_topp import KunlunTopKTopPSampler

    sampler = Sampler()
    sampler.topk_topp_sampler = KunlunTopKTopPSampler()
    worker = SimpleNamespace(model_runner=SimpleNamespace(sampler=sampler))
    forward = ServingInfo.vllm_kunlun_use_vllm_sampler(worker)  # type: ignore[arg-type]
    assert type(sampler.topk_topp_sampler) is TopKTopPSampler
    method = sampler.topk_topp_sampler.forward.__func__
    assert forward == f"{method.__module__}.{method.__qualname__}"
    assert forward.startswith("vllm.v1.sample.ops.topk_topp_sampler.TopKTopPSampler.")


def test_cuda_compares_graphs_with_eager_on_kunlun_platform(bench: ModuleType) -> None:
    graphs, eager = bench.engines(bench.parse_args(["--device", "cuda"]))
    assert (graphs.graphs, graphs.llm["enforce_eager"]) == (True, False)
    assert (eager.graphs, eager.llm["enforce_eager"]) == (False, True)
    for e in (graphs, eager):
        assert e.sampler == "ours"
        assert e.env["FAKE_XMLIR_DEVICES"] == "1"  # KunlunPlatform, not CudaPlatform
        assert str(REPO / "tests" / "fakes") in e.env["PYTHONPATH"].split(":")
        assert "VLLM_KUNLUN_HOST_EMULATION" not in e.env


def test_summary_takes_prefill_out_of_the_decode_step(bench: ModuleType) -> None:
    got = bench.summarize([1.0, 1.2, 5.0], [10.0, 11.0, 30.0], 256, 64)
    assert got["t1_s"] == 1.2 and got["t_s"] == 11.0  # medians
    assert got["output_tok_s"] == pytest.approx(256 * 64 / 11.0)
    assert got["decode_ms_per_step"] == pytest.approx(1000 * 9.8 / 63)


def _info(forward: str, captured: int = 0) -> dict:
    return {
        "topk_topp_forward": forward,
        "cudagraphs_captured": captured,
        "cudagraph_mode": "PIECEWISE" if captured else "NONE",
    }


def test_results_from_the_wrong_sampler_are_refused(bench: ModuleType) -> None:
    ours, native = bench.engines(bench.parse_args([]))
    bench.check_served(ours, _info(bench.OURS_FORWARD))
    bench.check_served(native, _info(bench.NATIVE_FORWARD))
    with pytest.raises(RuntimeError, match="would be meaningless"):
        bench.check_served(native, _info(bench.OURS_FORWARD))
    with pytest.raises(RuntimeError, match="would be meaningless"):
        bench.check_served(ours, _info(bench.NATIVE_FORWARD))


def test_a_graph_engine_without_graphs_is_refused(bench: ModuleType) -> None:
    graphs, eager = bench.engines(bench.parse_args(["--device", "cuda"]))
    bench.check_served(graphs, _info(bench.OURS_FORWARD, captured=35))
    with pytest.raises(RuntimeError, match="vllm-kunlun patch apply"):
        bench.check_served(graphs, _info(bench.OURS_FORWARD, captured=0))
    with pytest.raises(RuntimeError, match="graphs captured"):
        bench.check_served(eager, _info(bench.OURS_FORWARD, captured=3))


def test_table_ratios_are_against_the_baseline(bench: ModuleType) -> None:
    row = {"sampler": "ours", "graphs": False, "num_seqs": 256, "prompt_len": 8}
    rows = [
        {**row, "engine": "ours", "output_len": 64, "output_tok_s": 300.0,
         "decode_ms_per_step": 800.0},
        {**row, "engine": "native", "output_len": 64, "output_tok_s": 100.0,
         "decode_ms_per_step": 2500.0},
    ]  # fmt: skip
    lines = bench.table(rows, baseline="native").splitlines()
    assert "vs native" in lines[0]
    assert lines[2].endswith("| 300.0 | 800.0 | 3.00x |")
    assert lines[3].endswith("| 100.0 | 2500.0 | 1.00x |")


def test_prompts_are_distinct_and_short(bench: ModuleType) -> None:
    texts = bench.prompts(256, 8)
    assert len(set(texts)) == 256
    assert {len(t.split()) for t in texts} == {8}


def test_the_tiny_model_has_the_real_vocabulary(
    bench: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import json

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    model = Path(bench.model_dir(bench.parse_args([])))
    assert model.parent == tmp_path / "vllm-kunlun"
    assert json.loads((model / "config.json").read_text())["vocab_size"] == 151_936


def test_spec_mtp_compares_1_2_3_speculative_tokens_with_none(
    bench: ModuleType,
) -> None:
    args = bench.parse_args(["--spec", "mtp"])
    assert (args.num_seqs, args.prompt_len) == (4, 16)
    names = [e.name for e in bench.engines(args)]
    assert names == ["mtp1", "mtp2", "mtp3", "none"]  # the baseline is last
    *spec, none = bench.engines(args)
    assert [e.llm["speculative_config"] for e in spec] == [
        {"method": "mtp", "num_speculative_tokens": n} for n in (1, 2, 3)
    ]
    assert "speculative_config" not in none.llm
    assert all(e.llm["disable_log_stats"] is False for e in bench.engines(args))
    child = bench.child_spec(spec[0], args, "/m")
    assert child["language"] is True and child["sampling"] == {"temperature": 0.0}


def test_spec_on_a_device_is_refused(
    bench: ModuleType, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit):
        bench.parse_args(["--spec", "mtp", "--device", "cuda"])
    assert "host emulation" in capsys.readouterr().err


def test_acceptance_comes_from_vllms_counters(bench: ModuleType) -> None:
    metrics = {
        "vllm:spec_decode_num_drafts": 10,
        "vllm:spec_decode_num_draft_tokens": 30,
        "vllm:spec_decode_num_accepted_tokens": 24,
    }
    got = bench.acceptance(metrics)
    assert got == {"acceptance_rate": 0.8, "mean_accepted_length": 3.4}
    assert bench.acceptance({}) is None
    row = {"graphs": False, "sampler": "ours", "num_seqs": 4, "prompt_len": 16}
    rows = [
        {**row, "engine": "mtp3", "output_len": 64, "output_tok_s": 30.0,
         "num_speculative_tokens": 3, **got},
        {**row, "engine": "none", "output_len": 64, "output_tok_s": 20.0},
    ]  # fmt: skip
    lines = bench.table(rows, baseline="none").splitlines()
    assert lines[2].endswith("| 30.0 | 80% | 3.40 | 1.50x |")
    assert lines[3].endswith("| 20.0 | - | - | 1.00x |")
