"""The worker and model runner host emulation runs: vLLM's CPU ones, two facts adapted.

Why, each measured on vLLM 0.15.1 + torch 2.5.1 without ``vllm._C``:
- ``CPUWorker.init_device`` binds OpenMP threads through
  ``torch.ops._C_utils.init_cpu_threads_env`` (a ``vllm._C`` op) unless
  ``VLLM_CPU_OMP_THREADS_BIND=nobind``: ours never binds.
- When a request's sampled token is discarded (a chunk of a prefill that is not the
  last one), ``GPUModelRunner._bookkeeping_sync`` rewinds the request's generator with
  ``gen.set_offset(gen.get_offset() - 4)``, which only a CUDA (Philox) generator has: a
  seeded request with chunked prefill crashes on the CPU ("CPU Generator does not use
  offset"). Ours saves the generator state before sampling and restores it instead, so
  a seeded request draws the same tokens however its prompt was chunked.
- ``CPUModelRunner.__init__`` asserts ``speculative_config is None`` ("spec decode is
  not supported"). Nothing else in it is CUDA-bound for EAGLE/MTP drafting with the
  unpadded drafter batch (an emulation default: the padded one prepares its inputs
  with Triton) once the rejection sampler's kernels run in torch
  (``kunlun_rejection_kernels``) and the GDN kernels take the speculative layout
  (``ops/gdn``). Ours runs the same constructor steps without the assertion; the
  drafter's buffers are CPU tensors already (it is built with the CPU device), and
  ``load_model`` loads the drafter after the target as ``GPUModelRunner``'s does
  (``CPUModelRunner``'s loads the target only), and the drafts are copied to the
  host synchronously (vLLM copies them on a side CUDA stream).
Like ``KunlunWorker`` it applies the runtime fixes and registers the plugin's models in
the process that builds the model (``runtime_fixes.prepare_model_process``).
Selected by the emulation platform as ``worker_cls``; removal: when vLLM's CPU runner
handles CPU generators itself.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import torch
from vllm.config import VllmConfig
from vllm.v1.worker.cpu_model_runner import CPUModelRunner, _torch_cuda_wrapper
from vllm.v1.worker.cpu_worker import CPUWorker
from vllm.v1.worker.gpu_model_runner import GPUModelRunner

from vllm_kunlun.platforms.runtime_fixes import prepare_model_process


class EmulationModelRunner(CPUModelRunner):
    _discarded_generator_states: dict[int, torch.Tensor]

    def __init__(self, vllm_config: VllmConfig, device: torch.device) -> None:
        # CPUModelRunner.__init__ minus its speculative-decoding assertion.
        with _torch_cuda_wrapper():
            GPUModelRunner.__init__(self, vllm_config, device)
        assert device == torch.device("cpu")
        self.use_cuda_graph = False
        self.cascade_attn_enabled = False
        self._postprocess_tensors()

    def load_model(self, eep_scale_up: bool = False) -> None:
        # CPUModelRunner.load_model loads the target only; GPUModelRunner's also loads
        # the speculative drafter (sharing the target's embedding and lm_head).
        super().load_model(eep_scale_up)
        drafter = getattr(self, "drafter", None)
        if drafter is not None and hasattr(drafter, "load_model"):
            drafter.load_model(self.model)

    def _copy_draft_token_ids_to_cpu(
        self, scheduler_output: Any, zeros_only: bool = False
    ) -> None:
        # GPUModelRunner's copies on a side CUDA stream (torch.cuda.current_stream:
        # "Found no NVIDIA driver"); on the CPU the copy is synchronous. Emulation
        # schedules synchronously, so the drafts are always needed here.
        self._draft_token_req_ids = self.input_batch.req_ids.copy()
        draft_token_ids = self._draft_token_ids
        if not torch.is_tensor(draft_token_ids):
            return
        assert self.draft_token_ids_cpu is not None
        num_reqs = draft_token_ids.shape[0]
        if zeros_only:
            self.draft_token_ids_cpu[:num_reqs] = 0
        else:
            self.draft_token_ids_cpu[:num_reqs].copy_(draft_token_ids)

    def _sample(self, *args: Any, **kwargs: Any) -> Any:
        num_reqs = self.input_batch.num_reqs
        discarded = np.nonzero(self.discard_request_mask.np[:num_reqs])[0]
        generators = self.input_batch.generators
        self._discarded_generator_states = {
            int(i): generators[int(i)].get_state()
            for i in discarded
            if int(i) in generators
        }
        return super()._sample(*args, **kwargs)

    def _bookkeeping_sync(self, *args: Any, **kwargs: Any) -> Any:
        generators = self.input_batch.generators
        saved = getattr(self, "_discarded_generator_states", {})
        # Rewind by state, and keep these generators out of vLLM's offset rewind.
        hidden = {}
        for i, state in saved.items():
            gen = generators.pop(i)
            gen.set_state(state)
            hidden[i] = gen
        try:
            return super()._bookkeeping_sync(*args, **kwargs)
        finally:
            generators.update(hidden)
            self._discarded_generator_states = {}


class EmulationWorker(CPUWorker):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        prepare_model_process(loads_weights=True)
        super().__init__(*args, **kwargs)

    def init_device(self) -> None:
        from vllm.platforms import current_platform
        from vllm.utils.torch_utils import set_random_seed
        from vllm.v1.worker.gpu_worker import init_worker_distributed_environment

        # What CPUWorker.init_device does, without the OpenMP binding (vllm._C); and
        # the device vLLM's Ray worker wrapper asserts before each step.
        self.device = torch.device("cpu")
        os.environ["VLLM_DIST_IDENT"] = self.distributed_init_method.split(":")[-1]
        init_worker_distributed_environment(
            self.vllm_config,
            self.rank,
            self.distributed_init_method,
            self.local_rank,
            current_platform.dist_backend,
        )
        set_random_seed(self.model_config.seed)
        self.model_runner = EmulationModelRunner(self.vllm_config, torch.device("cpu"))
