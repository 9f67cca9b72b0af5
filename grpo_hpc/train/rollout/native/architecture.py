"""What the native engine reads of an HF causal LM before packing it: whether it can
decode it at all (:func:`shape_of` raises :class:`UnsupportedModel`: config.json's
reasons through ``native_problem``, the one rule grpo-submit applies too, plus what only
the loaded model shows), and the :class:`Shape` that tells the families apart: the
switches of the one decoder layer (grpo_hpc.train.rollout.native.forward), read from the
model's config and modules. Also each layer's norms by role and the model's rotary
tables, which :mod:`weights` packs."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from grpo_hpc.config.rollout_engine import LORA_PROJECTIONS, native_problem, rope_limit


class UnsupportedModel(ValueError):
    """The model's architecture is not one the native engine implements."""


@dataclass(frozen=True)
class Shape:
    """What the decode math needs to know about the architecture: the families differ
    only in these fields (read from the loaded model by :func:`shape_of`), never in code
    of their own."""

    layers: int
    """Decoder layers."""
    hidden: int
    """Width of the residual stream."""
    heads: int
    """Query heads."""
    kv_heads: int
    """Key/value heads (grouped-query attention: ``heads`` is a multiple)."""
    head_dim: int
    """Size of one head (Qwen3, Gemma 3: set apart from ``hidden / heads``)."""
    intermediate: int
    """MLP width."""
    vocab: int
    """Rows of the embedding and the LM head."""
    eps: float
    """RMSNorm epsilon (every norm of the model)."""
    qkv_bias: bool
    """q/k/v projections have biases (Qwen2)."""
    tied: bool
    """The LM head is the embedding matrix."""
    rotary_dim: int = 0
    """Leading dimensions of each head that rotate (``head_dim``; less with Phi-3's
    partial rotary, the rest passes through). 0: ``head_dim``."""
    rope: tuple[int, ...] = ()
    """Per layer: the row of ``Packed.inv_freq`` its rotary uses (Gemma 3: one table per
    layer type; SmolLM3's layers without rotary: an all-zero table, cos 1 and sin 0, which
    leaves q and k exactly as they are). Empty: table 0 everywhere."""
    window: tuple[int, ...] = ()
    """Per layer: the sliding window, in tokens (a query at slot p sees slots
    ``p - window + 1 .. p``, itself included, as HF's ``sliding_window_overlay``:
    ``kv_idx > q_idx - window``); 0: every earlier token. Empty: 0 everywhere."""
    qk_norm: str = ""
    """RMSNorm of q and k after the projection, before rotary: ``"head"`` over each head
    (Qwen3, Gemma 3), ``"all"`` over the whole projection, all heads at once (OLMo 2),
    ``""`` none."""
    pre_norms: bool = True
    """RMSNorm of the layer's input before attention and before the MLP (all but OLMo 2)."""
    post_norms: bool = False
    """RMSNorm of the attention's and the MLP's output before each joins the residual
    (OLMo 2, Gemma 3)."""
    norm_offset: float = 0.0
    """Added to every norm weight when packed: Gemma's RMSNorm scales by ``1 + w`` (in
    fp32, as the packed fp32 norm weight then does)."""
    embed_scale: float = 1.0
    """Embeddings are multiplied by this after the lookup, in fp32 (Gemma: sqrt(hidden),
    rounded to the embedding weight's dtype as HF rounds it)."""
    attn_scale: float = 0.0
    """Attention scores' scale (Gemma 3: ``query_pre_attn_scalar ** -0.5``). 0:
    ``head_dim ** -0.5``."""
    gelu: bool = False
    """The MLP's activation is GELU with the tanh approximation (Gemma), not SiLU."""
    fused_proj: bool = False
    """The HF model holds q/k/v as one ``qkv_proj`` and gate/up as one ``gate_up_proj``
    (Phi-3): packed as they are, in the same row order as the fused buffers."""
    rope_limit: int = 0
    """Longest sequence (prompt + completion) the rotary tables hold for; 0: any. Phi-3's
    longrope: HF switches to its long factors past ``original_max_position_embeddings``
    (from one forward call to the next, by the batch's largest position), which this
    engine does not do: it refuses longer rollouts (:meth:`check_length`)."""

    @property
    def qkv_out(self) -> int:
        return (self.heads + 2 * self.kv_heads) * self.head_dim

    def layer_rope(self, layer: int) -> int:
        """The rotary table of ``layer``."""
        return self.rope[layer] if self.rope else 0

    def layer_window(self, layer: int) -> int:
        """The sliding window of ``layer`` (0: none)."""
        return self.window[layer] if self.window else 0

    def check_length(self, tokens: int) -> None:
        """Raise UnsupportedModel when sequences of ``tokens`` exceed ``rope_limit``."""
        if self.rope_limit and tokens > self.rope_limit:
            raise UnsupportedModel(
                f"sequences of {tokens} tokens (prompt + rollout.max_new_tokens): longrope's "
                f"long factors past original_max_position_embeddings={self.rope_limit} are "
                "not implemented natively; use rollout.engine=hf or shorter sequences"
            )


PROJECTIONS = LORA_PROJECTIONS
"""The decoder-layer linears the packed weights hold (LoRA may adapt any of these)."""


def base_model(model: torch.nn.Module) -> torch.nn.Module:
    """The HF causal LM inside a peft wrapper (its LoRA layers in place), else ``model``."""
    get = getattr(model, "get_base_model", None)
    return get() if callable(get) else model


def _check_lora(model: torch.nn.Module) -> None:
    """Plain LoRA on the packed projections only (what :func:`lora_delta` folds)."""
    for name, mod in model.named_modules():
        if not hasattr(mod, "lora_A"):
            continue
        if name.rsplit(".", 1)[-1] not in PROJECTIONS:
            raise UnsupportedModel(f"LoRA on {name} (native engine folds {PROJECTIONS})")
        variant = getattr(mod, "lora_variant", {})
        if any(a in variant for a in mod.active_adapters) or getattr(mod, "fan_in_fan_out", 0):
            raise UnsupportedModel(f"a LoRA variant on {name} (native engine folds plain LoRA)")
        if any(getattr(b, "bias", None) is not None for b in mod.lora_B.values()):
            raise UnsupportedModel(f"LoRA with a bias on {name}")


def shape_of(model: torch.nn.Module) -> Shape:
    """Read the architecture from an HF causal LM (or a peft LoRA model around one); raise
    UnsupportedModel otherwise."""
    model = base_model(model)
    _check_lora(model)
    cfg = getattr(model, "config", None)
    if problem := native_problem(cfg):  # what config.json tells (grpo-submit asks too)
        raise UnsupportedModel(problem)
    inner = model.model
    layer0, heads = inner.layers[0], cfg.num_attention_heads
    att = layer0.self_attn
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // heads
    fused = hasattr(att, "qkv_proj")
    if getattr(att.o_proj, "bias", None) is not None:
        raise UnsupportedModel("an attention output bias")
    q_norm = getattr(att, "q_norm", None)
    tables, rope = rope_tables(model)
    act = getattr(cfg, "hidden_activation", None) or cfg.hidden_act
    emb = inner.embed_tokens
    scale = getattr(emb, "embed_scale", None)  # Gemma's sqrt(hidden), an fp32 buffer
    if scale is not None:  # HF rounds it to the weight's dtype (from the float if kept)
        raw = getattr(emb, "scalar_embed_scale", None)
        scale = scale if raw is None else torch.tensor(raw, dtype=scale.dtype)
    return Shape(
        layers=cfg.num_hidden_layers,
        hidden=cfg.hidden_size,
        heads=heads,
        kv_heads=getattr(cfg, "num_key_value_heads", None) or heads,
        head_dim=head_dim,
        intermediate=cfg.intermediate_size,
        vocab=cfg.vocab_size,
        eps=float(cfg.rms_norm_eps),
        qkv_bias=(att.qkv_proj if fused else att.q_proj).bias is not None,
        tied=model.lm_head.weight is emb.weight or bool(getattr(cfg, "tie_word_embeddings", False)),
        rotary_dim=2 * tables[0][0].numel(),
        rope=rope,
        window=_windows(cfg),
        qk_norm="" if q_norm is None else "head" if q_norm.weight.numel() == head_dim else "all",
        pre_norms=hasattr(layer0, "input_layernorm"),
        post_norms=hasattr(layer0, "post_feedforward_layernorm"),
        # Gemma's RMSNorm scales by (1 + w): its weights are stored centred on 0
        norm_offset=1.0 if cfg.model_type.startswith("gemma") else 0.0,
        embed_scale=1.0 if scale is None else float(scale.to(emb.weight.dtype)),
        attn_scale=float(att.scaling),
        gelu=act == "gelu_pytorch_tanh",
        fused_proj=fused,
        rope_limit=_rope_limit(cfg),
    )


def _windows(cfg: object) -> tuple[int, ...]:
    """Each layer's sliding window (0: none), as HF's masks apply it: Mistral and Phi-3
    window every layer when ``sliding_window`` is set; the others (Ministral, Qwen2/3,
    SmolLM3, Gemma 3) the layers ``layer_types`` calls ``sliding_attention`` (Qwen2/3's
    config sets ``sliding_window`` to None unless ``use_sliding_window``)."""
    window = int(getattr(cfg, "sliding_window", None) or 0)
    types = getattr(cfg, "layer_types", None)
    if cfg.model_type in ("mistral", "phi3") or types is None:
        return (window,) * cfg.num_hidden_layers
    return tuple(window if t == "sliding_attention" else 0 for t in types)


def _rope_limit(cfg: object) -> int:
    """``original_max_position_embeddings`` for longrope (its short factors hold up to
    there), else 0: the rule grpo-submit applies to config.json."""
    return rope_limit(cfg)


def _inv_freq(rot: torch.nn.Module, prefix: str) -> torch.Tensor:
    """A rotary module's inverse frequencies as it built them (``original_inv_freq``): HF's
    longrope overwrites ``inv_freq`` with the long factors' once it has seen a sequence
    past ``original_max_position_embeddings``; the original holds the short factors."""
    t = getattr(rot, f"{prefix}original_inv_freq", None)
    return (getattr(rot, f"{prefix}inv_freq") if t is None else t).detach().float()


def rope_tables(
    model: torch.nn.Module,
) -> tuple[list[tuple[torch.Tensor, float]], tuple[int, ...]]:
    """The model's rotary tables ((inverse frequencies, attention scaling), copied from its
    own rotary module, so every scaling HF implements statically is right by construction)
    and each layer's table: one table, or one per layer type (Gemma 3: local and global
    bases, linear scaling on the global layers), plus an all-zero table for SmolLM3's
    layers without rotary (``no_rope_layers[i] == 0``)."""
    cfg, rot = model.config, model.model.rotary_emb
    if isinstance(getattr(rot, "rope_type", None), dict):  # one rotary per layer type
        kinds = list(rot.rope_type)
        tables = [
            (_inv_freq(rot, f"{k}_"), float(getattr(rot, f"{k}_attention_scaling"))) for k in kinds
        ]
        index = [kinds.index(t) for t in cfg.layer_types]
    else:
        tables = [(_inv_freq(rot, ""), float(getattr(rot, "attention_scaling", 1.0)))]
        index = [0] * cfg.num_hidden_layers
    flags = getattr(cfg, "no_rope_layers", None)
    if flags is not None and not all(flags):
        # cos 1, sin 0 at every position: rotary leaves q and k exactly as they are
        tables.append((torch.zeros_like(tables[0][0]), 1.0))
        index = [i if use else len(tables) - 1 for i, use in zip(index, flags, strict=True)]
    return tables, tuple(index)


def norms(layer: torch.nn.Module, s: Shape) -> dict[str, torch.nn.Module | None]:
    """A decoder layer's norms by role. HF's names mean different places per family:
    ``post_attention_layernorm`` is the norm before the MLP in Llama, but the norm of the
    attention's output where the layer has ``post_feedforward_layernorm`` (OLMo 2, Gemma 3,
    whose norm before the MLP is ``pre_feedforward_layernorm``)."""
    get = lambda name: getattr(layer, name, None)  # noqa: E731
    if s.post_norms:
        return {
            "attn_norm": get("input_layernorm"),
            "attn_out_norm": get("post_attention_layernorm"),
            "mlp_norm": get("pre_feedforward_layernorm"),
            "mlp_out_norm": get("post_feedforward_layernorm"),
        }
    return {
        "attn_norm": get("input_layernorm"),
        "attn_out_norm": None,
        "mlp_norm": get("post_attention_layernorm"),
        "mlp_out_norm": None,
    }
