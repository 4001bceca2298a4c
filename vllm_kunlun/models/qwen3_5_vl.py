"""Qwen3.5 vision-language composite: images and videos through vLLM 0.15.1.

Why: every Qwen3.5 checkpoint (``Qwen3_5ForConditionalGeneration``) carries a vision
tower; vLLM 0.15.1 has no Qwen3.5 model, and the plugin's text path alone refuses image
requests.

How, argued from transformers 5.2.0 (``models/qwen3_5/modeling_qwen3_5.py``) against
vLLM 0.15.1 (``model_executor/models/qwen3_vl.py``); docs/models.md has the details:
- the vision tower (``Qwen3_5VisionModel``) is Qwen3-VL's without deepstack: the same
  patch embedding (Conv3d over 2 frames), interpolated learned position table, 2-D
  rotary over (row, column) of each patch, pre-norm LayerNorm blocks with a fused
  ``qkv`` and an fc1/fc2 MLP, and one 2x2 patch merger. vLLM's
  ``Qwen3_VisionTransformer`` is reused with an empty ``deepstack_visual_indexes``
  (Qwen3.5's vision config has no such field and transformers uses no deepstack
  features); weights keep the checkpoint's names under ``model.visual.*``;
- the processors are transformers' ``Qwen3VLProcessor`` (``Qwen2VLImageProcessorFast``,
  ``Qwen3VLVideoProcessor``), which is what ``AutoProcessor`` builds for
  ``model_type`` ``qwen3_5``; vLLM's Qwen3-VL processing info, dummy inputs and
  multimodal processor are reused, the info without its ``Qwen3VLConfig`` type check;
- the language model is the plugin's Qwen3.5 hybrid (``models/qwen3_5.py``); image and
  video embeddings replace the placeholder tokens' embeddings;
- M-RoPE positions as transformers' ``get_rope_index``: text advances all three rows
  together; an image (and each video frame, which Qwen3.5 separates by timestamps)
  takes (t, row, column) of its merged grid from the position after the text before
  it; the text after resumes at one past the largest position used.
Not served (refused with the reason): vLLM's multimodal pruning (EVS).

Removal: when the validated vLLM ships a Qwen3.5 implementation that runs here.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from vllm.config import VllmConfig
from vllm.model_executor.models.interfaces import (
    MultiModalEmbeddings,
    SupportsMultiModal,
)
from vllm.model_executor.models.qwen3_vl import (
    Qwen3_VisionTransformer,
    Qwen3VLDummyInputsBuilder,
    Qwen3VLForConditionalGeneration,
    Qwen3VLMultiModalProcessor,
    Qwen3VLProcessingInfo,
)
from vllm.model_executor.models.utils import (
    StageMissingLayer,
    WeightsMapper,
    maybe_prefix,
)
from vllm.multimodal import MULTIMODAL_REGISTRY

from vllm_kunlun.logger import init_logger
from vllm_kunlun.models.qwen3_5 import Qwen3_5ForCausalLM
from vllm_kunlun.models.qwen3_5_moe import Qwen3_5MoeForCausalLM

if TYPE_CHECKING:
    from vllm.multimodal.inputs import MultiModalFeatureSpec

logger = init_logger(__name__)

_VL = Qwen3VLForConditionalGeneration
_VISUAL_PREFIXES = ("model.visual.", "visual.")


class Qwen3_5VLProcessingInfo(Qwen3VLProcessingInfo):
    """vLLM's Qwen3-VL processing info for a ``Qwen3_5Config`` (or the MoE's): the
    same fields (``vision_config``, the vision token ids), another config class."""

    def get_hf_config(self) -> Any:
        return self.ctx.get_hf_config()


def vision_config_without_deepstack(config: Any) -> Any:
    """A copy of ``config.vision_config`` that vLLM's Qwen3-VL tower accepts.

    Qwen3.5's vision config has no ``deepstack_visual_indexes`` and transformers
    5.2.0's Qwen3.5 vision model computes no deepstack features, so the tower runs
    without them (a config that lists some is served as transformers serves it: the
    list is ignored, and the log says so).
    """
    vision = copy.copy(config.vision_config)
    listed = list(getattr(vision, "deepstack_visual_indexes", None) or [])
    if listed:
        logger.warning_once(
            "vllm-kunlun: this Qwen3.5 vision config lists deepstack_visual_indexes "
            "%s; transformers' Qwen3.5 vision model uses no deepstack features, and "
            "neither does this model",
            str(listed),  # *_once caches its arguments: hashable only
        )
    vision.deepstack_visual_indexes = []
    return vision


def mrope_positions(
    config: Any, input_tokens: list[int], mm_features: list[MultiModalFeatureSpec]
) -> tuple[torch.Tensor, int]:
    """(3, len(input_tokens)) M-RoPE positions and the decode delta, as transformers'
    ``Qwen3_5Model.get_rope_index`` computes them for one sequence."""
    merge = config.vision_config.spatial_merge_size
    video_token = config.video_token_id
    # (offset of the frame's first placeholder, merged rows, merged columns)
    frames: list[tuple[int, int, int]] = []
    for feature in sorted(mm_features, key=lambda f: f.mm_position.offset):
        offset = feature.mm_position.offset
        if feature.modality == "image":
            _, h, w = feature.data["image_grid_thw"].data.tolist()
            frames.append((offset, h // merge, w // merge))
        elif feature.modality == "video":
            t, h, w = feature.data["video_grid_thw"].data.tolist()
            # Each frame is its own grid, after its timestamp text.
            for _ in range(t):
                offset = input_tokens.index(video_token, offset)
                frames.append((offset, h // merge, w // merge))
                offset += (h // merge) * (w // merge)
        else:
            raise ValueError(
                f"Qwen3.5 takes image and video inputs, not {feature.modality!r}"
            )
    pieces: list[np.ndarray] = []
    start, next_pos = 0, 0
    for offset, rows, cols in frames:
        text = offset - start
        pieces.append(np.broadcast_to(np.arange(text), (3, text)) + next_pos)
        next_pos += text
        grid = np.indices((1, rows, cols)).reshape(3, -1) + next_pos
        pieces.append(grid)
        next_pos += max(rows, cols)
        start = offset + rows * cols
    tail = len(input_tokens) - start
    pieces.append(np.broadcast_to(np.arange(tail), (3, tail)) + next_pos)
    positions = np.concatenate(pieces, axis=1)
    delta = int(positions.max()) + 1 - len(input_tokens) if positions.size else 0
    return torch.from_numpy(np.ascontiguousarray(positions)).to(torch.int64), delta


class _TextModelView:
    """The composite's text model and head, without the tower (get_language_model)."""

    def __init__(self, model: Any, lm_head: Any) -> None:
        self.model = model
        self.lm_head = lm_head

    def embed_input_ids(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.model.embed_input_ids(input_ids)  # type: ignore[no-any-return]


class Qwen3_5VisionLanguage:
    """What the composite adds to the Qwen3.5 text model: the vision tower, the
    multimodal embedding hooks, M-RoPE for image and video tokens and the tower's
    weights. Mixed in before the text model class (dense or MoE)."""

    # The tower's checkpoint names map onto ``visual.*``; vLLM applies this to the
    # quantization config too, so an ``ignore`` entry naming ``model.visual.*``
    # modules keeps the tower float.
    hf_to_vllm_mapper = WeightsMapper(orig_to_new_prefix={"model.visual.": "visual."})
    supports_encoder_tp_data = True

    visual: Any

    @classmethod
    def get_placeholder_str(cls, modality: str, i: int) -> str | None:
        return _VL.get_placeholder_str(modality, i)

    def _init_vision(self, vllm_config: VllmConfig, prefix: str) -> None:
        model_config = vllm_config.model_config
        mm = model_config.multimodal_config
        if mm is None:
            raise ValueError(
                "this Qwen3.5 composite was built without vLLM's multimodal config; "
                "is the architecture registered as multimodal?"
            )
        if mm.is_multimodal_pruning_enabled():
            raise ValueError(
                "vllm-kunlun's Qwen3.5 does not implement video token pruning (EVS); "
                "remove --video-pruning-rate"
            )
        self.hf_config = model_config.hf_config
        # vLLM's MTP proposer reads the image token from the target's (text) config.
        self.config.image_token_index = self.hf_config.image_token_id  # type: ignore[attr-defined]
        self.use_data_parallel = mm.mm_encoder_tp_mode == "data"
        self.video_pruning_rate = None
        self.is_multimodal_pruning_enabled = False
        self.use_deepstack = False
        with self._mark_tower_model(vllm_config, {"image", "video"}):  # type: ignore[attr-defined]
            self.visual = Qwen3_VisionTransformer(
                vision_config_without_deepstack(self.hf_config),
                norm_eps=1e-6,  # transformers' Qwen3.5 vision LayerNorms
                quant_config=vllm_config.quant_config,
                prefix=maybe_prefix(prefix, "visual"),
            )

    def get_language_model(self) -> Any:
        """The text side, as vLLM asks for it: text-only ``embed_input_ids`` (the
        default multimodal embedding), ``model.embed_tokens`` and ``lm_head`` (the MTP
        proposer shares them with its draft). No child module plays that part here: the
        tower is mixed into the text model class."""
        return _TextModelView(self.model, self.lm_head)  # type: ignore[attr-defined]

    # ---- multimodal inputs: vLLM's Qwen3-VL parsing and tower calls ----------------
    _parse_and_validate_image_input = _VL._parse_and_validate_image_input
    _parse_and_validate_video_input = _VL._parse_and_validate_video_input
    _parse_and_validate_multimodal_inputs = _VL._parse_and_validate_multimodal_inputs
    _process_image_input = _VL._process_image_input
    _process_video_input = _VL._process_video_input

    def embed_multimodal(self, **kwargs: object) -> MultiModalEmbeddings | None:
        result: MultiModalEmbeddings | None = _VL.embed_multimodal(self, **kwargs)  # type: ignore[arg-type]
        return result

    def embed_input_ids(
        self,
        input_ids: torch.Tensor,
        multimodal_embeddings: MultiModalEmbeddings | None = None,
        *,
        is_multimodal: torch.Tensor | None = None,
        handle_oov_mm_token: bool = False,
    ) -> torch.Tensor:
        """Token embeddings with the image/video embeddings in the placeholders'
        rows (vLLM's merge; no deepstack)."""
        return SupportsMultiModal.embed_input_ids(
            self,  # type: ignore[arg-type]
            input_ids,
            multimodal_embeddings,  # type: ignore[arg-type]
            is_multimodal=is_multimodal,  # type: ignore[arg-type]
            handle_oov_mm_token=handle_oov_mm_token,
        )

    def get_mrope_input_positions(
        self,
        input_tokens: list[int],
        mm_features: list[MultiModalFeatureSpec],
    ) -> tuple[torch.Tensor, int]:
        return mrope_positions(self.hf_config, input_tokens, mm_features)

    # ---- weights --------------------------------------------------------------------
    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        """The tower's tensors to the tower (vLLM's Qwen3-VL loader, which fuses
        nothing here: ``attn.qkv`` is fused on disk), the rest to the text model."""
        loaded: set[str] = set()
        # --limit-mm-per-prompt 0 for images and videos: vLLM built no tower (a
        # StageMissingLayer, which forwards attributes to an uninitialized one).
        tower = None if isinstance(self.visual, StageMissingLayer) else self.visual

        def text_weights() -> Iterable[tuple[str, torch.Tensor]]:
            for name, tensor in weights:
                if not name.startswith(_VISUAL_PREFIXES):
                    yield name, tensor
                    continue
                if tower is None:
                    continue
                local = name.split("visual.", 1)[1]
                loaded.update(
                    "visual." + n for n in tower.load_weights([(local, tensor)])
                )

        text: set[str] = super().load_weights(text_weights())  # type: ignore[misc]
        if tower is None:
            logger.info(
                "vllm-kunlun: Qwen3.5 vision tower not built (no image or video "
                "allowed per prompt): its weights are skipped"
            )
        return text | loaded


@MULTIMODAL_REGISTRY.register_processor(
    Qwen3VLMultiModalProcessor,
    info=Qwen3_5VLProcessingInfo,
    dummy_inputs=Qwen3VLDummyInputsBuilder,
)
class Qwen3_5ForConditionalGeneration(
    Qwen3_5VisionLanguage, Qwen3_5ForCausalLM, SupportsMultiModal
):
    """The dense composite: vision tower ``model.visual.*``, text
    ``model.language_model.*`` and ``lm_head.*``; the config nests ``text_config`` and
    ``vision_config``."""

    _text_prefix = "model.language_model."
    packed_modules_mapping = {
        **Qwen3_5ForCausalLM.packed_modules_mapping,
        "qkv": ["qkv"],  # the tower's attention, fused on disk
    }

    def __init__(self, *, vllm_config: VllmConfig, prefix: str = "") -> None:
        super().__init__(vllm_config=vllm_config, prefix=prefix)
        self._init_vision(vllm_config, prefix)


@MULTIMODAL_REGISTRY.register_processor(
    Qwen3VLMultiModalProcessor,
    info=Qwen3_5VLProcessingInfo,
    dummy_inputs=Qwen3VLDummyInputsBuilder,
)
class Qwen3_5MoeForConditionalGeneration(
    Qwen3_5VisionLanguage, Qwen3_5MoeForCausalLM, SupportsMultiModal
):
    """The MoE composite (``Qwen3_5MoeForConditionalGeneration``): the same vision
    tower (transformers 5.2.0's ``Qwen3_5MoeVisionModel`` is the dense one's) in front
    of the MoE hybrid text model."""

    _text_prefix = "model.language_model."
    packed_modules_mapping = {
        **Qwen3_5MoeForCausalLM.packed_modules_mapping,
        "qkv": ["qkv"],
    }

    def __init__(self, *, vllm_config: VllmConfig, prefix: str = "") -> None:
        super().__init__(vllm_config=vllm_config, prefix=prefix)
        self._init_vision(vllm_config, prefix)
