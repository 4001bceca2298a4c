"""Graph capture on KunlunPlatform: piecewise CUDA graphs around attention.

Why: decode at high concurrency is launch-bound. Without graphs vLLM runs every decode
step eagerly, one kernel launch at a time; with them each step replays a few captured
graphs. Kunlun's torch runs in CUDA-compatibility mode, so vLLM's own
``CUDAGraphWrapper`` captures there.
How (``apply_graph_defaults``, from ``KunlunPlatform._defaults_last`` in
``check_and_update_config``; every decision is logged with its reason):
* vLLM compiles the model (``VLLM_COMPILE``) with the ``eager`` backend (Dynamo only,
  no Inductor: its Triton code generation is not validated on torch 2.5.1 on Kunlun)
  and splits the graph at attention (vLLM's default splitting ops; the platform
  registers attention as one opaque op). The pieces between attention calls are
  captured (``PIECEWISE``); attention runs eagerly between them. Modes with full
  graphs would capture attention kernels too, which nobody has validated on P800:
  they become ``PIECEWISE``.
* Capture sizes: 1, 2, 4, then every multiple of 8 up to the largest decode batch
  (``max_num_seqs`` x tokens per decode step), that batch included. vLLM's generic
  default goes to twice that (512 graphs' worth of sizes for 256 sequences) for mixed
  batches, which cost capture time and graph memory without helping decode. Sizes the
  user gave are kept.
* Graphs stay off, and the model is not compiled, when they cannot work: the
  patch_torch251 set (torch.compile on torch 2.5.1) is not applied, the native
  ``weak_ref_tensor`` op is missing, or tensor / pipeline parallel is on (vLLM's
  capture context requires its NVIDIA communicator there). The engine then starts
  eagerly and the warning names the fix, instead of failing during compilation or
  capture. ``--enforce-eager`` turns everything off as in vLLM.
Removal: when vLLM's defaults fit Kunlun (graph-capable communicator, a compile stack
validated on the vendor torch).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from vllm_kunlun.logger import init_logger
from vllm_kunlun.platforms.kunlun_defaults import _set
from vllm_kunlun.versions import install_hint

if TYPE_CHECKING:
    from vllm.config import CompilationConfig, VllmConfig

logger = init_logger(__name__)

COMPILE_BACKEND = "eager"
# patch_torch251 entries torch.compile needs on torch 2.5.1 (docs/patches.md); Inductor
# also needs INDUCTOR_PATCH.
COMPILE_PATCHES = (
    "01-compile-inline-call-hook",
    "02-attention-output-shape",
    "03-piecewise-autograd-cache-option",
    "06-compile-guard-filter-option",
)
INDUCTOR_PATCH = "04-inductor-autograd-cache-option"
PATCH_FIX = "run `vllm-kunlun patch apply` in this environment"


def capture_sizes(
    max_num_seqs: int, decode_query_len: int, max_num_batched_tokens: int
) -> list[int]:
    """1, 2, 4, multiples of 8, and the largest decode batch itself (ascending)."""
    top = max(1, min(max_num_seqs * decode_query_len, max_num_batched_tokens))
    sizes = [s for s in (1, 2, 4) if s <= top] + list(range(8, top + 1, 8))
    if sizes[-1] != top:
        sizes.append(top)
    return sizes


def vllm_default_capture_sizes(
    max_num_seqs: int, decode_query_len: int, max_num_batched_tokens: int
) -> list[int]:
    """The sizes vLLM 0.15.1 picks when the user gives none
    (``VllmConfig._set_cudagraph_sizes``; a test compares against vLLM itself)."""
    top = min(max_num_seqs * decode_query_len * 2, 512, max_num_batched_tokens)
    sizes = [s for s in (1, 2, 4) if s <= top]
    if top >= 8:
        sizes += list(range(8, min(top + 1, 256), 8))
    if top >= 256:
        sizes += list(range(256, top + 1, 16))
    return sizes


def missing_patches(
    backend: str, *, inspect: Any = None, torch_version: str | None = None
) -> tuple[list[str], str | None]:
    """(patch ids torch.compile needs that are not applied, why they could not be
    checked). Empty when the installed vLLM / torch pair is not the set's: other
    pairs do not need it (the version guard reports unvalidated stacks)."""
    from vllm_kunlun.file_patches import engine

    needed = [*COMPILE_PATCHES, *([INDUCTOR_PATCH] if backend == "inductor" else [])]
    try:
        report = (inspect or engine.inspect_tree)(torch_version=torch_version)
    except Exception as exc:  # no readable patch set: cannot tell, so not safe
        return needed, f"the patch set could not be checked ({exc})"
    if report.pair_problem is not None:
        return [], None
    states = {p.id: p.state for p in report.patches}
    return [p for p in needed if states.get(p) != engine.APPLIED], None


def blocker(vllm_config: VllmConfig) -> tuple[str, str] | None:
    """(why graphs cannot run, the fix), or None when nothing stands in the way."""
    from vllm_kunlun.ops import native
    from vllm_kunlun.patching import weak_ref

    parallel = vllm_config.parallel_config
    if parallel.tensor_parallel_size > 1 or parallel.pipeline_parallel_size > 1:
        return (
            f"tensor/pipeline parallel ({parallel.tensor_parallel_size}/"
            f"{parallel.pipeline_parallel_size}): vLLM 0.15.1's graph capture asserts "
            "its NVIDIA CudaCommunicator for groups of more than one rank, which "
            "cannot run on Kunlun, and collectives inside captured graphs are not "
            "validated on P800",
            "none yet for TP/PP > 1 (graphs are used with TP = PP = 1)",
        )
    backend = vllm_config.compilation_config.backend
    missing, unknown = missing_patches(backend)
    if missing:
        why = unknown or "patch_torch251 is not fully applied"
        return (
            f"{why}; torch.compile on torch 2.5.1 needs {', '.join(missing)}",
            PATCH_FIX,
        )
    loaded, line = native.status()
    if not loaded:
        return (
            "the native op torch.ops.vllm_kunlun.weak_ref_tensor is missing (vLLM's "
            "graph wrapper needs it)",
            line,
        )
    problem = weak_ref.PATCH.mismatch()
    if problem is not None:
        return (
            f"runtime patch {weak_ref.NAME} cannot apply: {problem}",
            install_hint("vllm") + " (the validated version)",
        )
    return None


def run_eager(compilation: CompilationConfig, why: str) -> None:
    """No compilation and no graphs (``--enforce-eager``'s settings), logged once."""
    from vllm.config import CompilationMode, CUDAGraphMode

    _set(compilation, "mode", CompilationMode.NONE, why)
    _set(compilation, "cudagraph_mode", CUDAGraphMode.NONE, why)
    _set(compilation, "cudagraph_capture_sizes", [], why)
    _set(compilation, "max_cudagraph_capture_size", 0, why)


def apply_graph_defaults(vllm_config: VllmConfig) -> None:
    from vllm.config import CompilationMode, CUDAGraphMode

    compilation = vllm_config.compilation_config
    model = vllm_config.model_config
    if model is not None and model.enforce_eager:
        logger.info("vllm-kunlun: graphs off: --enforce-eager")
        return
    if compilation.mode != CompilationMode.VLLM_COMPILE:
        logger.info(
            "vllm-kunlun: graphs off: compilation mode %s (piecewise graphs need "
            "VLLM_COMPILE)",
            compilation.mode,
        )
        return
    found = blocker(vllm_config)
    if found is not None:
        why, fix = found
        logger.warning(
            "vllm-kunlun: CUDA graphs OFF, the model runs eagerly (slower decode): "
            "%s. Fix: %s.",
            why,
            fix,
        )
        run_eager(compilation, "graphs cannot run here (see the warning above)")
        return
    if compilation.backend == "inductor":
        logger.warning_once(
            "vllm-kunlun: compile backend inductor as asked; it is not validated on "
            "Kunlun (the platform default is %s)",
            COMPILE_BACKEND,
        )
    mode = compilation.cudagraph_mode
    if mode is not None and mode.has_full_cudagraphs():
        _set(
            compilation,
            "cudagraph_mode",
            CUDAGraphMode.PIECEWISE,
            "full graphs would capture attention kernels, not validated on P800; "
            "attention runs eagerly between piecewise graphs",
        )
    _set_capture_sizes(vllm_config)
    logger.info(
        "vllm-kunlun: CUDA graphs %s, compile backend %s, %d capture sizes (%s)",
        compilation.cudagraph_mode.name,
        compilation.backend,
        len(compilation.cudagraph_capture_sizes or []),
        _span(compilation.cudagraph_capture_sizes or []),
    )


def _set_capture_sizes(vllm_config: VllmConfig) -> None:
    compilation = vllm_config.compilation_config
    if compilation.cudagraph_mode.name == "NONE":
        return
    scheduler = vllm_config.scheduler_config
    spec = vllm_config.speculative_config
    query_len = 1 + ((spec.num_speculative_tokens or 0) if spec else 0)
    shape = (scheduler.max_num_seqs, query_len, scheduler.max_num_batched_tokens)
    if compilation.cudagraph_capture_sizes != vllm_default_capture_sizes(*shape):
        return  # the user's sizes (or max size)
    sizes = capture_sizes(*shape)
    why = (
        f"decode batches go up to {shape[0]} sequences x {query_len} token(s); larger "
        "graphs cost capture time and memory without helping decode"
    )
    _set(compilation, "cudagraph_capture_sizes", sizes, why)
    _set(compilation, "max_cudagraph_capture_size", sizes[-1], why)
    compilation.post_init_cudagraph_sizes()


def _span(sizes: list[int]) -> str:
    return f"{sizes[0]}..{sizes[-1]}" if sizes else "none"
