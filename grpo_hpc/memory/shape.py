"""The shape of a decoder-only transformer as memory sees it: every parameter its
``config.json`` implies, as transformers builds it (pure; no torch). Read by
grpo_hpc.memory.estimate; tests/unit/memory/test_memory_families.py holds the count equal to
transformers' for every bench/shapes config."""

from __future__ import annotations

from dataclasses import dataclass

QK_NORM_PER_HEAD = ("qwen3", "qwen3_moe", "gemma3_text")
"""model_types whose q and k RMSNorms have one ``head_dim`` weight each, shared by the heads."""
QK_NORM_WHOLE = ("olmo2",)
"""model_types whose q and k RMSNorms span the whole projection (heads x head_dim)."""
FOUR_NORMS = ("gemma3_text",)
"""model_types with four hidden-sized norms per layer (before and after attention and the
MLP) where the others have two (OLMo 2's two sit after attention and the MLP, not before)."""


@dataclass(frozen=True)
class ModelShape:
    """What memory depends on in a decoder-only transformer's config.json."""

    hidden: int
    """``hidden_size``."""
    layers: int
    """``num_hidden_layers``."""
    heads: int
    """Query heads."""
    kv_heads: int
    """Key/value heads (GQA)."""
    head_dim: int
    """``head_dim`` where the config sets one (Qwen3, Gemma 3, Llama 3.2: not always
    hidden / heads), else hidden / heads."""
    intermediate: int
    """The dense MLP's width (``intermediate_size``)."""
    vocab: int
    """``vocab_size``."""
    tied: bool
    """Input embedding and LM head share one matrix (``tie_word_embeddings``)."""
    model_type: str = "llama"
    """HF ``model_type``: decides the q/k/v biases, q/k norms and norms per layer."""
    qkv_bias: bool = False
    """Biases on q, k and v (Qwen2)."""
    o_bias: bool = False
    """A bias on the attention output too (``attention_bias`` outside Qwen2)."""
    qk_norm: int = 0
    """Weights of the q and k RMSNorms of one layer (QK_NORM_PER_HEAD, QK_NORM_WHOLE)."""
    norms: int = 2
    """Hidden-sized RMSNorm weights per decoder layer (FOUR_NORMS: 4)."""
    experts: int = 0
    """Routed experts of a mixture-of-experts layer (0: dense model)."""
    experts_per_token: int = 0
    """Experts each token is routed to (``num_experts_per_tok``)."""
    expert_intermediate: int = 0
    """One expert's MLP width (``moe_intermediate_size``)."""
    sparse_layers: int = 0
    """Layers whose MLP is the experts (the others keep the dense MLP)."""

    @classmethod
    def from_config(cls, cfg: dict) -> ModelShape:
        heads = int(cfg["num_attention_heads"])
        hidden = int(cfg["hidden_size"])
        kv_heads = int(cfg.get("num_key_value_heads") or heads)
        head_dim = int(cfg.get("head_dim") or hidden // heads)
        layers = int(cfg["num_hidden_layers"])
        mtype = str(cfg.get("model_type", "llama"))
        qk_norm = 0
        if mtype in QK_NORM_PER_HEAD:
            qk_norm = 2 * head_dim
        elif mtype in QK_NORM_WHOLE:
            qk_norm = (heads + kv_heads) * head_dim
        # Qwen3-MoE's num_experts, Mixtral's num_local_experts (whose experts are
        # intermediate_size wide)
        experts = int(cfg.get("num_experts") or cfg.get("num_local_experts") or 0)
        sparse = 0
        if experts:
            step = int(cfg.get("decoder_sparse_step") or 1)
            dense_only = set(cfg.get("mlp_only_layers") or [])
            sparse = sum(1 for i in range(layers) if i not in dense_only and (i + 1) % step == 0)
        bias = bool(cfg.get("attention_bias"))
        return cls(
            hidden=hidden,
            layers=layers,
            heads=heads,
            kv_heads=kv_heads,
            head_dim=head_dim,
            intermediate=int(cfg["intermediate_size"]),
            vocab=int(cfg["vocab_size"]),
            tied=bool(cfg.get("tie_word_embeddings", False)),
            model_type=mtype,
            qkv_bias=mtype == "qwen2" or bias,
            o_bias=bias and mtype != "qwen2",
            qk_norm=qk_norm,
            norms=4 if mtype in FOUR_NORMS else 2,
            experts=experts,
            experts_per_token=int(cfg.get("num_experts_per_tok") or 0) if experts else 0,
            expert_intermediate=(
                int(cfg.get("moe_intermediate_size") or cfg["intermediate_size"]) if experts else 0
            ),
            sparse_layers=sparse,
        )

    @property
    def attn_params(self) -> int:
        """One layer's attention (fused q/k/v as Phi-3's counts the same), its q/k norms and
        the layer's norms; partial rotary and sliding windows own no weights."""
        h, q, kv = self.hidden, self.heads * self.head_dim, self.kv_heads * self.head_dim
        bias = (q + 2 * kv if self.qkv_bias else 0) + (h if self.o_bias else 0)
        return h * (q + 2 * kv) + q * h + bias + self.qk_norm + self.norms * h

    @property
    def dense_mlp_params(self) -> int:
        """gate, up and down (fused gate/up counts the same)."""
        return 3 * self.hidden * self.intermediate

    @property
    def sparse_mlp_params(self) -> int:
        """Every expert's gate, up and down, and the router: all of them are trained, so
        all of them have gradients and AdamW moments, whichever few a token uses."""
        h = self.hidden
        return self.experts * (3 * h * self.expert_intermediate + h)

    @property
    def layer_params(self) -> int:
        """The largest decoder layer (the unit FSDP2 gathers and autocast casts)."""
        mlp = self.sparse_mlp_params if self.sparse_layers else self.dense_mlp_params
        return self.attn_params + mlp

    @property
    def active_intermediate(self) -> int:
        """MLP width a token's activations take in the largest layer: its routed experts'
        together in a mixture of experts, else the dense MLP's."""
        if self.sparse_layers:
            return self.experts_per_token * self.expert_intermediate
        return self.intermediate

    @property
    def embed_params(self) -> int:
        """Embedding plus an untied LM head (the root module under FSDP2) and the final
        norm."""
        return self.vocab * self.hidden * (1 if self.tied else 2) + self.hidden

    @property
    def params(self) -> int:
        dense = self.layers - self.sparse_layers
        mlp = dense * self.dense_mlp_params + self.sparse_layers * self.sparse_mlp_params
        return self.layers * self.attn_params + mlp + self.embed_params

    def packed_adapted_params(self, targets: tuple[str, ...]) -> int:
        """Weights the native engine packs as folded copies under LoRA on ``targets`` (the
        rest of a frozen, unsharded base is read in place): the fused q/k/v matrix if any of
        q/k/v is adapted, the fused gate/up if either is, o and down by themselves."""
        h, i = self.hidden, self.intermediate
        q, kv = self.heads * self.head_dim, self.kv_heads * self.head_dim
        t = set(targets)
        qkv = h * (q + 2 * kv) if t & {"q_proj", "k_proj", "v_proj"} else 0
        gate_up = 2 * h * i if t & {"gate_proj", "up_proj"} else 0
        single = (q * h if "o_proj" in t else 0) + (i * h if "down_proj" in t else 0)
        return self.layers * (qkv + gate_up + single)

    def lora_params(self, rank: int, targets: tuple[str, ...]) -> int:
        h, i = self.hidden, self.intermediate
        q, kv = self.heads * self.head_dim, self.kv_heads * self.head_dim
        dims = {
            "q_proj": h + q, "k_proj": h + kv, "v_proj": h + kv, "o_proj": q + h,
            "gate_proj": h + i, "up_proj": h + i, "down_proj": i + h,
        }  # fmt: skip
        return self.layers * rank * sum(dims.get(t, 0) for t in targets)
