"""Every runtime patch the plugin makes to vLLM or torch, declared once.

A runtime patch changes a live object (a module attribute, a class, a torch table) in
the process that runs it, never a file. The implementations live next to what they
serve (``ops/<family>/``, ``models/``, ``guards/`` ...); this table is the one list of them:
``vllm-kunlun patch status`` and the doctor print it beside the file patch set, a test
fails when a patch object exists that is not declared here (or the other way round),
and ``phases.apply_phase`` applies each entry at the phases it names, through the
``RUNTIME_PATCHES`` hook of its module.

This module imports neither vLLM nor the plugin's logger: the patch CLI must work on a
vLLM tree that does not import. States are read from modules already imported.
"""

from __future__ import annotations

import enum
import sys
from dataclasses import asdict, dataclass
from typing import Any


class Phase(enum.Enum):
    """The moments a runtime patch goes in; the value is the sentence status prints."""

    PROCESS_START = "register(), in every process vLLM starts, whatever the platform"
    PLATFORM_LOAD = (
        "the platform's constructor, in every process a vllm-kunlun platform serves"
    )
    FRONT_END = (
        "the platform's pre_register_and_update and the general plugin, in the "
        "processes that parse engine arguments"
    )
    MODEL_PROCESS = (
        "the plugin's worker, first thing in every process that builds a model "
        "whatever VLLM_PLUGINS says (and the general plugin)"
    )
    WEIGHT_LOAD = "the plugin's worker, in every process that loads a checkpoint"
    QUANTIZED_MODEL = (
        "the platform's verify_quantization, in the process that configures a "
        "quantized model"
    )
    HYBRID_MODEL = (
        "the Qwen3.5 and Qwen3-Next models' constructors, in the process that runs one"
    )
    NATIVE_KERNELS = "the platform's import_kernels, once the native extension loaded"

    @property
    def sentence(self) -> str:
        return str(self.value)


@dataclass(frozen=True)
class RuntimePatch:
    """One named runtime patch. ``targets`` go in together or not at all."""

    name: str
    module: str  # the plugin module that defines it (and its RUNTIME_PATCHES hook)
    targets: tuple[str, ...]
    why: str
    phases: tuple[Phase, ...]  # when in a process it goes in (phases.apply_phase)
    removable_when: str

    @property
    def applied_by(self) -> str:
        return "; ".join(phase.sentence for phase in self.phases)

    def to_json(self) -> dict[str, Any]:
        return {
            **asdict(self),
            "targets": list(self.targets),
            "phases": [phase.name for phase in self.phases],
            "applied_by": self.applied_by,
        }


_WORKER = (Phase.MODEL_PROCESS,)
_FRONT = (Phase.FRONT_END,)

REGISTRY: tuple[RuntimePatch, ...] = (
    RuntimePatch(
        "schema_pep585",
        "vllm_kunlun.patching.schema",
        (
            "torch._library.infer_schema.SUPPORTED_PARAM_TYPES",
            "torch._library.infer_schema.SUPPORTED_RETURN_TYPES",
        ),
        "torch 2.5.1 cannot infer custom-op schemas from list[int] / X | None: "
        "`import vllm.config` fails",
        (Phase.PROCESS_START, Phase.PLATFORM_LOAD, Phase.MODEL_PROCESS),
        "torch >= 2.6",
    ),
    RuntimePatch(
        "torch_wrap_triton",
        "vllm_kunlun.patching.wrap_triton",
        ("torch.library.wrap_triton",),
        "torch 2.5.1 lacks the name, which every quantized checkpoint's config imports",
        (Phase.PLATFORM_LOAD, Phase.MODEL_PROCESS),
        "torch >= 2.6",
    ),
    RuntimePatch(
        "kunlun_topk_topp_sampler",
        "vllm_kunlun.ops.sampling.sampler_patches",
        ("vllm.v1.sample.sampler.TopKTopPSampler",),
        "vLLM's sampler draws Tensor.exponential_ noise, CPU-only on Kunlun, and sorts "
        "the vocabulary for top-p",
        _WORKER,
        "vLLM samples without exponential_ on out-of-tree platforms",
    ),
    RuntimePatch(
        "kunlun_recovered_token_noise",
        "vllm_kunlun.ops.sampling.sampler_patches",
        ("vllm.v1.sample.rejection_sampler.sample_recovered_tokens",),
        "speculative decoding's recovered tokens use exponential_ too",
        _WORKER,
        "vLLM samples without exponential_ on out-of-tree platforms",
    ),
    RuntimePatch(
        "kunlun_rejection_tp_broadcast",
        "vllm_kunlun.ops.sampling.sampler_patches",
        ("vllm.v1.sample.rejection_sampler.rejection_sample",),
        "TP ranks must accept the same draft tokens even if device RNGs differ",
        _WORKER,
        "vLLM keeps TP ranks' sampling consistent itself",
    ),
    RuntimePatch(
        "kunlun_rejection_kernels",
        "vllm_kunlun.ops.sampling.sampler_patches",
        (
            "vllm.v1.sample.rejection_sampler.rejection_greedy_sample_kernel",
            "vllm.v1.sample.rejection_sampler.rejection_random_sample_kernel",
            "vllm.v1.sample.rejection_sampler.expand_kernel",
        ),
        "speculative decoding's verification launches Triton kernels: without a "
        "Triton driver (host emulation) the first verification step fails",
        _WORKER,
        "vLLM's rejection sampler has a non-Triton path",
    ),
    RuntimePatch(
        "rejection_allowed_token_ids",
        "vllm_kunlun.ops.sampling.rejection_mask",
        ("vllm.v1.sample.rejection_sampler.RejectionSampler.apply_logits_processors",),
        "a request with allowed_token_ids under speculative decoding kills the engine "
        "core (its draft positions are mapped to no request: masked_fill_ size "
        "mismatch) and with it the API server",
        _WORKER,
        "vLLM counts requests by num_draft_tokens in apply_logits_processors",
    ),
    RuntimePatch(
        "kunlun_int8_scaled_mm_kernel",
        "vllm_kunlun.ops.int8.int8_kernel_table_patch",
        (
            "vllm.model_executor.layers.quantization.kernels.scaled_mm."
            "_POSSIBLE_INT8_KERNELS",
        ),
        "no int8 kernel list for out-of-tree platforms: W8A8 checkpoints fail with "
        "KeyError: PlatformEnum.OOT",
        (Phase.QUANTIZED_MODEL, Phase.MODEL_PROCESS),
        "vLLM registers int8 kernels for out-of-tree platforms",
    ),
    RuntimePatch(
        "kunlun_wna16_linear_kernel",
        "vllm_kunlun.ops.int4.wna16_kernel_table_patch",
        (
            "vllm.model_executor.layers.quantization.kernels.mixed_precision."
            "_POSSIBLE_KERNELS",
        ),
        "every mixed-precision kernel needs CUDA or vllm._C: compressed-tensors "
        "W4A16 / W8A16 checkpoints fail with 'Failed to find a kernel that can "
        "implement the WNA16 linear layer'",
        (Phase.QUANTIZED_MODEL, Phase.MODEL_PROCESS),
        "vLLM lists a mixed-precision kernel for out-of-tree platforms",
    ),
    RuntimePatch(
        "kunlun_awq_linear_method",
        "vllm_kunlun.ops.int4.awq_method",
        ("vllm.model_executor.layers.quantization.awq.AWQLinearMethod",),
        "vLLM's AWQ linear method calls awq_gemm / awq_dequantize from vllm._C: "
        "every AWQ checkpoint fails at its first forward",
        (Phase.QUANTIZED_MODEL, Phase.MODEL_PROCESS),
        "vLLM's AWQ kernels run on out-of-tree platforms",
    ),
    RuntimePatch(
        "kunlun_gptq_linear_method",
        "vllm_kunlun.ops.int4.gptq_method",
        ("vllm.model_executor.layers.quantization.gptq.GPTQLinearMethod",),
        "vLLM's GPTQ linear method calls gptq_shuffle / gptq_gemm from vllm._C: "
        "every GPTQ checkpoint fails while loading",
        (Phase.QUANTIZED_MODEL, Phase.MODEL_PROCESS),
        "vLLM's GPTQ kernels run on out-of-tree platforms",
    ),
    RuntimePatch(
        "kunlun_vendor_custom_ops",
        "vllm_kunlun.ops.custom_ops",
        ("vllm.model_executor.custom_op.op_registry_oot",),
        "on an out-of-tree platform every CustomOp runs forward_native (a torch "
        "kernel per step of the formula); the vendor library has fused RMSNorm, "
        "rotary and SiLU-and-mul kernels",
        _WORKER,
        "vLLM ships Kunlun kernels for these ops",
    ),
    RuntimePatch(
        "kunlun_fused_moe",
        "vllm_kunlun.ops.moe.fused_moe_method",
        ("vllm.model_executor.custom_op.op_registry_oot",),
        "on an out-of-tree platform vLLM's FusedMoE takes the CUDA path (vllm._C "
        "routing, Triton experts), which does not run; the plugin routes and runs the "
        "experts, and refuses MoE variants it does not serve at construction",
        _WORKER,
        "vLLM's fused MoE runs on the validated torch for out-of-tree platforms",
    ),
    RuntimePatch(
        "kunlun_gdn_kernels",
        "vllm_kunlun.ops.gdn.patches",
        tuple(
            f"vllm.model_executor.models.qwen3_next.{op}"
            for op in (
                "fused_gdn_gating",
                "causal_conv1d_fn",
                "causal_conv1d_update",
                "chunk_gated_delta_rule",
                "fused_recurrent_gated_delta_rule",
            )
        ),
        "vLLM's Gated DeltaNet kernels are Triton-only; the vendor decode kernel never "
        "runs",
        (Phase.HYBRID_MODEL,),
        "vLLM routes GDN kernels through a platform hook",
    ),
    RuntimePatch(
        "kunlun_gdn_new_request_state",
        "vllm_kunlun.models.hybrid_layer_patches",
        ("vllm.v1.attention.backends.gdn_attn.GDNAttentionMetadataBuilder",),
        "a 1-token new request in a decode-only batch reads a recycled state slot",
        (Phase.HYBRID_MODEL,),
        "a vLLM that treats zero-context requests as prefills in GDN metadata",
    ),
    RuntimePatch(
        "kunlun_chunked_prefill_drafts",
        "vllm_kunlun.platforms.chunked_prefill_drafts",
        ("vllm.v1.worker.gpu_model_runner.GPUModelRunner.take_draft_token_ids",),
        "speculative drafts of a request whose prefill chunk was not its last are "
        "scheduled after its remaining prompt; the hybrid prefill path folds them "
        "into the GDN state (wrong tokens), and on every model a seeded request's "
        "draws depend on how its prompt was chunked",
        (Phase.HYBRID_MODEL, Phase.MODEL_PROCESS),
        "vLLM drafts only for requests that sampled a token",
    ),
    RuntimePatch(
        "kunlun_mamba_copy_block",
        "vllm_kunlun.ops.gdn.patches",
        (
            "vllm.v1.worker.mamba_utils.collect_mamba_copy_meta",
            "vllm.v1.worker.mamba_utils.do_mamba_copy_block",
        ),
        "prefix caching on a hybrid model copies state through Triton with "
        'device="cuda" hard-coded',
        (Phase.HYBRID_MODEL,),
        "vLLM's mamba block copy has a non-Triton path",
    ),
    RuntimePatch(
        "kunlun_qwen3_next_mtp_names",
        "vllm_kunlun.models.qwen3_next_mtp",
        ("vllm.model_executor.models.qwen3_next_mtp.Qwen3NextDecoderLayer",),
        "vLLM's Qwen3-Next MTP draft names its layer mtp.layers.0, an index the "
        "target's layer 0 holds: binding the KV caches raises NotImplementedError on "
        "an out-of-tree platform",
        (Phase.HYBRID_MODEL,),
        "vLLM names the MTP layers past the target's or binds KV caches by name",
    ),
    RuntimePatch(
        "kunlun_mamba_cache_written",
        "vllm_kunlun.models.hybrid_layer_patches",
        ("vllm.v1.core.single_type_kv_cache_manager.MambaManager.cache_blocks",),
        "prefix caching on a hybrid model lets a request in the same step hit a block "
        "whose state is not written yet (wrong tokens)",
        (Phase.FRONT_END, Phase.MODEL_PROCESS),
        "vLLM commits mamba blocks only once their state is written",
    ),
    RuntimePatch(
        "kunlun_qwen3_5_mtp_config",
        "vllm_kunlun.models.speculative_config",
        (
            "vllm.config.speculative.SpeculativeConfig.hf_config_override",
            "vllm.config.speculative.MTPModelTypes",
        ),
        "vLLM maps no Qwen3.5 model type to an MTP draft: method mtp fails with "
        "\"Unsupported speculative method: 'mtp'\"",
        _FRONT,
        "the validated vLLM maps Qwen3.5 to an MTP draft model",
    ),
    RuntimePatch(
        "transformers5_config_fields",
        "vllm_kunlun.models.text_config_compat",
        ("vllm.config.model.get_hf_text_config",),
        "transformers 5.2.0 keeps tie_word_embeddings on a composite's top level "
        "(Qwen2-VL, Qwen2.5-VL, Qwen3-VL, GLM-4V text configs lack it) and drops "
        "position_embedding_type from BERT / XLM-R configs; vLLM reads both: "
        "AttributeError at model init / engine start",
        _FRONT,
        "the validated vLLM reads tie_word_embeddings from the composite config and "
        "guards position_embedding_type",
    ),
    RuntimePatch(
        "qwen2_vl_pixel_bounds",
        "vllm_kunlun.models.qwen2_vl_pixels",
        ("vllm.model_executor.models.qwen2_vl.Qwen2VLProcessingInfo._get_vision_info",),
        "transformers 5.2.0's Qwen2-VL image processors keep min / max pixels in size "
        "and leave min_pixels / max_pixels None, which vLLM reads: Qwen2-VL and "
        "Qwen2.5-VL engines fail with a TypeError while profiling",
        (Phase.FRONT_END, Phase.MODEL_PROCESS),
        "the validated vLLM reads the Qwen2-VL image processor's size",
    ),
    RuntimePatch(
        "kunlun_ray_placement_wait",
        "vllm_kunlun.platforms.ray_patches",
        ("vllm.v1.executor.ray_utils._wait_until_pg_ready",),
        "vLLM waits 1800 s for a Ray placement group Ray cannot place (a cluster "
        "started without --num-gpus: Ray detects no Kunlun card) and only logs",
        _FRONT,
        "vLLM bounds the wait and names the missing resources",
    ),
    RuntimePatch(
        "kunlun_ray_auth_hint",
        "vllm_kunlun.platforms.ray_auth",
        ("vllm.v1.executor.ray_executor.initialize_ray_cluster",),
        "a cluster with Ray's token authentication refuses an engine whose "
        "RAY_AUTH_MODE is not token, and vLLM says only 'Failed to connect to Ray "
        "cluster'",
        _FRONT,
        "Ray's connection error names the authentication mode",
    ),
    RuntimePatch(
        "kunlun_weak_ref_tensor",
        "vllm_kunlun.patching.weak_ref",
        ("vllm.utils.torch_utils.weak_ref_tensor",),
        "graph capture calls torch.ops._C.weak_ref_tensor, and vllm._C cannot load on "
        "torch 2.5.1",
        (Phase.NATIVE_KERNELS,),
        "vllm._C loads next to the torch in use",
    ),
    RuntimePatch(
        "engine_model_path_guard",
        "vllm_kunlun.guards.model_path",
        (
            "vllm.engine.arg_utils.maybe_override_with_speculators",
            "vllm.engine.arg_utils.get_model_path",
        ),
        "a missing local model path is sent to the Hub (HFValidationError) instead of "
        "being named",
        _FRONT,
        "vLLM checks local paths before the Hub",
    ),
    RuntimePatch(
        "lora_adapter_shapes",
        "vllm_kunlun.ops.lora.adapter_check",
        ("vllm.lora.worker_manager.WorkerLoRAManager._load_adapter",),
        "vLLM loads a LoRA adapter whose shapes do not fit the model: a narrower one "
        "serves wrong output, a wider one fails with a bare size mismatch",
        _WORKER,
        "vLLM checks adapter shapes at load",
    ),
    RuntimePatch(
        "engine_checkpoint_guard",
        "vllm_kunlun.guards.checkpoint",
        (
            "vllm.model_executor.model_loader.default_loader.DefaultModelLoader."
            "load_weights",
        ),
        "a quantized checkpoint missing a tensor loads silently (vLLM checks "
        "completeness only for unquantized models) and the weight loaders cut an "
        "oversize tensor to fit",
        (Phase.WEIGHT_LOAD,),
        "vLLM checks loaded shapes and quantized models' completeness",
    ),
    RuntimePatch(
        "engine_token_id_guard",
        "vllm_kunlun.guards.token_ids",
        ("vllm.v1.engine.input_processor.InputProcessor._validate_model_input",),
        "an out-of-vocabulary prompt token id kills the engine instead of one request",
        _FRONT,
        "vLLM checks both bounds of prompt token ids",
    ),
    RuntimePatch(
        "engine_request_limits",
        "vllm_kunlun.guards.request_limits",
        ("vllm.v1.engine.input_processor.InputProcessor.process_inputs",),
        "n is unbounded (n=1e9 fans out until the OOM killer ends the engine core), "
        "NaN / inf temperature passes and samples token 0, an integer beyond int64 "
        "is a 500 with an empty message",
        _FRONT,
        "vLLM bounds n and refuses non-finite or unencodable sampling parameters",
    ),
    RuntimePatch(
        "openai_json_object_body",
        "vllm_kunlun.guards.request_limits",
        ("vllm.entrypoints.openai.api_server.build_app",),
        "a JSON body that is not an object ([1,2,3], null) is a 500 and a dropped "
        "keep-alive connection",
        _FRONT,
        "vLLM answers a non-object request body with 400",
    ),
    RuntimePatch(
        "sync_client_engine_death",
        "vllm_kunlun.guards.engine_death",
        (
            "vllm.v1.engine.core_client.SyncMPClient.get_output",
            "vllm.v1.engine.core_client.SyncMPClient.call_utility",
        ),
        "an offline LLM (the demo) whose engine core process dies waits for ever: "
        "the client's monitor stops the thread that would wake its waiters",
        _FRONT,
        "vLLM's sync client wakes its waiters when the engine dies",
    ),
    RuntimePatch(
        "client_engine_start_death",
        "vllm_kunlun.guards.engine_start_death",
        (
            "vllm.v1.engine.core_client.launch_core_engines",
            "vllm.v1.engine.core_client.MPClient.start_engine_core_monitor",
        ),
        "an engine core that dies after its startup handshake but before the client "
        "binds its input socket leaves LLM (the demo) and vllm serve waiting "
        "VLLM_ENGINE_READY_TIMEOUT_S (600 s) for a message that died with it",
        _FRONT,
        "vLLM's client checks the engine processes while it waits for them",
    ),
    RuntimePatch(
        "openai_error_status",
        "vllm_kunlun.guards.error_status",
        ("vllm.entrypoints.openai.api_server.build_app",),
        "the chat and completion routes return the error their handler raised as a "
        "body with HTTP status 200 (an unreachable image URL, a dead engine)",
        _FRONT,
        "vLLM's routes answer errors with their status",
    ),
    RuntimePatch(
        "openai_served_config",
        "vllm_kunlun.guards.served_config",
        ("vllm.entrypoints.openai.api_server.build_app",),
        "a client cannot ask the server what dtype and quantization it serves "
        "(/server_info only in dev mode): vllm-kunlun accuracy would judge a float "
        "model served under a W8A8 checkpoint's name by the checkpoint",
        _FRONT,
        "vLLM's API reports the served dtype and quantization",
    ),
    RuntimePatch(
        "image_decode_check",
        "vllm_kunlun.guards.media",
        (
            "vllm.multimodal.media.image.ImageMediaIO.load_bytes",
            "vllm.multimodal.media.image.ImageMediaIO.load_file",
        ),
        "an image whose bytes do not decode (truncated, corrupt) passes the request "
        "parser and fails in the multimodal processor: a 500 instead of a 400",
        _FRONT,
        "vLLM decodes images while it parses a request",
    ),
    RuntimePatch(
        "speculative_config_limits",
        "vllm_kunlun.guards.speculative_limits",
        ("vllm.engine.arg_utils.EngineArgs.create_speculative_config",),
        "num_speculative_tokens=1e9 grows the API server without bound (an O(N^2) "
        "token tree) before any engine starts; a non-object config is an "
        "AttributeError",
        _FRONT,
        "vLLM bounds num_speculative_tokens and checks the config's type",
    ),
    RuntimePatch(
        "media_input_checks",
        "vllm_kunlun.guards.media_inputs",
        (
            "vllm.multimodal.utils.MediaConnector._load_data_url",
            "vllm.multimodal.media.video.VideoMediaIO.load_base64",
            "vllm.multimodal.media.video.VideoMediaIO.load_bytes",
            "vllm.multimodal.processing.context.InputProcessingContext."
            "call_hf_processor",
        ),
        "a data URL without ';base64', a video/jpeg frame list or a picture sent as "
        "video_url fails with an error that names nothing the client sent (some as "
        "500s); an image the model's processor refuses (1 x 100000 pixels) is a 400 "
        "that drops the processor's reason",
        _FRONT,
        "vLLM validates data URLs and video inputs while it parses a request",
    ),
    RuntimePatch(
        "media_fetch_limit",
        "vllm_kunlun.guards.media",
        (
            "vllm.connections.HTTPConnection.get_bytes",
            "vllm.connections.HTTPConnection.async_get_bytes",
        ),
        "an image or video URL's body is read whole into the API server, whatever "
        "its size (1.5 GB within the 5 s fetch timeout, kept as resident memory)",
        _FRONT,
        "vLLM bounds the size of a media download",
    ),
    RuntimePatch(
        "grammar_error_cause",
        "vllm_kunlun.guards.grammar_errors",
        ("vllm.v1.engine.input_processor.validate_xgrammar_grammar",),
        "a bad EBNF grammar or a schema that is not JSON is a 400 saying only "
        "'Invalid grammar specification.' (xgrammar's reason is dropped)",
        _FRONT,
        "vLLM's messages carry xgrammar's reason",
    ),
    RuntimePatch(
        "guided_fields_refused",
        "vllm_kunlun.guards.guided_fields",
        (
            "vllm.entrypoints.openai.chat_completion.serving."
            "OpenAIServingChat.create_chat_completion",
            "vllm.entrypoints.openai.completion.serving."
            "OpenAIServingCompletion.create_completion",
        ),
        "guided_json / guided_regex / guided_choice / guided_grammar are ignored "
        "with only a warning: the request is served unconstrained",
        _FRONT,
        "vLLM refuses the removed guided_* fields itself",
    ),
    RuntimePatch(
        "completion_context_length",
        "vllm_kunlun.guards.completion_context",
        (
            "vllm.entrypoints.openai.completion.serving."
            "OpenAIServingCompletion.render_completion_request",
        ),
        "a completion whose prompt plus max_tokens does not fit is refused as "
        "'maximum context length is <max_model_len - max_tokens>', naming neither "
        "max_tokens nor its default (read as MTP drafts counted against the prompt)",
        _FRONT,
        "vLLM's completion route names max_tokens in its context-length message",
    ),
    RuntimePatch(
        "strict_json_strings",
        "vllm_kunlun.ops.structured.json_strings",
        ("vllm.v1.structured_output.backend_xgrammar.XgrammarBackend.compile_grammar",),
        "xgrammar 0.1.29 lets raw control characters (and, through a pattern's '.', "
        "quotes and backslashes) into length-bounded JSON strings, and bounded "
        "integers out of their range (maximum 120 lets 121-129 through): json_schema "
        "answers that strict JSON parsers reject or that fail their schema",
        (Phase.FRONT_END, Phase.MODEL_PROCESS),
        "the pinned xgrammar's string rules exclude control characters",
    ),
    RuntimePatch(
        "serve_shutdown_bound",
        "vllm_kunlun.guards.shutdown",
        ("vllm.entrypoints.openai.api_server.serve_http",),
        "on SIGINT / SIGTERM in-flight requests wait forever on the stopped engine and "
        "uvicorn waits for their clients to give up (minutes); a second Ctrl-C does "
        "nothing",
        _FRONT,
        "vLLM fails in-flight requests on shutdown and bounds its graceful wait",
    ),
)

BY_NAME = {p.name: p for p in REGISTRY}
TORCH_FIXES = ("schema_pep585", "torch_wrap_triton")
# Entries that change a table rather than an attribute: no AttributePatch object.
NOT_ATTRIBUTES = ("schema_pep585", "kunlun_vendor_custom_ops", "kunlun_fused_moe")


def live_patches(entry: RuntimePatch) -> list[Any]:
    """The ``AttributePatch`` objects of ``entry`` in its (already imported) module."""
    from vllm_kunlun.patching.attribute import AttributePatch

    module = sys.modules.get(entry.module)
    found: list[Any] = []
    for value in vars(module).values() if module is not None else ():
        items = value if isinstance(value, tuple) else (value,)
        found += [
            p for p in items if isinstance(p, AttributePatch) and p.name == entry.name
        ]
    return found


def state(entry: RuntimePatch) -> str:
    """One line: whether it is in effect in this process, or when it will be."""
    if entry.name in TORCH_FIXES:  # these know whether this torch needs them
        return torch_fix_states()[entry.name]
    patches = live_patches(entry)
    if patches and all(p.applied() for p in patches):
        return "applied in this process"
    return f"applied by {entry.applied_by}"


def states() -> dict[str, str]:
    return {entry.name: state(entry) for entry in REGISTRY}


def torch_fix_states() -> dict[str, str]:
    """The torch-level fixes (needed or not on this torch, applied, or why they
    cannot be), which the doctor and ``patch status`` can judge outside an engine."""
    from vllm_kunlun.patching import schema, wrap_triton

    return {schema.NAME: schema.state(), wrap_triton.NAME: wrap_triton.state()}


def describe() -> list[dict[str, Any]]:
    """The registry with each patch's state, for ``--json`` and the doctor."""
    return [{**entry.to_json(), "state": state(entry)} for entry in REGISTRY]
