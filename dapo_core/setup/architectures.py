"""Model architectures for the memory plan: the sizes that decide how many bytes a model needs.

`resolve_architecture(model_cfg)` reads them, in this order, from:
1. `tiny` (or `tiny-explore`): the embedded model's own sizes (ModelConfig) and its character vocabulary;
2. a local model directory's `config.json`;
3. the Hugging Face hub cache (`config.json` of a hub name, when it was downloaded before);
4. the table below of known architectures, so that `dapo plan` answers offline.

Nothing here imports torch or transformers: a config.json is read as JSON.

The table's values are each model's `config.json` on the hub (Qwen2ForCausalLM, qkv bias, no
o/MLP bias). Where they were read (stored copies, checked field by field):
- Qwen2.5-0.5B: huggingface.co/osllmai-community/Qwen2.5-0.5B/blob/main/config.json
  (`_name_or_path: Qwen/Qwen2.5-0.5B`); the -Instruct card has the same sizes.
- Qwen2.5-1.5B: huggingface.co/onnx-community/Qwen2.5-1.5B-Instruct config.json
  (`_name_or_path: Qwen/Qwen2.5-1.5B-Instruct`) and the Qwen2.5-1.5B base card.
- Qwen2.5-3B, 7B, 14B, 32B: github.com/citsjtu2020/LLM-Prof sglang/Model_Config.md (copies of the
  base cards); 7B also huggingface.co/osllmai-community/Qwen2.5-7B-Instruct config.json, 32B also
  huggingface.co/Qwen/Qwen2.5-32B/blob/main/config.json.
Parameter counts these give (a check on the table): 0.5B 494,032,768 (card: 0.49B);
7B 7,615,616,512 (card: 7.61B); 32B 32,763,876,352 (card: 32.5B; the count from its
config.json is 32.76B, which is what the memory plan uses).
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dapo_core.setup.config import ModelConfig, is_local_path


@dataclass(frozen=True)
class Architecture:
    """A decoder-only transformer (Llama / Qwen2 family: RMSNorm, RoPE, SwiGLU MLP, GQA)."""

    name: str
    layers: int
    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    vocab: int
    tie_embeddings: bool
    head_dim: int = 0
    """0: hidden // heads (what transformers assumes when config.json has no head_dim)."""
    qkv_bias: bool = False
    """Qwen2 has biases on q, k and v (not on o); Llama has none unless attention_bias."""
    o_bias: bool = False
    mlp_bias: bool = False
    source: str = ""
    """Where the sizes came from: `tiny`, a config.json path, the hub cache, or the table."""

    @property
    def dim(self) -> int:
        return self.head_dim or self.hidden // self.heads

    @property
    def q_dim(self) -> int:
        """Width of q (and of the attention output): heads × head_dim."""
        return self.heads * self.dim

    @property
    def kv_dim(self) -> int:
        """Width of k and of v: kv_heads × head_dim (GQA: smaller than q_dim)."""
        return self.kv_heads * self.dim

    @property
    def layer_params(self) -> int:
        """One decoder layer: q, k, v, o, gate, up, down and two RMSNorm weights."""
        h, q, kv, i = self.hidden, self.q_dim, self.kv_dim, self.intermediate
        attn = h * q + 2 * h * kv + q * h
        if self.qkv_bias:
            attn += q + 2 * kv
        if self.o_bias:
            attn += h
        mlp = 3 * h * i + ((2 * i + h) if self.mlp_bias else 0)
        return attn + mlp + 2 * h

    @property
    def embedding_params(self) -> int:
        return self.vocab * self.hidden

    @property
    def head_params(self) -> int:
        """LM head weights of its own (0 when tied to the embedding)."""
        return 0 if self.tie_embeddings else self.vocab * self.hidden

    @property
    def root_params(self) -> int:
        """Everything outside the decoder layers: embedding, final norm, LM head."""
        return self.embedding_params + self.hidden + self.head_params

    @property
    def params(self) -> int:
        return self.layers * self.layer_params + self.root_params

    @property
    def kv_bytes_per_token(self) -> int:
        """KV-cache elements per token (K and V of every layer); times the dtype's bytes."""
        return 2 * self.layers * self.kv_dim


def _qwen2(name: str, **sizes: Any) -> Architecture:
    return Architecture(name=name, qkv_bias=True, source="table of known architectures", **sizes)


# Hub name (lower case) → architecture. Base and -Instruct checkpoints share the sizes.
_QWEN25 = {
    "qwen2.5-0.5b": dict(
        layers=24,
        hidden=896,
        intermediate=4864,
        heads=14,
        kv_heads=2,
        vocab=151936,
        tie_embeddings=True,
    ),
    "qwen2.5-1.5b": dict(
        layers=28,
        hidden=1536,
        intermediate=8960,
        heads=12,
        kv_heads=2,
        vocab=151936,
        tie_embeddings=True,
    ),
    "qwen2.5-3b": dict(
        layers=36,
        hidden=2048,
        intermediate=11008,
        heads=16,
        kv_heads=2,
        vocab=151936,
        tie_embeddings=True,
    ),
    "qwen2.5-7b": dict(
        layers=28,
        hidden=3584,
        intermediate=18944,
        heads=28,
        kv_heads=4,
        vocab=152064,
        tie_embeddings=False,
    ),
    "qwen2.5-14b": dict(
        layers=48,
        hidden=5120,
        intermediate=13824,
        heads=40,
        kv_heads=8,
        vocab=152064,
        tie_embeddings=False,
    ),
    "qwen2.5-32b": dict(
        layers=64,
        hidden=5120,
        intermediate=27648,
        heads=40,
        kv_heads=8,
        vocab=152064,
        tie_embeddings=False,
    ),
}
KNOWN: dict[str, Architecture] = {}
for _key, _sizes in _QWEN25.items():
    for _suffix in ("", "-instruct"):
        _name = f"qwen/{_key}{_suffix}"
        KNOWN[_name] = _qwen2(_name, **_sizes)
# SmolLM2-135M-Instruct as dapo_core.real_model converts it (`model.name_or_path = smollm2-135m`):
# its config.json after conversion; 134,515,008 parameters, as the conversion counts them.
KNOWN["smollm2-135m"] = Architecture(
    name="smollm2-135m",
    layers=30,
    hidden=576,
    intermediate=1536,
    heads=9,
    kv_heads=3,
    vocab=49152,
    tie_embeddings=True,
    head_dim=64,
    source="table of known architectures",
)


def resolve_architecture(model: ModelConfig) -> Architecture:
    """The architecture of `model.name_or_path` (see the module docstring for the order)."""
    name = model.name_or_path
    if name in TINY_MODELS:
        return tiny_architecture(model)
    path = Path(name).expanduser()
    if is_local_path(name) and not path.exists():
        raise FileNotFoundError(f"model path {name} does not exist")
    if path.is_dir():
        config = path / "config.json"
        if not config.is_file():
            raise FileNotFoundError(f"model directory {name} has no config.json")
        return from_config_file(config, name)
    cached = _hub_cached_config(name)
    if cached is not None:
        return from_config_file(cached, name)
    known = KNOWN.get(name.lower())
    if known is not None:
        return dataclasses.replace(known, name=name)
    raise ValueError(
        f"model {name!r}: its architecture is unknown offline (no local directory, not in the "
        f"Hugging Face cache, not in the table of {', '.join(sorted({k.split('/')[-1].removesuffix('-instruct') for k in KNOWN}))}); "
        "give a model directory with a config.json"
    )


# The embedded tiny models (dapo_core.models.TINY_TASKS): one architecture, warm-started on
# different tasks (`tiny`: running sums; `tiny-explore`: dapo_core.data.explore; `tiny-lookup`:
# dapo_core.data.lookup).
TINY_MODELS: tuple[str, ...] = ("tiny", "tiny-explore", "tiny-lookup")

# The embedded model's word-level vocabulary, part of its architecture: dapo_core.models
# builds its tokenizer from it, and the plan sizes its embedding by it.
PAD, EOS, UNK, ANSWER = "<pad>", "<eos>", "<unk>", "Answer:"
# Newline and printable ASCII: any prompt can be encoded (other characters become <unk>).
_CHARS = ["\n", *(chr(i) for i in range(32, 127))]


def tiny_vocab() -> dict[str, int]:
    """The tiny model's vocabulary, token → id: the special tokens first, then the characters."""
    vocab = {PAD: 0, EOS: 1, UNK: 2, ANSWER: 3}
    for c in _CHARS:
        vocab.setdefault(c, len(vocab))
    return vocab


def tiny_architecture(model: ModelConfig) -> Architecture:
    """The embedded Llama-style model (dapo_core.models.build_tiny_model): MHA, tied, no bias."""
    return Architecture(
        name="tiny",
        layers=model.num_layers,
        hidden=model.hidden_size,
        intermediate=model.intermediate_size,
        heads=model.num_heads,
        kv_heads=model.num_heads,
        vocab=len(tiny_vocab()),
        tie_embeddings=True,
        source="tiny (model.* sizes)",
    )


def from_config_file(path: Path, name: str) -> Architecture:
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise ValueError(f"{path}: not a readable config.json ({exc})") from None
    return from_config_dict(data, name, source=str(path))


def from_config_dict(data: dict[str, Any], name: str, source: str = "") -> Architecture:
    """A transformers config.json (Llama, Qwen2, Mistral-like) → Architecture."""
    text = data.get("text_config")
    cfg = {**data, **text} if isinstance(text, dict) else data
    missing = [
        k
        for k in (
            "num_hidden_layers",
            "hidden_size",
            "intermediate_size",
            "num_attention_heads",
            "vocab_size",
        )
        if not isinstance(cfg.get(k), int)
    ]
    if missing:
        raise ValueError(f"{source or name}: config.json lacks {', '.join(missing)}")
    model_type = str(cfg.get("model_type", ""))
    attention_bias = bool(cfg.get("attention_bias", False))
    return Architecture(
        name=name,
        layers=cfg["num_hidden_layers"],
        hidden=cfg["hidden_size"],
        intermediate=cfg["intermediate_size"],
        heads=cfg["num_attention_heads"],
        kv_heads=int(cfg.get("num_key_value_heads") or cfg["num_attention_heads"]),
        vocab=cfg["vocab_size"],
        # Qwen2Config and LlamaConfig both default to untied when the file does not say.
        tie_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        head_dim=int(cfg.get("head_dim") or 0),
        qkv_bias=model_type == "qwen2" or attention_bias,
        o_bias=attention_bias,
        mlp_bias=bool(cfg.get("mlp_bias", False)),
        source=source,
    )


def _hub_cached_config(name: str) -> Path | None:
    """config.json of a hub name from the local Hugging Face cache, without the network."""
    if is_local_path(name) or "/" not in name:  # only an `org/name` hub id is cached
        return None
    try:
        from huggingface_hub import try_to_load_from_cache
    except ImportError:  # transformers brings it; without it the table answers
        return None
    found = try_to_load_from_cache(name, "config.json")
    return Path(found) if isinstance(found, str) else None
