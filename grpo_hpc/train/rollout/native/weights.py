"""The policy's weights packed for decoding: one persistent buffer per weight, refilled in
place before every rollout.

Why a packed copy and not the parameters themselves: training keeps fp32 master weights
(autocast computes in bf16/fp16), and decoding reads every weight once per token, so it
must read the low-precision version. Packing once per rollout casts the weights a single
time (autocast would cast them again for every token), fuses q/k/v and gate/up into one
matrix each (fewer, larger matrix products per layer), and gives CUDA graphs fixed
addresses. Under FSDP2 each sharded parameter is gathered here, once per rollout, not
once per token. The refill is a device-local copy of ~2 bytes per parameter.

A LoRA policy (peft) is folded in at the refill: each adapted projection is packed as
``W + scaling * B @ A`` (summed in fp32 over the active, unmerged adapters), so decoding
costs what it costs for full fine-tuning. Plain LoRA on the decoder's projections only;
other variants (DoRA, LoRA on embeddings, biased adapters) raise UnsupportedModel.

No second copy of a frozen base (LoRA on one GPU or DDP): a weight the engine would only
copy unchanged (a frozen, unsharded tensor already in the engine's dtype and device, of a
linear without adapters, or the embedding) is read in place. For the fused q/k/v and
gate/up matrices the base's own weights are moved, once, into one buffer and left there as
views of it, so training and decoding read the same memory. At 7B with adapters on
q/k/v/o only the attention projections are packed: 1.5 GiB instead of 14.2 GiB.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from grpo_hpc.config.rollout_engine import (  # noqa: F401 - SUPPORTED_TYPES re-exported
    SUPPORTED_TYPES,
    native_problem,
)


class UnsupportedModel(ValueError):
    """The model's architecture is not one the native engine implements."""


@dataclass(frozen=True)
class Shape:
    """What the decode math needs to know about the architecture."""

    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    eps: float
    qkv_bias: bool
    tied: bool

    @property
    def qkv_out(self) -> int:
        return (self.heads + 2 * self.kv_heads) * self.head_dim


@dataclass
class LayerWeights:
    in_norm: torch.Tensor
    """[H] fp32 RMSNorm weight before attention."""
    wqkv: torch.Tensor
    """[(heads + 2 kv_heads) * head_dim, H] fused q/k/v projection."""
    bqkv: torch.Tensor | None
    """Fused q/k/v bias (Qwen2) or None."""
    wo: torch.Tensor
    """[H, heads * head_dim] attention output projection."""
    post_norm: torch.Tensor
    """[H] fp32 RMSNorm weight before the MLP."""
    wgu: torch.Tensor
    """[2 I, H] fused gate/up projection."""
    wdown: torch.Tensor
    """[H, I] MLP down projection."""


@dataclass
class Packed:
    shape: Shape
    embed: torch.Tensor
    """[V, H] token embeddings (compute dtype)."""
    layers: list[LayerWeights]
    final_norm: torch.Tensor
    """[H] fp32."""
    lm_head: torch.Tensor
    """[V, H]; the same tensor as ``embed`` when the model ties them (and the head has the
    compute dtype); fp32 with ``algo.fp32_lm_head``."""
    inv_freq: torch.Tensor
    """[head_dim / 2] fp32 rotary inverse frequencies (the model's own, scaling included)."""
    rope_scale: float
    """Rotary attention scaling (1.0 except for some scaled-rope variants)."""


PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
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


def lora_delta(part: torch.nn.Module) -> torch.Tensor | None:
    """``sum scaling * B @ A`` (fp32) over the active adapters of a peft LoRA linear that are
    not merged into its weight; None for a plain linear or disabled adapters."""
    if not hasattr(part, "lora_A") or part.disable_adapters:
        return None
    delta = None
    for name in part.active_adapters:
        if name not in part.lora_A or name in part.merged_adapters:
            continue
        a = _full(part.lora_A[name].weight).float()
        b = _full(part.lora_B[name].weight).float()
        d = (b @ a) * part.scaling[name]
        delta = d if delta is None else delta + d
    return delta


def _weight(part: torch.nn.Module) -> torch.Tensor:
    """A projection's effective weight: its (gathered) weight plus any LoRA delta."""
    w = _full(part.weight)
    d = lora_delta(part)
    return w if d is None else w.float() + d


def shape_of(model: torch.nn.Module) -> Shape:
    """Read the architecture from an HF causal LM (or a peft LoRA model around one); raise
    UnsupportedModel otherwise."""
    model = base_model(model)
    _check_lora(model)
    cfg = getattr(model, "config", None)
    if problem := native_problem(cfg):  # what config.json tells (grpo-submit asks too)
        raise UnsupportedModel(problem)
    heads = cfg.num_attention_heads
    layer0 = model.model.layers[0]
    return Shape(
        layers=cfg.num_hidden_layers,
        hidden=cfg.hidden_size,
        heads=heads,
        kv_heads=getattr(cfg, "num_key_value_heads", None) or heads,
        head_dim=getattr(cfg, "head_dim", None) or cfg.hidden_size // heads,
        intermediate=cfg.intermediate_size,
        vocab=cfg.vocab_size,
        eps=float(cfg.rms_norm_eps),
        qkv_bias=layer0.self_attn.q_proj.bias is not None,
        tied=model.lm_head.weight is model.model.embed_tokens.weight
        or bool(getattr(cfg, "tie_word_embeddings", False)),
    )


def _full(t: torch.Tensor) -> torch.Tensor:
    """A parameter as a plain full tensor (gathers an FSDP2 DTensor shard: a collective,
    so every rank packs in the same order). A shard offloaded to host memory
    (``dist.cpu_offload``) moves to the mesh's device first: NCCL gathers device tensors."""
    t = t.detach()
    if not hasattr(t, "full_tensor"):
        return t
    mesh_device = t.device_mesh.device_type
    return (t if t.device.type == mesh_device else t.to(mesh_device)).full_tensor()


def _in_place(weight: torch.Tensor, dtype: torch.dtype, device: torch.device) -> bool:
    """Whether decoding may read ``weight`` where it lies: frozen (a trained weight is fp32
    master here anyway), unsharded, in the engine's dtype, on its device."""
    return (
        not weight.requires_grad
        and not hasattr(weight, "full_tensor")
        and weight.dtype == dtype
        and weight.device.type == device.type
        and (device.index is None or weight.device.index == device.index)
    )


def _reusable(part: torch.nn.Module, dtype: torch.dtype, device: torch.device) -> bool:
    """A module whose packed weight would be a plain copy of its own (no LoRA to fold)."""
    return not hasattr(part, "lora_A") and _in_place(part.weight, dtype, device)


def _contiguous_run(ws: list[torch.Tensor]) -> torch.Tensor | None:
    """The tensors ``ws`` stacked along dim 0, as a view, if they already lie one after
    another in one storage (moved there by an earlier :func:`_fuse_in_place`)."""
    first, offset = ws[0], ws[0].storage_offset()
    for w in ws:
        same = w.untyped_storage().data_ptr() == first.untyped_storage().data_ptr()
        if not (same and w.is_contiguous() and w.storage_offset() == offset):
            return None
        offset += w.numel()
    rows = sum(w.shape[0] for w in ws)
    return first.as_strided((rows, first.shape[1]), first.stride(), first.storage_offset())


def _fuse_in_place(parts: list[torch.nn.Module]) -> torch.Tensor:
    """One ``[sum rows, H]`` buffer holding the weights of ``parts`` (reusable linears), with
    each part's weight re-pointed to its rows: the base keeps one copy, shared with the
    engine. Idempotent: weights fused before are returned as the same view."""
    ws = [p.weight.detach() for p in parts]
    fused = _contiguous_run(ws)
    if fused is not None:
        return fused
    fused = torch.cat(ws, 0)
    lo = 0
    for p, w in zip(parts, ws, strict=True):
        p.weight.data = fused[lo : lo + w.shape[0]]  # same values; old storage freed
        lo += w.shape[0]
    return fused


def allocate(
    model: torch.nn.Module,
    dtype: torch.dtype,
    device: torch.device,
    head_dtype: torch.dtype | None = None,
) -> Packed:
    """Buffers of the right shapes (filled by :func:`refill`); a frozen base weight that
    needs no folding is used in place (see the module docstring). ``head_dtype``: the LM
    head's (fp32 for ``algo.fp32_lm_head``; default ``dtype``)."""
    s = shape_of(model)
    model = base_model(model)

    def w(*size: int, dt: torch.dtype = dtype) -> torch.Tensor:
        return torch.empty(*size, dtype=dt, device=device)

    def own_or(part: torch.nn.Module, *size: int, dt: torch.dtype = dtype) -> torch.Tensor:
        return part.weight.detach() if _reusable(part, dt, device) else w(*size, dt=dt)

    def fused_or(parts: list[torch.nn.Module], *size: int) -> torch.Tensor:
        ok = all(_reusable(p, dtype, device) for p in parts)
        return _fuse_in_place(parts) if ok else w(*size)

    q_dim = s.heads * s.head_dim
    layers = []
    for layer in model.model.layers:
        att, mlp = layer.self_attn, layer.mlp
        layers.append(
            LayerWeights(
                in_norm=w(s.hidden, dt=torch.float32),
                wqkv=fused_or([att.q_proj, att.k_proj, att.v_proj], s.qkv_out, s.hidden),
                bqkv=w(s.qkv_out) if s.qkv_bias else None,
                wo=own_or(att.o_proj, s.hidden, q_dim),
                post_norm=w(s.hidden, dt=torch.float32),
                wgu=fused_or([mlp.gate_proj, mlp.up_proj], 2 * s.intermediate, s.hidden),
                wdown=own_or(mlp.down_proj, s.hidden, s.intermediate),
            )
        )
    embed = own_or(model.model.embed_tokens, s.vocab, s.hidden)
    head_dtype = head_dtype or dtype
    share = s.tied and head_dtype == dtype
    rot = model.model.rotary_emb
    return Packed(
        shape=s,
        embed=embed,
        layers=layers,
        final_norm=w(s.hidden, dt=torch.float32),
        lm_head=embed if share else own_or(model.lm_head, s.vocab, s.hidden, dt=head_dtype),
        inv_freq=rot.inv_freq.detach().float().to(device).clone(),
        rope_scale=float(getattr(rot, "attention_scaling", 1.0)),
    )


def _put(dst: torch.Tensor, src: torch.Tensor) -> None:
    """``dst[:] = src`` unless ``dst`` is ``src``'s own memory (a weight read in place)."""
    if dst.data_ptr() != src.data_ptr():
        dst.copy_(src)


@torch.no_grad()
def refill(packed: Packed, model: torch.nn.Module) -> None:
    """Copy (and cast) the model's current weights into ``packed``, in place (LoRA folded);
    weights read in place are skipped (and copied if the model replaced them since)."""
    model = base_model(model)
    s, inner = packed.shape, model.model
    _put(packed.embed, _full(inner.embed_tokens.weight))
    if packed.lm_head is not packed.embed:  # untied, or tied but a head of its own dtype
        _put(packed.lm_head, _full(model.lm_head.weight))
    packed.final_norm.copy_(_full(inner.norm.weight))
    nq, nkv = s.heads * s.head_dim, s.kv_heads * s.head_dim
    for dst, layer in zip(packed.layers, inner.layers, strict=True):
        att, mlp = layer.self_attn, layer.mlp
        dst.in_norm.copy_(_full(layer.input_layernorm.weight))
        dst.post_norm.copy_(_full(layer.post_attention_layernorm.weight))
        for part, lo, hi in ((att.q_proj, 0, nq), (att.k_proj, nq, nq + nkv)):
            _put(dst.wqkv[lo:hi], _weight(part))
            if dst.bqkv is not None:
                dst.bqkv[lo:hi].copy_(_full(part.bias))
        _put(dst.wqkv[nq + nkv :], _weight(att.v_proj))
        if dst.bqkv is not None:
            dst.bqkv[nq + nkv :].copy_(_full(att.v_proj.bias))
        _put(dst.wo, _weight(att.o_proj))
        _put(dst.wgu[: s.intermediate], _weight(mlp.gate_proj))
        _put(dst.wgu[s.intermediate :], _weight(mlp.up_proj))
        _put(dst.wdown, _weight(mlp.down_proj))
