"""Model configurations the cost models need (architecture only; no weights).

The Qwen2.5 family are the models of StreamRL's evaluation (Table 2: layers, query heads,
KV heads, hidden size); the MLP width, vocabulary and head count of each are those of the
published Hugging Face ``config.json``. One disagreement: Table 2 lists 8 KV heads for
Qwen2.5-7B, its ``config.json`` has 4 (``num_key_value_heads``); the KV cache is sized by the
real architecture, so 4 is used here. ``braid-tiny`` is the default policy of this repository
(``services.common.config.ModelConfig`` defaults, character vocabulary).

``fingerprint()`` is what a profile records about its model; loading a profile for another
model fails naming the field that differs (``services.generation.scheduling.profiles``).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class ModelSpec:
    name: str
    layers: int
    q_heads: int
    kv_heads: int
    hidden: int
    intermediate: int
    vocab: int
    tied_embeddings: bool = False
    dtype_bytes: int = 2  # bf16 on GPUs; the CPU engine runs float32

    @property
    def head_dim(self) -> int:
        return self.hidden // self.q_heads

    def params(self) -> int:
        """Parameter count (attention with q/k/v biases as in Qwen2, SwiGLU MLP, RMSNorms)."""
        h, kv = self.hidden, self.kv_heads * self.head_dim
        attn = h * h + h + 2 * (h * kv + kv) + h * h
        mlp = 3 * h * self.intermediate
        per_layer = attn + mlp + 2 * h
        emb = self.vocab * h * (1 if self.tied_embeddings else 2)
        return self.layers * per_layer + emb + h

    def weight_bytes(self) -> int:
        return self.params() * self.dtype_bytes

    def decode_flops_per_token(self) -> float:
        """Matmul FLOPs to decode one token (2 x params touched; the input embedding is a lookup)."""
        return 2.0 * (self.params() - self.vocab * self.hidden * (0 if self.tied_embeddings else 1))

    def kv_bytes_per_token(self) -> int:
        """K and V for every layer: 2 x layers x kv_heads x head_dim x dtype bytes."""
        return 2 * self.layers * self.kv_heads * self.head_dim * self.dtype_bytes

    def fingerprint(self) -> dict[str, int | str]:
        d = asdict(self)
        d.pop("dtype_bytes")
        d.pop("tied_embeddings")
        return d


MODELS: dict[str, ModelSpec] = {
    "qwen2.5-7b": ModelSpec(
        "qwen2.5-7b", layers=28, q_heads=28, kv_heads=4, hidden=3584, intermediate=18944, vocab=152064
    ),
    "qwen2.5-32b": ModelSpec(
        "qwen2.5-32b", layers=64, q_heads=40, kv_heads=8, hidden=5120, intermediate=27648, vocab=152064
    ),
    "qwen2.5-72b": ModelSpec(
        "qwen2.5-72b", layers=80, q_heads=64, kv_heads=8, hidden=8192, intermediate=29568, vocab=152064
    ),
    "braid-tiny": ModelSpec(
        "braid-tiny", layers=4, q_heads=4, kv_heads=2, hidden=128, intermediate=384, vocab=19, tied_embeddings=True,
        dtype_bytes=4,
    ),
}


def get_model(name: str) -> ModelSpec:
    try:
        return MODELS[name]
    except KeyError:
        raise ValueError(f"unknown model {name!r}; known: {sorted(MODELS)}") from None


def spec_from_hf_config(name: str, config: dict, dtype_bytes: int = 4) -> ModelSpec:
    """A ``ModelSpec`` from a Hugging Face ``config.json`` dict (a local checkpoint)."""
    try:
        return ModelSpec(
            name=name,
            layers=int(config["num_hidden_layers"]),
            q_heads=int(config["num_attention_heads"]),
            kv_heads=int(config.get("num_key_value_heads") or config["num_attention_heads"]),
            hidden=int(config["hidden_size"]),
            intermediate=int(config["intermediate_size"]),
            vocab=int(config["vocab_size"]),
            tied_embeddings=bool(config.get("tie_word_embeddings", False)),
            dtype_bytes=dtype_bytes,
        )
    except KeyError as err:
        raise ValueError(f"model config lacks {err.args[0]!r}") from None
