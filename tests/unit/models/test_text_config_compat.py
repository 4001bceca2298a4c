"""transformers5_config_fields: a composite config's ``tie_word_embeddings`` reaches the
text config vLLM builds the language model on, and a BERT-family config gets the
``position_embedding_type`` 5.2.0 dropped (vllm_kunlun/models/text_config_compat.py).

Each family's config is written by transformers 5.2.0's own config class
(``save_pretrained``) and read back the way vLLM reads it (``AutoConfig``), then passed
through ``vllm.config.model.get_hf_text_config``, the name ``ModelConfig.__post_init__``
calls. The end-to-end proof (model init and greedy tokens) is
tests/integration/test_e2e_qwen_vl.py and (XLM-R) test_e2e_pooling.py.
"""

from __future__ import annotations

import pickle
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import transformers
from transformers import AutoConfig
from vllm.config import model as vllm_model_config

from vllm_kunlun.models import text_config_compat as T

TEXT = {
    "hidden_size": 32,
    "num_hidden_layers": 1,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "intermediate_size": 64,
    "vocab_size": 128,
}

# family -> config class; all of them lose the flag on their text config in 5.2.0
# (the registry walk in docs/models.md, "transformers 5.2.0 configs").
FAMILIES = {
    "qwen2_vl": "Qwen2VLConfig",
    "qwen2_5_vl": "Qwen2_5_VLConfig",
    "qwen3_vl": "Qwen3VLConfig",
    "qwen3_vl_moe": "Qwen3VLMoeConfig",
    "glm4v": "Glm4vConfig",
    "glm4v_moe": "Glm4vMoeConfig",
}


@pytest.fixture
def applied() -> Iterator[None]:
    was = T.PATCH.applied()
    T.apply()
    yield
    if not was:
        T.revert()


@pytest.fixture
def unpatched() -> Iterator[None]:
    was = T.PATCH.applied()
    T.revert()
    yield
    if was:
        T.apply()


def _saved(tmp_path: Path, cls_name: str, **kwargs: Any) -> Any:
    cls = getattr(transformers, cls_name)
    cls(**kwargs).save_pretrained(tmp_path)
    return AutoConfig.from_pretrained(tmp_path)


@pytest.mark.parametrize("family", sorted(FAMILIES))
@pytest.mark.parametrize("tied", [True, False])
def test_each_family_text_config_gets_the_composite_flag(
    applied: None, tmp_path: Path, family: str, tied: bool
) -> None:
    hf = _saved(
        tmp_path, FAMILIES[family], text_config=dict(TEXT), tie_word_embeddings=tied
    )
    text = vllm_model_config.get_hf_text_config(hf)
    assert text is hf.get_text_config() and text is not hf
    assert text.tie_word_embeddings is tied
    # the engine core and workers receive the config pickled
    assert pickle.loads(pickle.dumps(hf)).get_text_config().tie_word_embeddings is tied


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_without_the_patch_vllm_reads_a_missing_flag(
    unpatched: None, tmp_path: Path, family: str
) -> None:
    # What the patch exists for: the read vLLM's text models make fails as in issue 42.
    hf = _saved(
        tmp_path, FAMILIES[family], text_config=dict(TEXT), tie_word_embeddings=True
    )
    text = vllm_model_config.get_hf_text_config(hf)
    with pytest.raises(AttributeError, match="tie_word_embeddings"):
        _ = text.tie_word_embeddings


@pytest.mark.parametrize(("top", "inner"), [(True, False), (False, True)])
def test_disagreeing_flags_follow_the_top_level_as_transformers(
    applied: None, tmp_path: Path, top: bool, inner: bool
) -> None:
    # Qwen3.5's text config declares its own flag (issue 40, item 12).
    text = dict(TEXT, tie_word_embeddings=inner)
    vision = {"depth": 1, "hidden_size": 16, "intermediate_size": 32, "num_heads": 1}
    hf = _saved(
        tmp_path,
        "Qwen3_5Config",
        text_config=text,
        vision_config=dict(vision, out_hidden_size=TEXT["hidden_size"]),
        tie_word_embeddings=top,
    )
    assert hf.text_config.tie_word_embeddings is inner  # as saved
    assert vllm_model_config.get_hf_text_config(hf).tie_word_embeddings is top
    # transformers' own model decides by the top level too
    model = transformers.Qwen3_5ForConditionalGeneration._from_config(hf)
    assert (model.lm_head.weight is model.get_input_embeddings().weight) is top


def test_text_only_config_is_untouched(applied: None, tmp_path: Path) -> None:
    hf = _saved(tmp_path, "Qwen2Config", tie_word_embeddings=True, **TEXT)
    assert T.carry_tie_flag(hf) is False
    assert vllm_model_config.get_hf_text_config(hf) is hf


def test_agreeing_flags_change_nothing(tmp_path: Path) -> None:
    text = dict(TEXT, tie_word_embeddings=True)
    hf = _saved(tmp_path, "Qwen3_5Config", text_config=text, tie_word_embeddings=True)
    assert T.carry_tie_flag(hf) is False
    assert hf.text_config.tie_word_embeddings is True


def test_patch_matches_the_installed_vllm() -> None:
    assert T.PATCH.mismatch() is None


@pytest.mark.parametrize(
    "cls_name", ["BertConfig", "RobertaConfig", "XLMRobertaConfig"]
)
def test_bert_family_gets_absolute_positions(
    applied: None, tmp_path: Path, cls_name: str
) -> None:
    hf = _saved(tmp_path, cls_name, **TEXT)
    assert not hasattr(hf, "position_embedding_type")  # dropped in 5.2.0
    vllm_model_config.get_hf_text_config(hf)
    assert hf.position_embedding_type == "absolute"
    # vLLM's XLMRobertaModel config check reads it unguarded
    from vllm.model_executor.models.config import JinaRobertaModelConfig

    model_config = type("M", (), {"hf_config": hf})
    JinaRobertaModelConfig.verify_and_update_model_config(model_config)  # type: ignore[arg-type]


def test_a_saved_position_type_is_kept(applied: None, tmp_path: Path) -> None:
    hf = _saved(tmp_path, "XLMRobertaConfig", **TEXT)
    hf.position_embedding_type = "rotary"
    assert T.absolute_positions(hf) is False
    assert hf.position_embedding_type == "rotary"


def _composites_missing_the_flag() -> dict[str, str]:
    """vLLM 0.15.1's registry walked against transformers 5.2.0: every architecture
    whose transformers config (defaults) is a composite with the flag on the top level
    and a text config without it -> its model type."""
    import warnings

    from transformers import CONFIG_MAPPING
    from transformers.models.auto import modeling_auto
    from vllm.model_executor.models.registry import _VLLM_MODELS

    model_type: dict[str, str] = {}
    for name in dir(modeling_auto):
        table = getattr(modeling_auto, name)
        if name.endswith("_MAPPING_NAMES") and isinstance(table, dict):
            for mt, archs in table.items():
                for arch in archs if isinstance(archs, (list, tuple)) else [archs]:
                    model_type.setdefault(arch, mt)
    found = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for arch in _VLLM_MODELS:
            mt = model_type.get(arch)
            if mt not in CONFIG_MAPPING:
                continue
            hf = CONFIG_MAPPING[mt]()
            text = hf.get_text_config()
            if text is not hf and T.FLAG in vars(hf) and T.FLAG not in vars(text):
                found[arch] = mt
    return found


def test_the_registry_walk_finds_the_families_this_file_tests() -> None:
    # A new vLLM or transformers that changes the list fails here (docs/models.md,
    # "transformers 5.2.0 configs").
    found = _composites_missing_the_flag()
    assert set(found.values()) == set(FAMILIES), found
