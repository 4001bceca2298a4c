"""A deterministic tiny Qwen3 checkpoint with an offline tokenizer, built locally.

Why: the end-to-end tests, the demo and the throughput benchmark need a real model that
vLLM loads through its normal path (config.json, safetensors, a Hugging Face tokenizer)
without a download. The weights come from a fixed seed, so every machine builds the
same bytes; the embeddings are UNTIED (a tied tiny model tends to repeat its last token,
which would make greedy-equality tests weak); the weight scales give clear logit margins
so greedy decoding does not hinge on rounding.

Only torch, safetensors and tokenizers are needed (no vLLM, no transformers).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Protocol

SEED = 20260815
FORMAT_VERSION = 2  # 2: the tokenizer has a chat template (weights unchanged)
MARKER = "vllm-kunlun-tiny.json"
"""Written last: a directory with it holds a complete tiny checkpoint."""
OWNER_MARKER = ".vllm-kunlun-tiny-owner"
"""Written first: the directory is ours to refresh (even after an interrupted build)."""


class OutputDirError(ValueError):
    """The directory cannot receive a tiny checkpoint; the message says why and what
    to pass instead."""


# The tokenizer's vocabulary: special tokens, then a fixed word list. Order is the id.
SPECIAL_TOKENS = ("<|endoftext|>", "<unk>", "<pad>")
_WORD_TEXT = """
the a an and or but if then when while of to in on at by for with from into over
under about after before between through during without within is are was were be
been being has have had do does did can could will would shall should may might must
i you he she it we they me him her us them my your his its our their this that these
those here there what which who whom whose where why how all any both each few more
most other some such no not only own same so than too very just now also again once
kunlun vllm engine token model cache block page layer head query key value attention
sample seed batch prefix chunk decode prefill device host kernel memory tensor stream
quick brown fox jumps lazy dog red green blue yellow black white small large tiny long
short fast slow early late old new good bad first last next one two three four five
six seven eight nine ten hundred thousand day night morning evening river mountain sea
city road house tree stone fire water wind light sound time year world people hand
eye word story song dream
. , ; : ! ? ' " ( ) - 0 1 2 3 4 5 6 7 8 9
"""


@dataclass(frozen=True)
class TinyQwen3Spec:
    """Shape of the tiny model; defaults keep a CPU forward pass in the milliseconds."""

    num_hidden_layers: int = 2
    hidden_size: int = 64
    intermediate_size: int = 128
    num_attention_heads: int = 4
    num_key_value_heads: int = 2  # GQA: two query heads per KV head
    head_dim: int = 32
    max_position_embeddings: int = 2048
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-6
    # None: the word list's size. Larger: the word list padded with <|extra_N|> tokens
    # (e.g. Qwen's 151,936 for benchmarks at a real vocabulary size).
    vocab_size: int | None = None

    cache_name = "tiny-qwen3"

    def marker(self) -> dict:
        return {"seed": SEED, "format": FORMAT_VERSION, **_spec_fields(self)}

    def config(self, vocab_size: int) -> dict:
        return _config(self, vocab_size)

    def weights(self, vocab_size: int) -> dict:
        return _weights(self, vocab_size)


class TinySpec(Protocol):
    """What a tiny checkpoint kind provides (TinyQwen3Spec, tiny_qwen3_5's spec)."""

    @property
    def cache_name(self) -> str: ...

    def marker(self) -> dict: ...

    def config(self, vocab_size: int) -> dict: ...

    def weights(self, vocab_size: int) -> dict: ...


def _spec_fields(spec: TinyQwen3Spec) -> dict:
    """The spec as written to config.json and the marker (unset options left out, so
    the default model's bytes never change)."""
    return {k: v for k, v in asdict(spec).items() if v is not None}


def vocabulary(size: int | None = None) -> list[str]:
    """Token strings in id order (duplicates removed, first occurrence wins), padded
    to ``size`` tokens when given."""
    seen: dict[str, None] = {}
    for tok in (*SPECIAL_TOKENS, *_WORD_TEXT.split()):
        seen.setdefault(tok, None)
    words = list(seen)
    if size is None:
        return words
    if size < len(words):
        raise ValueError(
            f"vocab_size={size} is smaller than the tiny model's word list "
            f"({len(words)} tokens); use at least {len(words)} or leave it unset"
        )
    return words + [f"<|extra_{i}|>" for i in range(size - len(words))]


def decoder_fields(spec: Any, vocab_size: int) -> dict[str, Any]:
    """The decoder dimensions every tiny checkpoint's config.json states alike (Qwen3
    and Qwen3.5 name them the same), from a spec with those attributes."""
    return {
        "vocab_size": vocab_size,
        "hidden_size": spec.hidden_size,
        "intermediate_size": spec.intermediate_size,
        "num_hidden_layers": spec.num_hidden_layers,
        "num_attention_heads": spec.num_attention_heads,
        "num_key_value_heads": spec.num_key_value_heads,
        "head_dim": spec.head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": spec.max_position_embeddings,
        "rms_norm_eps": spec.rms_norm_eps,
    }


def _config(spec: TinyQwen3Spec, vocab_size: int) -> dict:
    return {
        "architectures": ["Qwen3ForCausalLM"],
        "model_type": "qwen3",
        **decoder_fields(spec, vocab_size),
        "rope_theta": spec.rope_theta,
        "rope_scaling": None,
        "attention_bias": False,
        "attention_dropout": 0.0,
        "use_sliding_window": False,
        "sliding_window": None,
        "max_window_layers": spec.num_hidden_layers,
        "tie_word_embeddings": False,
        "bos_token_id": 0,
        "eos_token_id": 0,
        "pad_token_id": 2,
        "torch_dtype": "float32",
        "use_cache": True,
        "vllm_kunlun_tiny": {
            "seed": SEED,
            "format": FORMAT_VERSION,
            **_spec_fields(spec),
        },
    }


def _weights(spec: TinyQwen3Spec, vocab_size: int) -> dict:
    import torch

    gen = torch.Generator().manual_seed(SEED)

    def normal(*shape: int, std: float) -> torch.Tensor:
        return torch.randn(*shape, generator=gen, dtype=torch.float32) * std

    def norm_weight(n: int) -> torch.Tensor:
        return 1.0 + normal(n, std=0.1)

    h, inter, hd = spec.hidden_size, spec.intermediate_size, spec.head_dim
    nq, nkv = spec.num_attention_heads, spec.num_key_value_heads
    w: dict[str, torch.Tensor] = {
        "model.embed_tokens.weight": normal(vocab_size, h, std=1.0)
    }
    for i in range(spec.num_hidden_layers):
        p = f"model.layers.{i}."
        w[p + "input_layernorm.weight"] = norm_weight(h)
        w[p + "self_attn.q_proj.weight"] = normal(nq * hd, h, std=1.0 / math.sqrt(h))
        w[p + "self_attn.k_proj.weight"] = normal(nkv * hd, h, std=1.0 / math.sqrt(h))
        w[p + "self_attn.v_proj.weight"] = normal(nkv * hd, h, std=1.0 / math.sqrt(h))
        w[p + "self_attn.o_proj.weight"] = normal(
            h, nq * hd, std=1.0 / math.sqrt(nq * hd)
        )
        # q/k norms with a gain > 1 sharpen attention, so positions matter.
        w[p + "self_attn.q_norm.weight"] = 2.0 + normal(hd, std=0.1)
        w[p + "self_attn.k_norm.weight"] = 2.0 + normal(hd, std=0.1)
        w[p + "post_attention_layernorm.weight"] = norm_weight(h)
        w[p + "mlp.gate_proj.weight"] = normal(inter, h, std=1.0 / math.sqrt(h))
        w[p + "mlp.up_proj.weight"] = normal(inter, h, std=1.0 / math.sqrt(h))
        w[p + "mlp.down_proj.weight"] = normal(h, inter, std=1.0 / math.sqrt(inter))
    w["model.norm.weight"] = norm_weight(h)
    # A wide lm_head spreads the logits (std ~3): clear greedy margins, varied output.
    w["lm_head.weight"] = normal(vocab_size, h, std=3.0 / math.sqrt(h))
    return w


def _tokenizer_json(vocab: list[str], special: tuple[str, ...] = ()) -> str:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    tok = Tokenizer(
        models.WordLevel(vocab={t: i for i, t in enumerate(vocab)}, unk_token="<unk>")
    )
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece(prefix="##", cleanup=False)
    # Special tokens are matched in raw text before the whitespace split, so
    # "<|vision_start|><|image_pad|>" written without spaces is two tokens.
    tok.add_special_tokens([*SPECIAL_TOKENS, *special])
    return tok.to_str(pretty=True)


# Chat completions need a template. Roles become vocabulary words ("you :" / "i :"),
# so a rendered chat has no <unk> tokens; the content is plain text (vLLM detects the
# "string" content format from ``message['content']``).
CHAT_TEMPLATE = (
    "{%- set names = {'system': 'the model', 'user': 'you', 'assistant': 'i'} -%}"
    "{%- for message in messages -%}"
    "{{ names.get(message['role'], message['role']) }} : {{ message['content'] }}"
    "{{ '\\n' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}i :{%- endif -%}"
)


def _tokenizer_config(chat_template: str = CHAT_TEMPLATE) -> dict:
    return {
        "chat_template": chat_template,
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": "<|endoftext|>",
        "eos_token": "<|endoftext|>",
        "unk_token": "<unk>",
        "pad_token": "<pad>",
        "model_max_length": 2048,
        "clean_up_tokenization_spaces": False,
    }


def _write_atomic(path: Path, data: bytes) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def write_tokenizer_files(
    out: Path,
    vocab: list[str],
    special: tuple[str, ...] = (),
    chat_template: str = CHAT_TEMPLATE,
) -> None:
    """The offline tokenizer every tiny checkpoint shares; ``special``: extra special
    tokens (already in ``vocab``), ``chat_template``: the checkpoint's own template."""
    _write_atomic(out / "tokenizer.json", _tokenizer_json(vocab, special).encode())
    _write_atomic(
        out / "tokenizer_config.json", _dump(_tokenizer_config(chat_template))
    )
    _write_atomic(
        out / "special_tokens_map.json",
        _dump({k: v for k, v in _tokenizer_config().items() if k.endswith("_token")}),
    )


def _dump(obj: dict) -> bytes:
    return (json.dumps(obj, indent=2, sort_keys=True) + "\n").encode()


write_atomic = _write_atomic  # also used by tiny_quant


def prepare_output_dir(directory: str | os.PathLike[str]) -> Path:
    """Create ``directory`` for a tiny checkpoint, or refuse (OutputDirError).

    Why: the writers replace config.json, weights and tokenizer files. A directory that
    holds something else (a real model, a user's files) must not lose them: only a new
    or empty directory, or one a tiny-model writer wrote before (its markers), is used.
    """
    out = Path(directory)
    if out.exists() and not out.is_dir():
        raise OutputDirError(
            f"{out} is a file, not a directory; pass a directory path (it is created "
            "if needed)"
        )
    if out.is_dir():
        try:
            names = sorted(os.listdir(out))
        except OSError as exc:
            raise OutputDirError(f"{out} cannot be listed ({exc.strerror})") from exc
        if names and OWNER_MARKER not in names and MARKER not in names:
            shown = ", ".join(names[:5]) + (", ..." if len(names) > 5 else "")
            raise OutputDirError(
                f"{out} is not empty ({shown}) and was not written by vllm-kunlun "
                "tiny-model: refusing to overwrite it; pass a new or empty directory"
            )
    try:
        out.mkdir(parents=True, exist_ok=True)
        (out / OWNER_MARKER).write_text(
            "written by vllm-kunlun tiny-model: this directory may be rewritten by it\n"
        )
    except OSError as exc:  # a parent that is a file, no permission, read-only
        raise OutputDirError(
            f"cannot create {out} ({exc.strerror or exc}); pass a writable directory "
            "path"
        ) from exc
    return out


def write_tiny_model(
    directory: str | os.PathLike[str], spec: TinySpec | None = None
) -> Path:
    """Write the checkpoint and tokenizer into ``directory`` (created if needed).

    Same spec -> same bytes on every machine with the same torch. The marker file is
    written last, so a directory with the marker is complete. Refuses (OutputDirError)
    a file path and a non-empty directory that no tiny-model writer wrote.
    """
    from safetensors.torch import save

    spec = spec or TinyQwen3Spec()
    out = prepare_output_dir(directory)
    # A spec may add special tokens at the end of the vocabulary (the composite's
    # vision tokens), its own chat template and more files (processor configs).
    added = tuple(getattr(spec, "added_tokens", ()))
    vocab = vocabulary(getattr(spec, "vocab_size", None)) + list(added)
    # A spec with its own tokenizer (tiny_bpe.BpeTokenizerSpec) writes it itself.
    own_tokenizer = getattr(spec, "write_tokenizer", None)
    size = getattr(spec, "tokenizer_vocab_size", None) or len(vocab)

    _write_atomic(out / "config.json", _dump(spec.config(size)))
    _write_atomic(
        out / "model.safetensors",
        save(spec.weights(size), metadata={"format": "pt"}),
    )
    if own_tokenizer is not None:
        own_tokenizer(out, _write_atomic)
    else:
        write_tokenizer_files(
            out, vocab, added, getattr(spec, "chat_template", CHAT_TEMPLATE)
        )
    for name, data in getattr(spec, "extra_files", dict)().items():
        _write_atomic(out / name, _dump(data))
    _write_atomic(out / MARKER, _dump(spec.marker()))
    return out


def is_tiny_model(
    directory: str | os.PathLike[str], spec: TinySpec | None = None
) -> bool:
    """True when ``directory`` holds a complete tiny model of this spec and format."""
    return has_marker(directory, (spec or TinyQwen3Spec()).marker())


def has_marker(directory: str | os.PathLike[str], marker: dict) -> bool:
    """True when ``directory``'s marker file (written last: the checkpoint is complete)
    equals ``marker``."""
    try:
        found = json.loads((Path(directory) / MARKER).read_text())
    except (OSError, ValueError):
        return False
    return bool(found == marker)


def is_tiny_checkpoint(directory: str | os.PathLike[str]) -> bool:
    """True when ``directory`` holds a complete tiny checkpoint of any kind."""
    return (Path(directory) / MARKER).is_file()


def safetensors_problem(directory: str | os.PathLike[str]) -> str | None:
    """Why ``directory``'s weights would not load (None: there is a ``*.safetensors``
    file and each one's header parses and its data is all there). Reads headers only."""
    files = sorted(Path(directory).glob("*.safetensors"))
    if not files:
        return "no *.safetensors file"
    for path in files:
        try:
            size = path.stat().st_size
            with open(path, "rb") as f:
                head = f.read(8)
                length = int.from_bytes(head, "little") if len(head) == 8 else -1
                if not 0 <= length <= size - 8:
                    return f"{path.name}: {size} bytes, its header does not fit"
                header = json.loads(f.read(length))
            ends = [
                int(v["data_offsets"][1])
                for k, v in header.items()
                if k != "__metadata__"
            ]
        except (OSError, ValueError, KeyError, TypeError, IndexError) as exc:
            return f"{path.name}: unreadable header ({type(exc).__name__}: {exc})"
        need = 8 + length + max(ends, default=0)
        if size < need:
            return f"{path.name}: truncated, {size} of {need} bytes"
    return None


def ensure_complete(
    directory: str | os.PathLike[str], marker: dict, write: Any
) -> Path:
    """``write(directory)`` unless ``directory`` holds a complete checkpoint with
    ``marker`` whose weights load; a cached one that would not load (a truncated copy,
    a full disk) is rebuilt once, with a warning naming the cause."""
    if has_marker(directory, marker):
        problem = safetensors_problem(directory)
        if problem is None:
            return Path(directory)
        from vllm_kunlun.logger import init_logger

        init_logger(__name__).warning(
            "vllm-kunlun: the cached tiny model in %s does not load (%s); rebuilding it",
            directory,
            problem,
        )
        (Path(directory) / MARKER).unlink(missing_ok=True)
    write(directory)
    problem = safetensors_problem(directory)
    if problem is not None:
        raise OutputDirError(
            f"the tiny model written to {directory} does not load ({problem}); check "
            "the free space and permissions there, or delete the directory"
        )
    return Path(directory)


def ensure_tiny_model(
    directory: str | os.PathLike[str], spec: TinySpec | None = None
) -> Path:
    """Build the model into ``directory`` unless a complete one of this spec is in it."""
    return ensure_complete(
        directory,
        (spec or TinyQwen3Spec()).marker(),
        lambda d: write_tiny_model(d, spec),
    )


def default_cache_dir(spec: TinySpec | None = None) -> Path:
    """``$XDG_CACHE_HOME/vllm-kunlun/<kind>-v<format>`` (``~/.cache`` when unset)."""
    spec = spec or TinyQwen3Spec()
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(
        os.path.expanduser("~"), ".cache"
    )
    return Path(base) / "vllm-kunlun" / f"{spec.cache_name}-v{spec.marker()['format']}"


def checksum(directory: str | os.PathLike[str]) -> str:
    """sha256 over the model files (for reproducibility checks and reports)."""
    h = hashlib.sha256()
    for name in (
        "config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
    ):
        h.update(name.encode())
        h.update((Path(directory) / name).read_bytes())
    return h.hexdigest()
