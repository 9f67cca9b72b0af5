"""The policy's weights packed for decoding: one persistent buffer per weight, refilled in
place before every rollout.

Why a packed copy and not the parameters themselves: training keeps fp32 master weights
(autocast computes in bf16/fp16), and decoding reads every weight once per token, so it
must read the low-precision version. Packing once per rollout casts the weights a single
time (autocast would cast them again for every token), fuses q/k/v and gate/up into one
matrix each (fewer, larger matrix products per layer; Phi-3 stores them fused already),
and gives CUDA graphs fixed addresses. Under FSDP2 each sharded parameter is gathered
here, once per rollout, not once per token. The refill is a device-local copy of ~2 bytes
per parameter. Norm weights (input, post-attention, pre/post-feedforward, q/k) are fp32
copies, Gemma's ``1 + w`` added in; the rotary tables are the model's own
(:mod:`architecture`, which also reads the :class:`Shape` that tells the families of
``SUPPORTED_TYPES`` apart).

A LoRA policy (peft) is folded in at the refill: each adapted projection is packed as
``W + scaling * B @ A`` (summed in fp32 over the active, unmerged adapters), so decoding
costs what it costs for full fine-tuning. Plain LoRA on the decoder's projections only
(``PROJECTIONS``: Phi-3's fused ``qkv_proj`` and ``gate_up_proj`` included); other
variants (DoRA, LoRA on embeddings, biased adapters) raise UnsupportedModel.

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

from grpo_hpc.config.rollout_engine import (  # noqa: F401 - re-exported
    SUPPORTED_TYPES,
    native_problem,
)
from grpo_hpc.train.rollout.native.architecture import (  # noqa: F401 - re-exported
    PROJECTIONS,
    Shape,
    UnsupportedModel,
    base_model,
    norms,
    rope_tables,
    shape_of,
)


@dataclass
class LayerWeights:
    attn_norm: torch.Tensor | None
    """[H] fp32 RMSNorm weight before attention (None without pre-norms: OLMo 2)."""
    wqkv: torch.Tensor
    """[(heads + 2 kv_heads) * head_dim, H] fused q/k/v projection."""
    bqkv: torch.Tensor | None
    """Fused q/k/v bias (Qwen2) or None."""
    q_norm: torch.Tensor | None
    """fp32 RMSNorm weight of q: [head_dim] per head or [heads * head_dim] over the whole
    projection (``Shape.qk_norm``); None without."""
    k_norm: torch.Tensor | None
    """fp32 RMSNorm weight of k, as ``q_norm``."""
    wo: torch.Tensor
    """[H, heads * head_dim] attention output projection."""
    attn_out_norm: torch.Tensor | None
    """[H] fp32 RMSNorm weight of the attention's output (post-norms), else None."""
    mlp_norm: torch.Tensor | None
    """[H] fp32 RMSNorm weight before the MLP (None without pre-norms)."""
    wgu: torch.Tensor
    """[2 I, H] fused gate/up projection."""
    wdown: torch.Tensor
    """[H, I] MLP down projection."""
    mlp_out_norm: torch.Tensor | None
    """[H] fp32 RMSNorm weight of the MLP's output (post-norms), else None."""


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
    """[tables, rotary_dim / 2] fp32 rotary inverse frequencies, one row per rotary table
    (``Shape.rope``): the model's own, scaling included (llama3, linear, longrope's short
    factors), copied from its rotary module."""
    rope_scale: tuple[float, ...]
    """Per table: the factor cos and sin are multiplied by (HF's ``attention_scaling``:
    1.0 except for scaled variants such as longrope and yarn)."""


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
        norm_bufs = {
            role: None if m is None else w(s.hidden, dt=torch.float32)
            for role, m in norms(layer, s).items()
        }
        if s.fused_proj:  # already one matrix each in the model (Phi-3)
            wqkv = own_or(att.qkv_proj, s.qkv_out, s.hidden)
            wgu = own_or(mlp.gate_up_proj, 2 * s.intermediate, s.hidden)
        else:
            wqkv = fused_or([att.q_proj, att.k_proj, att.v_proj], s.qkv_out, s.hidden)
            wgu = fused_or([mlp.gate_proj, mlp.up_proj], 2 * s.intermediate, s.hidden)
        qk = s.qk_norm != ""
        layers.append(
            LayerWeights(
                wqkv=wqkv,
                bqkv=w(s.qkv_out) if s.qkv_bias else None,
                q_norm=w(att.q_norm.weight.numel(), dt=torch.float32) if qk else None,
                k_norm=w(att.k_norm.weight.numel(), dt=torch.float32) if qk else None,
                wo=own_or(att.o_proj, s.hidden, q_dim),
                wgu=wgu,
                wdown=own_or(mlp.down_proj, s.hidden, s.intermediate),
                **norm_bufs,
            )
        )
    embed = own_or(model.model.embed_tokens, s.vocab, s.hidden)
    head_dtype = head_dtype or dtype
    share = s.tied and head_dtype == dtype
    tables, _ = rope_tables(model)
    return Packed(
        shape=s,
        embed=embed,
        layers=layers,
        final_norm=w(s.hidden, dt=torch.float32),
        lm_head=embed if share else own_or(model.lm_head, s.vocab, s.hidden, dt=head_dtype),
        inv_freq=torch.stack([t for t, _ in tables]).to(device),
        rope_scale=tuple(scale for _, scale in tables),
    )


def _put(dst: torch.Tensor, src: torch.Tensor) -> None:
    """``dst[:] = src`` unless ``dst`` is ``src``'s own memory (a weight read in place)."""
    if dst.data_ptr() != src.data_ptr():
        dst.copy_(src)


def _put_norm(dst: torch.Tensor | None, norm: torch.nn.Module | None, offset: float) -> None:
    """An fp32 norm weight, plus the family's offset (Gemma: 1 + w, summed in fp32 as HF
    sums it)."""
    if dst is not None and norm is not None:
        dst.copy_(_full(norm.weight))
        if offset:
            dst.add_(offset)


@torch.no_grad()
def refill(packed: Packed, model: torch.nn.Module) -> None:
    """Copy (and cast) the model's current weights into ``packed``, in place (LoRA folded);
    weights read in place are skipped (and copied if the model replaced them since)."""
    model = base_model(model)
    s, inner = packed.shape, model.model
    _put(packed.embed, _full(inner.embed_tokens.weight))
    if packed.lm_head is not packed.embed:  # untied, or tied but a head of its own dtype
        _put(packed.lm_head, _full(model.lm_head.weight))
    _put_norm(packed.final_norm, inner.norm, s.norm_offset)
    nq, nkv = s.heads * s.head_dim, s.kv_heads * s.head_dim
    for dst, layer in zip(packed.layers, inner.layers, strict=True):
        att, mlp = layer.self_attn, layer.mlp
        for role, norm in norms(layer, s).items():
            _put_norm(getattr(dst, role), norm, s.norm_offset)
        _put_norm(dst.q_norm, getattr(att, "q_norm", None), s.norm_offset)
        _put_norm(dst.k_norm, getattr(att, "k_norm", None), s.norm_offset)
        _put(dst.wo, _weight(att.o_proj))
        _put(dst.wdown, _weight(mlp.down_proj))
        if s.fused_proj:
            _put(dst.wqkv, _weight(att.qkv_proj))
            if dst.bqkv is not None:
                dst.bqkv.copy_(_full(att.qkv_proj.bias))
            _put(dst.wgu, _weight(mlp.gate_up_proj))
            continue
        for part, lo, hi in ((att.q_proj, 0, nq), (att.k_proj, nq, nq + nkv)):
            _put(dst.wqkv[lo:hi], _weight(part))
            if dst.bqkv is not None:
                dst.bqkv[lo:hi].copy_(_full(part.bias))
        _put(dst.wqkv[nq + nkv :], _weight(att.v_proj))
        if dst.bqkv is not None:
            dst.bqkv[nq + nkv :].copy_(_full(att.v_proj.bias))
        _put(dst.wgu[: s.intermediate], _weight(mlp.gate_proj))
        _put(dst.wgu[s.intermediate :], _weight(mlp.up_proj))
