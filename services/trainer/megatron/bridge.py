"""Hugging Face Qwen2/Llama <-> megatron-core ``GPTModel``: the config, and the weights tensor by tensor.

Pure conversion: no process group is started here (``build_gpt`` needs Megatron's model-parallel
state to be up already; ``backend.py`` sets it up). Checked against megatron-core 0.16.1's local
(non-TransformerEngine) layer spec, ``get_gpt_layer_local_spec``:

=========================================  ================================================
Hugging Face                               Megatron (``GPTModel`` parameter)
=========================================  ================================================
``model.embed_tokens.weight``              ``embedding.word_embeddings.weight``
``model.layers.i.input_layernorm``         ``decoder.layers.i.input_layernorm`` (a separate
                                           RMSNorm in the local spec, not fused into qkv)
``self_attn.{q,k,v}_proj.{weight,bias}``   ``self_attention.linear_qkv.{weight,bias}``, fused
``self_attn.o_proj.weight``                ``self_attention.linear_proj.weight``
``post_attention_layernorm.weight``        ``pre_mlp_layernorm.weight``
``mlp.{gate,up}_proj.weight``              ``mlp.linear_fc1.weight`` = ``[gate; up]``
``mlp.down_proj.weight``                   ``mlp.linear_fc2.weight``
``model.norm.weight``                      ``decoder.final_layernorm.weight``
``lm_head.weight``                         ``output_layer.weight``; tied: the embedding itself
=========================================  ================================================

The fused qkv rows are grouped by key/value head (``SelfAttention.get_query_key_value_tensors``
views them as ``[groups, (heads/groups + 2) * head_dim]``): for each query group g, its
``heads/groups`` query heads, then key head g, then value head g. Hugging Face's grouped-query
attention pairs query head h with key head ``h // (heads/groups)``, which is the same grouping.
The SwiGLU ``glu`` applies the activation to the first half of fc1's output, hence gate first.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F
import torch.utils.checkpoint

SUPPORTED = ("qwen2", "llama")  # config.model_type

Part = str | None  # which slice of a fused Megatron tensor a Hugging Face tensor is: q k v gate up, or all


@dataclass(frozen=True)
class Geometry:
    """What the conversion needs to know about a Hugging Face decoder config."""

    model_type: str
    num_layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    ffn: int
    vocab: int
    tied: bool
    qkv_bias: bool
    rope_theta: float
    eps: float
    max_positions: int


def geometry(hf_config) -> Geometry:
    """The geometry of a Qwen2/Llama config; ``ValueError`` for what the conversion does not cover
    (another architecture, another activation, RoPE scaling, sliding windows, Llama biases)."""
    kind = getattr(hf_config, "model_type", None)
    if kind not in SUPPORTED:
        raise ValueError(f"trainer.backend megatron converts {list(SUPPORTED)} models, not {kind!r}")
    if hf_config.hidden_act != "silu":
        raise ValueError(f"megatron bridge: hidden_act {hf_config.hidden_act!r} (only silu, SwiGLU)")
    rope = getattr(hf_config, "rope_parameters", None) or getattr(hf_config, "rope_scaling", None) or {}
    if rope.get("rope_type", rope.get("type", "default")) != "default":
        raise ValueError(f"megatron bridge: RoPE scaling {rope.get('rope_type')!r} is not converted (default only)")
    if getattr(hf_config, "use_sliding_window", False):
        raise ValueError("megatron bridge: sliding-window attention is not converted")
    if kind == "llama" and (getattr(hf_config, "attention_bias", False) or getattr(hf_config, "mlp_bias", False)):
        raise ValueError("megatron bridge: Llama with attention_bias/mlp_bias is not converted")
    heads = hf_config.num_attention_heads
    return Geometry(
        model_type=kind,
        num_layers=hf_config.num_hidden_layers,
        hidden=hf_config.hidden_size,
        heads=heads,
        kv_heads=hf_config.num_key_value_heads or heads,
        head_dim=getattr(hf_config, "head_dim", None) or hf_config.hidden_size // heads,
        ffn=hf_config.intermediate_size,
        vocab=hf_config.vocab_size,
        tied=bool(hf_config.tie_word_embeddings),
        qkv_bias=kind == "qwen2",  # Qwen2 has q/k/v biases and no others; Llama none
        rope_theta=float(rope.get("rope_theta", getattr(hf_config, "rope_theta", 10000.0))),
        eps=float(hf_config.rms_norm_eps),
        max_positions=hf_config.max_position_embeddings,
    )


def transformer_config(g: Geometry):
    """Megatron's ``TransformerConfig`` for ``g``: RMSNorm, SwiGLU, grouped-query attention, bias
    only on qkv (Qwen2), no dropout (Hugging Face's configs have none), no fused kernels (the local
    spec runs plain torch), float32 parameters built on the host without initialisation (every
    one is overwritten by the converted weights)."""
    from megatron.core.transformer.transformer_config import TransformerConfig

    return TransformerConfig(
        num_layers=g.num_layers,
        hidden_size=g.hidden,
        num_attention_heads=g.heads,
        num_query_groups=g.kv_heads,
        kv_channels=g.head_dim,
        ffn_hidden_size=g.ffn,
        normalization="RMSNorm",
        layernorm_epsilon=g.eps,
        gated_linear_unit=True,
        activation_func=F.silu,
        add_bias_linear=False,
        add_qkv_bias=g.qkv_bias,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        bias_activation_fusion=False,
        bias_dropout_fusion=False,
        masked_softmax_fusion=False,
        apply_rope_fusion=False,
        persist_layer_norm=False,
        params_dtype=torch.float32,
        use_cpu_initialization=True,
        perform_initialization=False,
        cuda_graph_scope=[],  # no CUDA graphs; the default "full" is deprecated and warns
    )


@functools.cache
def recomputed_layer_class() -> type:
    """``TransformerLayer`` whose activations are recomputed in backward by torch's non-reentrant
    checkpoint (``trainer.activation_checkpointing``). Not Megatron's own recompute
    (``recompute_granularity="full"``): its ``CheckpointFunction`` re-runs the layer without the
    forward's autocast state (Megatron trains bfloat16 parameters, not under autocast, which is how
    this backend runs ``trainer.dtype: bfloat16``) and needs CUDA RNG states; torch's checkpoint
    restores both autocast and RNG state. Parameter names are unchanged (a subclass, not a wrapper)."""
    from megatron.core.transformer.transformer_layer import TransformerLayer

    class RecomputedTransformerLayer(TransformerLayer):
        def forward(self, *args, **kwargs):
            if not torch.is_grad_enabled():
                return super().forward(*args, **kwargs)
            return torch.utils.checkpoint.checkpoint(super().forward, *args, use_reentrant=False, **kwargs)

    return RecomputedTransformerLayer


def build_gpt(g: Geometry, *, recompute: bool = False):
    """An uninitialised float32 ``GPTModel`` on the host with the local layer spec and RoPE
    (non-interleaved, as Hugging Face's ``rotate_half``). ``recompute``: every layer's activations
    are recomputed in backward. Needs Megatron's model-parallel state."""
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.models.gpt.gpt_model import GPTModel

    spec = get_gpt_layer_local_spec(normalization="RMSNorm")
    if recompute:
        spec = replace(spec, module=recomputed_layer_class())
    return GPTModel(
        config=transformer_config(g),
        transformer_layer_spec=spec,
        vocab_size=g.vocab,
        max_sequence_length=g.max_positions,
        position_embedding_type="rope",
        rotary_base=g.rope_theta,
        share_embeddings_and_output_weights=g.tied,
    )


def name_table(g: Geometry) -> dict[str, tuple[str, Part]]:
    """Hugging Face name -> (Megatron parameter name, the part of it this tensor is)."""
    table: dict[str, tuple[str, Part]] = {"model.embed_tokens.weight": ("embedding.word_embeddings.weight", None)}
    for i in range(g.num_layers):
        hf, mg = f"model.layers.{i}.", f"decoder.layers.{i}."
        qkv = mg + "self_attention.linear_qkv."
        table[hf + "input_layernorm.weight"] = (mg + "input_layernorm.weight", None)
        for kind in ("weight", "bias") if g.qkv_bias else ("weight",):
            for part in "qkv":
                table[f"{hf}self_attn.{part}_proj.{kind}"] = (qkv + kind, part)
        table[hf + "self_attn.o_proj.weight"] = (mg + "self_attention.linear_proj.weight", None)
        table[hf + "post_attention_layernorm.weight"] = (mg + "pre_mlp_layernorm.weight", None)
        table[hf + "mlp.gate_proj.weight"] = (mg + "mlp.linear_fc1.weight", "gate")
        table[hf + "mlp.up_proj.weight"] = (mg + "mlp.linear_fc1.weight", "up")
        table[hf + "mlp.down_proj.weight"] = (mg + "mlp.linear_fc2.weight", None)
    table["model.norm.weight"] = ("decoder.final_layernorm.weight", None)
    table["lm_head.weight"] = ("embedding.word_embeddings.weight" if g.tied else "output_layer.weight", None)
    return table


def _qkv_view(fused: torch.Tensor, g: Geometry) -> torch.Tensor:
    """The fused qkv weight [rows, hidden] (or bias [rows]) as [groups, heads/groups + 2, head_dim, ...]."""
    return fused.view(g.kv_heads, g.heads // g.kv_heads + 2, g.head_dim, *fused.shape[1:])


def qkv_part(fused: torch.Tensor, part: str, g: Geometry) -> torch.Tensor:
    """Hugging Face's q, k or v projection (weight or bias) cut out of Megatron's fused qkv."""
    per = g.heads // g.kv_heads
    view = _qkv_view(fused, g)
    picked = {"q": view[:, :per], "k": view[:, per : per + 1], "v": view[:, per + 1 :]}[part]
    return picked.reshape(-1, *fused.shape[1:])


def fuse_qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: Geometry) -> torch.Tensor:
    """Megatron's fused qkv from Hugging Face's q, k, v projections (weights or biases)."""
    rest = q.shape[1:]
    per = g.heads // g.kv_heads
    parts = (q.reshape(g.kv_heads, per, g.head_dim, *rest), k.reshape(g.kv_heads, 1, g.head_dim, *rest),
             v.reshape(g.kv_heads, 1, g.head_dim, *rest))
    return torch.cat(parts, dim=1).reshape(-1, *rest)


def _fuse(parts: Mapping[Part, torch.Tensor], g: Geometry) -> torch.Tensor:
    if None in parts:
        return parts[None]
    if "gate" in parts:
        return torch.cat([parts["gate"], parts["up"]], dim=0)
    return fuse_qkv(parts["q"], parts["k"], parts["v"], g)


def _part(value: torch.Tensor, part: Part, g: Geometry) -> torch.Tensor:
    if part is None:
        return value
    if part in ("gate", "up"):
        return value.chunk(2, dim=0)[part == "up"]
    return qkv_part(value, part, g)


def to_megatron(hf_state: Mapping[str, torch.Tensor], g: Geometry) -> Iterator[tuple[str, torch.Tensor]]:
    """(Megatron parameter name, tensor) for every Megatron parameter, built from a Hugging Face
    state dict. Tied models: ``lm_head.weight`` is the embedding and is not read."""
    table = name_table(g)
    unknown = sorted(set(hf_state) - set(table))
    if unknown:
        raise ValueError(f"megatron bridge: {len(unknown)} Hugging Face tensors have no Megatron place: {unknown[:4]}")
    groups: dict[str, dict[Part, str]] = {}
    for hf_name, (mg_name, part) in table.items():
        if not (g.tied and hf_name == "lm_head.weight"):
            groups.setdefault(mg_name, {})[part] = hf_name
    for mg_name, parts in groups.items():
        missing = [n for n in parts.values() if n not in hf_state]
        if missing:
            raise ValueError(f"megatron bridge: the Hugging Face state lacks {missing}")
        yield mg_name, _fuse({part: hf_state[n] for part, n in parts.items()}, g)


def to_hf(
    params: Mapping[str, torch.Tensor], g: Geometry, hf_names: Iterable[str]
) -> Iterator[tuple[str, torch.Tensor]]:
    """(Hugging Face name, tensor) for each of ``hf_names``, in that order, from Megatron's
    parameters. Unfused tensors are the parameters themselves (no copy); q/k/v and gate/up are
    slices of the fused ones (views, or copies where a view cannot express them)."""
    table = name_table(g)
    for name in hf_names:
        if name not in table:
            raise ValueError(f"megatron bridge: no Megatron source for Hugging Face tensor {name!r}")
        mg_name, part = table[name]
        yield name, _part(params[mg_name], part, g)


def load_into(model: torch.nn.Module, hf_state: Mapping[str, torch.Tensor], g: Geometry) -> None:
    """Copy a Hugging Face state dict into ``model``'s (a ``GPTModel``) parameters, checking that
    every parameter is written exactly once and that the shapes agree."""
    params = dict(model.named_parameters())
    written: set[str] = set()
    with torch.no_grad():
        for name, value in to_megatron(hf_state, g):
            if name not in params:
                raise ValueError(f"megatron bridge: GPTModel has no parameter {name!r}")
            have, got = tuple(params[name].shape), tuple(value.shape)
            if have != got:
                raise ValueError(f"megatron bridge: {name} is {have} in the GPTModel, {got} converted")
            params[name].copy_(value)
            written.add(name)
    left = sorted(set(params) - written)
    if left:
        raise ValueError(f"megatron bridge: GPTModel parameters not loaded: {left}")
