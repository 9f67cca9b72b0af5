"""Packed training forwards (``algo.packing``): the rows of a micro-batch concatenated into
one ``[1, tokens]`` sequence, positions restarting at each row, attention kept within a row.

A padded micro-batch computes ``rows x longest row`` tokens; a packed one computes only its
real tokens, and its token budget counts those. The math is the padded path's: every row
sees only itself (document-causal attention) at its own positions 0..n-1.

How the attention is confined to a row. transformers (5.x) recognises a packed sequence
from ``position_ids`` when no attention mask is given, but for ``sdpa`` and ``eager`` it
then builds a dense ``[1, 1, T, T]`` mask: T² memory (0.3 GB of booleans at 18k tokens)
and attention computed over all T² pairs, 32x the padded path's work for 32 rows.
``flex_attention`` builds a block-sparse mask instead, but transformers compiles it for
static shapes (a recompilation for every new packed length). So a packed forward here
runs an attention function of its own, registered with transformers under
:data:`ATTN_NAME`:

- the row boundaries reach every attention layer as transformers' standard varlen keyword
  arguments (``cu_seq_lens_q``...), passed to the model's forward; they are captured with
  the layer's inputs, so gradient checkpointing's recompute in backward sees them too;
- on CUDA in bf16/fp16 it calls PyTorch's variable-length flash attention
  (``torch.nn.attention.varlen.varlen_attn``): no mask, no padding, no compilation;
- elsewhere (CPU, fp32, a torch without varlen) it runs SDPA once per row, causal;
- any forward without those arguments (HF ``generate``, evaluation) is plain ``sdpa``.

Every keyword transformers passes to an attention function either changes the math or it
does not, and a packed forward honours each one or refuses it (:func:`_window`), never
drops it: a dropped keyword would make the update's log-probs differ from the rollout's.
``scaling`` (Gemma's ``query_pre_attn_scalar``) scales the scores; ``sliding_window`` W
(Mistral, Ministral's and Gemma 3's local layers) lets query i see keys i-W+1..i, as
transformers' ``sliding_window_overlay`` does (``kv_idx > q_idx - W``); dropout, logit
soft-capping, bidirectional attention or an explicit mask are refused.

While a packed forward runs (:func:`packed_forward`), the mask builder registered with the
function returns no mask at all, so the dense mask is never made.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import inspect
import itertools
import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch

from grpo_hpc.core.errors import ConfigError

log = logging.getLogger(__name__)

ATTN_NAME = "grpo_packed_sdpa"
"""The attention implementation a packing run's model uses (sdpa unless packed)."""
_PACKED = contextvars.ContextVar("grpo_packed_forward", default=False)
KEEP = ("flash_attention_2", "flash_attention_3")
"""Implementations that read the varlen arguments themselves: left as they are."""


@dataclass
class Packed:
    """One micro-batch as a single sequence (all tensors on the batch's device)."""

    input_ids: torch.Tensor
    """[1, N] the rows' real tokens, one row after another."""
    position_ids: torch.Tensor
    """[1, N] 0..n_r-1 within each row."""
    cu_seqlens: torch.Tensor
    """[R+1] int32 offsets of the rows in the sequence."""
    max_len: int
    """Longest row (tokens)."""
    head_positions: torch.Tensor
    """[R, C] where completion token t of row r is predicted (clamped into the sequence
    for t past the row's completion: those are masked by the loss)."""

    def model_kwargs(self) -> dict[str, Any]:
        """What the model's forward takes: ids, positions and transformers' varlen keywords
        (read by :func:`packed_attention`, or by flash-attention where that is used)."""
        return {
            "input_ids": self.input_ids,
            "position_ids": self.position_ids,
            "cu_seq_lens_q": self.cu_seqlens,
            "cu_seq_lens_k": self.cu_seqlens,
            "max_length_q": self.max_len,
            "max_length_k": self.max_len,
        }


def pack(
    input_ids: torch.Tensor,
    prompt_len: int,
    lengths: list[tuple[int, int]],
    columns: int,
) -> Packed:
    """Pack rows of a rollout batch: ``input_ids`` [R, P + C'] left-padded prompts of padded
    length ``prompt_len`` then right-padded completions; ``lengths`` the (prompt, completion)
    real tokens of each row, known on the host; ``columns`` the completion columns to
    predict (the longest completion). Index arithmetic runs on the host, once."""
    rows, cols, pos, heads, offset = [], [], [], [], 0
    for r, (p, c) in enumerate(lengths):
        n = p + c
        rows += [r] * n
        cols += range(prompt_len - p, prompt_len + c)
        pos += range(n)
        # Completion token t sits at offset + p + t and is predicted one position earlier.
        heads.append([offset + p - 1 + t for t in range(columns)])
        offset += n
    heads_t = torch.tensor(heads, dtype=torch.long).clamp_(max=offset - 1)
    dev = input_ids.device
    # One host tensor, one copy: the layout of every token (row, column, position).
    layout = host_to_device(torch.tensor([rows, cols, pos], dtype=torch.long), dev)
    cu = torch.tensor([0, *itertools.accumulate(p + c for p, c in lengths)], dtype=torch.int32)
    return Packed(
        input_ids=input_ids[layout[0], layout[1]].unsqueeze(0),
        position_ids=layout[2].unsqueeze(0),
        cu_seqlens=host_to_device(cu, dev),
        max_len=max(p + c for p, c in lengths),
        head_positions=host_to_device(heads_t, dev),
    )


def host_to_device(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    """Host to device without waiting: a copy from pageable memory this large blocks the
    host until the GPU has run everything queued before it (the last micro-batch's
    backward), which would drain the launch queue once per micro-batch."""
    if device.type != "cuda":
        return t.to(device)
    return t.pin_memory().to(device, non_blocking=True)


@contextlib.contextmanager
def packed_forward() -> Iterator[None]:
    """Around the model call of a packed forward: no attention mask is built (the row
    boundaries travel as keyword arguments instead)."""
    token = _PACKED.set(True)
    try:
        yield
    finally:
        _PACKED.reset(token)


def _mask(*args: Any, **kwargs: Any) -> torch.Tensor | None:
    """transformers' mask builder for :data:`ATTN_NAME`: none while a packed forward runs,
    the sdpa mask otherwise."""
    from transformers.masking_utils import sdpa_mask

    return None if _PACKED.get() else sdpa_mask(*args, **kwargs)


def packed_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """transformers attention function (``query`` [B, H, T, D], ``key``/``value``
    [B, Hkv, T, D]; returns [B, T, H, D]): document-causal over the rows that
    ``cu_seq_lens_q`` delimits when given, sdpa otherwise."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    cu = kwargs.get("cu_seq_lens_q")
    if cu is None:
        if _PACKED.get():  # never silently causal over a whole pack
            raise RuntimeError("packed forward without cu_seq_lens_q reaching attention")
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs
        )
    window = _window(module, query, key, attention_mask, dropout, kwargs)
    q, k, v = (x[0].transpose(0, 1) for x in (query, key, value))  # [T, heads, D]
    if q.is_cuda and torch.is_autocast_enabled("cuda"):
        # What autocast does to SDPA's inputs (the padded path): the rotary embedding
        # leaves q and k in fp32 (its cos/sin follow the fp32 embeddings), and the
        # varlen kernel takes only half precision; without this cast every packed forward
        # fell back to per-row SDPA in fp32 (3x slower updates measured on an H100).
        low = torch.get_autocast_dtype("cuda")
        q, k, v = (x.to(low) for x in (q, k, v))
    varlen = varlen_kernel()
    if varlen is not None and q.is_cuda and q.dtype in (torch.float16, torch.bfloat16):
        q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
        out = varlen(q, k, v, cu, int(kwargs["max_length_q"]), scaling, window)
    else:
        out = _per_row(q, k, v, cu.tolist(), scaling, window)
    return out.unsqueeze(0), None


INERT = frozenset(
    {
        "cu_seq_lens_k",  # equal to cu_seq_lens_q (Packed.model_kwargs)
        "max_length_q",
        "max_length_k",
        "position_ids",  # already applied by the rotary embedding before attention
        "use_cache",
        "output_attentions",
        "output_router_logits",  # Qwen3-MoE: the router's outputs, not attention's
    }
)
"""Keywords transformers passes to attention functions that change nothing a packed
forward computes (the row boundaries are read as ``cu_seq_lens_q``)."""


def _window(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float,
    kwargs: dict[str, Any],
) -> int | None:
    """The layer's sliding window (None: plain causal) after refusing, loudly, whatever of
    the call a packed forward cannot honour (an unknown keyword with a value may change the
    math, so it is refused too, naming itself)."""
    known = INERT | {"cu_seq_lens_q", "sliding_window", "softcap", "is_causal"}
    problems = [f"{k}={v!r}" for k, v in kwargs.items() if k not in known and v is not None]
    if dropout:
        problems.append(f"attention dropout {dropout}")
    if kwargs.get("softcap") is not None:
        problems.append(f"attention logit soft-capping {kwargs['softcap']}")
    if kwargs.get("is_causal") is False or not getattr(module, "is_causal", True):
        problems.append("bidirectional attention")
    if attention_mask is not None:  # the mask builder gives none while packed
        problems.append("an attention mask")
    if query.shape[2] != key.shape[2]:
        problems.append("a key/value cache")
    window = kwargs.get("sliding_window")
    if window is not None and (type(window) is not int or window < 1):
        problems.append(f"sliding_window={window!r}")
    if problems:
        raise ConfigError(
            f"packed attention (algo.packing) cannot honour {', '.join(problems)} of "
            f"{type(module).__name__}: set algo.packing=false"
        )
    return window


def _per_row(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    bounds: list[int],
    scale: float | None,
    window: int | None = None,
) -> torch.Tensor:
    """Causal SDPA row by row, within ``window`` keys when given: exact anywhere, one call
    per row (the fallback)."""
    groups = q.shape[1] // k.shape[1]
    sdpa = torch.nn.functional.scaled_dot_product_attention
    outs = []
    for a, b in zip(bounds[:-1], bounds[1:], strict=True):
        qi, ki, vi = (x[a:b].transpose(0, 1) for x in (q, k, v))  # [heads, n, D]
        if groups > 1:
            ki, vi = ki.repeat_interleave(groups, 0), vi.repeat_interleave(groups, 0)
        if window is not None and b - a > window:  # a row within the window: plain causal
            out = sdpa(qi, ki, vi, attn_mask=window_mask(b - a, window, q.device), scale=scale)
        else:
            out = sdpa(qi, ki, vi, is_causal=True, scale=scale)
        outs.append(out.transpose(0, 1))
    return torch.cat(outs, 0)


def window_mask(n: int, window: int, device: torch.device) -> torch.Tensor:
    """[n, n] boolean: query i sees key j where ``i - window < j <= i`` (transformers'
    causal mask with its ``sliding_window_overlay``)."""
    i = torch.arange(n, device=device)
    behind = i[:, None] - i[None, :]  # how far key j lies behind query i
    return (behind >= 0) & (behind < window)


@functools.cache
def varlen_kernel() -> Callable[..., torch.Tensor] | None:
    """PyTorch's varlen flash attention behind one signature, or None. Its keywords changed
    between releases (``is_causal`` in 2.10, ``window_size`` later; ``enable_gqa`` and
    ``scale`` not everywhere), so they are chosen from the installed signature.

    A sliding window W is flash attention's ``window_size=(W - 1, 0)``: query i sees keys
    i-(W-1)..i+0, W keys with itself, as transformers' own flash path passes it
    (``(W - 1, W - 1)`` with causal, the same keys). A torch whose kernel takes no window
    runs windowed layers row by row (:func:`_per_row`), exact but slower.

    None without CUDA: the kernel is CUDA's, and importing it costs 0.4 s of CPU in every
    trainer process (the CPU tests start dozens)."""
    if not torch.cuda.is_available():
        return None
    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError:
        return None
    params = inspect.signature(varlen_attn).parameters
    if "window_size" in params:
        causal = {"window_size": (-1, 0)}
    elif "is_causal" in params:
        causal = {"is_causal": True}
    else:
        return None
    gqa, has_scale = "enable_gqa" in params, "scale" in params

    def call(  # q [T, H, D], k/v [T, Hkv, D], cu [R+1], n the longest row
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        cu: torch.Tensor,
        n: int,
        scale: Any,
        window: int | None = None,
    ) -> torch.Tensor:
        extra: dict[str, Any] = dict(causal)
        if window is not None and window < n:  # a window no row fills changes nothing
            if "window_size" not in params:
                _no_window_kernel()
                return _per_row(q, k, v, cu.tolist(), scale, window)
            extra = {"window_size": (window - 1, 0)}
        groups = q.shape[1] // k.shape[1]
        if groups > 1 and gqa:
            extra["enable_gqa"] = True
        elif groups > 1:  # one K/V head per query head
            k, v = k.repeat_interleave(groups, 1), v.repeat_interleave(groups, 1)
        default = q.shape[-1] ** -0.5
        if scale is not None and abs(scale - default) > 1e-12:
            if not has_scale:
                return _per_row(q, k, v, cu.tolist(), scale, window)
            extra["scale"] = scale
        return varlen_attn(q, k, v, cu, cu, n, n, **extra)

    return call


@functools.cache
def _no_window_kernel() -> None:
    """Say once per process that windowed layers run row by row."""
    log.warning(
        "this torch's varlen_attn takes no window_size: packed sliding-window layers run "
        "attention row by row (exact, slower)"
    )


def use_packed_attention(model: torch.nn.Module) -> str:
    """Make ``model`` (a transformers model, before any wrapper) use :data:`ATTN_NAME`, so
    that packed forwards are document-causal; returns the implementation now in use.
    flash-attention implementations handle packing themselves and are kept."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    current = getattr(model.config, "_attn_implementation", None)
    if current in KEEP:
        return current
    AttentionInterface.register(ATTN_NAME, packed_attention)
    AttentionMaskInterface.register(ATTN_NAME, _mask)
    _no_pack_detection_while_packed()
    model.set_attn_implementation(ATTN_NAME)
    return ATTN_NAME


def _no_pack_detection_while_packed() -> None:
    """transformers looks for packed rows in the position ids before building a mask (a
    device tensor read on the host: one wait for the GPU per forward, found by
    tests/e2e/test_update_gpu.py). In our packed forward the mask builder returns None and
    the boundaries travel as ``cu_seq_lens_q``, so that detection is skipped there; every
    other forward keeps it. Installed once per process."""
    import transformers.masking_utils as masking

    found = masking.find_packed_sequence_indices
    if getattr(found, "_grpo_hpc", False):
        return

    def find(position_ids: torch.Tensor) -> torch.Tensor | None:
        return None if _PACKED.get() else found(position_ids)

    find._grpo_hpc = True  # type: ignore[attr-defined]
    masking.find_packed_sequence_indices = find
