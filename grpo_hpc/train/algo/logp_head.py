"""Log-probabilities of chosen tokens straight from hidden states: the LM head fused with
the selection, so the ``[tokens, vocab]`` logits never exist in full.

For a vocabulary of 152k, the logits of one 4k-token micro-batch are 1.2 GB in bf16 and
2.5 GB in fp32, and a plain ``log_softmax`` keeps several such tensors for backward. Here
the head's matrix product runs ``chunk`` tokens at a time; forward keeps only the
log-sum-exp per token, and backward recomputes each chunk's logits and uses

    d log p_y / d z_k = 1[k = y] - softmax(z)_k,   z = h W^T,
    dL/dh = (dL/dz) W,   dL/dW = sum over tokens (dL/dz)^T h.

Peak extra memory is one chunk of logits, in fp32 (the softmax is always taken in fp32).

With a sampling temperature ``T`` (``algo.tempered_logp``) the logits are ``z = h W^T / T``,
the distribution the completions were drawn from; the chain rule adds the factor ``1/T``
to both gradients.

The product ``h W^T`` runs in the autocast dtype (bf16 on a GPU), so each logit is rounded
to 8 significant bits: at |z| of 16-32 a step of 0.125. The engine rounds its own logits
the same way from slightly different hidden states, and the two roundings disagree where
a value lies near a step. ``Scoring.fp32`` (``algo.fp32_lm_head``) takes the product in
fp32 instead, on both sides (the fix MiniMax-M1 reported for the same mismatch).

:func:`fused_logp_head` installs this as the model's LM head for one forward, so the
forward still goes through the DDP/FSDP wrapper (hooks, gradient sync, unsharding).
The head is ``h W^T`` exactly: a tied head (Llama 3.2, Qwen3, Gemma 3, Phi-4-mini, SmolLM3)
is the embedding matrix itself, so its gradient reaches the embedding through the same
parameter, and Gemma's ``sqrt(hidden)`` scale belongs to the embedding's forward, not the
head. A model whose logits are more than that (a bias, Gemma 2's
``final_logit_softcapping``, a logit scale, an adapter on the head) is refused here
(:func:`head_problem`), never scored without it: the update scores such a model from its
own logits instead (grpo_hpc.train.algo.update, slower and with [rows, tokens, vocab]
logits in memory).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch
from torch.autograd.function import once_differentiable

from grpo_hpc.core.errors import ConfigError

DEFAULT_CHUNK_TOKENS = 1024


@dataclass(frozen=True)
class Scoring:
    """How the update scores a completion token (the native engine reports its log-probs
    the same way, so that the two can be compared)."""

    temperature: float = 1.0
    """Log-probs of ``softmax(logits / temperature)`` (``Config.logp_temperature``)."""
    fp32: bool = False
    """The LM head's product in fp32 instead of the autocast dtype (``algo.fp32_lm_head``)."""


def _compute_dtype(weight: torch.Tensor) -> torch.dtype:
    dev = weight.device.type
    if torch.is_autocast_enabled(dev):
        return torch.get_autocast_dtype(dev)
    return weight.dtype


def chunk_stats(
    logits: torch.Tensor, ids: torch.Tensor, inv_t: float, acc: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Of one chunk's logits [n, V] (the head's product, before the temperature): the
    log-sum-exp, the chosen token's logit and the entropy of ``softmax(z)``, ``z = logits
    * inv_t`` in ``acc`` (fp32)."""
    z = logits.to(acc) * inv_t
    lse = torch.logsumexp(z, -1)
    chosen = z.gather(-1, ids[:, None])[:, 0]
    p = torch.exp(z - lse[:, None])
    return lse, chosen, lse - (p * z).sum(-1)


def chunk_grad(
    logits: torch.Tensor,
    lse: torch.Tensor,
    ids: torch.Tensor,
    grad_logp: torch.Tensor,
    inv_t: float,
    acc: torch.dtype,
    out: torch.dtype,
) -> torch.Tensor:
    """``dL/d(logits)`` of one chunk, in dtype ``out``: ``g (1[k = y] - softmax(z)_k) / T``
    with ``g = dL/d log p_y``, built in place (one [n, V] temporary besides the exp)."""
    g = grad_logp.to(acc)[:, None] * inv_t  # d z / d(h W^T) = 1/T
    d = -g * torch.exp(logits.to(acc) * inv_t - lse[:, None])
    d.scatter_add_(-1, ids[:, None], g)
    return d.to(out)


def chunk_grad_fusable(
    logits: torch.Tensor,
    lse: torch.Tensor,
    ids: torch.Tensor,
    grad_logp: torch.Tensor,
    inv_t: float,
    acc: torch.dtype,
    out: torch.dtype,
) -> torch.Tensor:
    """:func:`chunk_grad` as one elementwise expression (no scatter), the form a compiler
    fuses into one pass over the logits; ``g - g p`` equals the scatter-add's ``(-g p) +
    g`` bit for bit. Eager it would hold four [n, V] temporaries, so it is only compiled."""
    g = grad_logp.to(acc)[:, None] * inv_t
    gp = g * torch.exp(logits.to(acc) * inv_t - lse[:, None])
    hit = torch.arange(logits.shape[-1], device=logits.device) == ids[:, None]
    return torch.where(hit, g - gp, -gp).to(out)


@dataclass
class _ChunkFns:
    stats: Callable[..., tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = chunk_stats
    grad: Callable[..., torch.Tensor] = chunk_grad


_CHUNK = _ChunkFns()
_EAGER = _ChunkFns()


def chunk_slices(n: int, chunk: int) -> list[slice]:
    """The head's chunks of ``n`` tokens (pure): ``chunk`` tokens each, the last one longer
    by a 1-token tail. Compiled chunk functions specialise a dimension of size 1 (Dynamo's
    0/1 specialisation), so a 1-row chunk would compile two more graphs (forward and
    backward) at whatever step a micro-batch first held ``k * chunk + 1`` completion tokens
    (tests/unit/train/algo/test_logp_head_compiled.py)."""
    starts = list(range(0, n, chunk))
    if len(starts) > 1 and n - starts[-1] == 1:
        starts.pop()
    return [slice(s, e) for s, e in zip(starts, [*starts[1:], n], strict=False)]


def _fns(rows: int) -> _ChunkFns:
    """The chunk functions for a chunk of ``rows`` rows: a run of one token in all (a
    micro-batch with one completion token) stays eager, for the same reason."""
    return _EAGER if rows == 1 else _CHUNK


def _rows_vary(*tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """``tensors`` with their row dimension marked dynamic for the compiled chunk functions.
    Left to itself, Dynamo compiles the first size it meets as a constant and compiles
    again, dynamic, at the first other size. A packed micro-batch scores ``rows x longest
    completion`` tokens, so while some completion in every micro-batch reaches
    ``max_new_tokens`` (8 x 256 = 2048) every chunk is exactly 1024 rows, and the first
    micro-batch whose completions all stop early recompiles both functions at a step deep
    into the run (2026-11-26 on 2x H100: step 25 of 30, +1.7 s). Marked from the first
    call, one compilation serves every size; the vocabulary stays a constant."""
    if _CHUNK.stats is not chunk_stats:  # compiled (compile_chunks)
        for t in tensors:
            torch._dynamo.maybe_mark_dynamic(t, 0)
    return tensors


def compile_chunks() -> None:
    """Compile the head's per-chunk softmax arithmetic (``dist.compile``; the trainer calls
    this where it compiles the decoder layers). Eager, each chunk makes about ten passes
    over its [1024, vocab] fp32 logits, which cost more than the head's four matrix
    products (bench/results/LOG.md, the head's arithmetic); compiled, one pass forward and one in
    backward read the products' bf16 output. Same arithmetic: the fp32 gradients are the
    eager ones (tests/unit/train/algo/test_logp_head_compiled.py)."""
    _CHUNK.stats = torch.compile(chunk_stats, dynamic=None, fullgraph=True)
    _CHUNK.grad = torch.compile(chunk_grad_fusable, dynamic=None, fullgraph=True)


def _gemm_accumulates(acc: torch.Tensor, a: torch.Tensor) -> bool:
    """Can one GEMM add ``a @ b`` (bf16) into the fp32 ``acc`` in place? CUDA's ``addmm``
    with ``out_dtype`` (PyTorch >= 2.8) multiplies in bf16 and adds in fp32 in the GEMM's
    epilogue; the CPU has no such kernel. fp16 (the V100 profiles) keeps product then add:
    the fused call was measured and tested in bf16 on an H100 only."""
    return (
        acc.is_cuda
        and acc.dtype == torch.float32
        and a.dtype == torch.bfloat16
        and hasattr(torch.ops.aten.addmm, "dtype_out")
    )


def accumulate_product(acc: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> None:
    """``acc += a @ b``, with ``acc`` fp32 and the product in ``a``'s dtype. The head's
    weight gradient sums one such product per chunk: as a separate product and add, each
    chunk wrote a [vocab, hidden] bf16 product and then read it back with the fp32 sum
    (~1.3 ms a chunk, 16 chunks of a 3B step: 21 ms, bench/results profile24_top60). One
    GEMM with beta=1 reads and writes the sum in its epilogue instead, and no longer rounds
    each chunk's product to bf16 before adding it."""
    if _gemm_accumulates(acc, a):
        torch.addmm(acc, a, b, out_dtype=acc.dtype, out=acc)
    else:
        acc.add_(a @ b)  # the product in a's dtype, rounded, then an fp32 sum


class _LinearLogp(torch.autograd.Function):
    @staticmethod
    def forward(  # noqa: ANN205
        ctx,
        h: torch.Tensor,
        weight: torch.Tensor,
        ids: torch.Tensor,
        chunk: int,
        inv_t: float,
        fp32: bool,
    ):
        cd = _compute_dtype(weight)
        if fp32:
            cd = torch.promote_types(cd, torch.float32)
        hc, wc = h.to(cd), weight.to(cd)
        n, acc = hc.shape[0], torch.promote_types(cd, torch.float32)  # fp64 stays fp64
        chosen = torch.empty(n, dtype=acc, device=h.device)
        lse = torch.empty_like(chosen)
        entropy = torch.empty_like(chosen)
        with torch.autocast(h.device.type, enabled=False):
            for sl in chunk_slices(n, chunk):
                stats = _fns(sl.stop - sl.start).stats
                logits, rows_ids = _rows_vary(hc[sl] @ wc.T, ids[sl])
                lse[sl], chosen[sl], entropy[sl] = stats(logits, rows_ids, inv_t, acc)
        ctx.save_for_backward(hc, wc, ids, lse)
        ctx.chunk, ctx.h_dtype, ctx.w_dtype, ctx.inv_t = chunk, h.dtype, weight.dtype, inv_t
        ctx.mark_non_differentiable(entropy)
        return chosen - lse, entropy

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_logp: torch.Tensor, _grad_entropy: torch.Tensor):  # noqa: ANN205
        hc, wc, ids, lse = ctx.saved_tensors
        grad_h = torch.empty(hc.shape, dtype=ctx.h_dtype, device=hc.device)
        acc = lse.dtype
        # A frozen head (LoRA) needs no [vocab, hidden] fp32 gradient accumulator.
        want_w = ctx.needs_input_grad[1]
        grad_w = torch.zeros(wc.shape, dtype=acc, device=wc.device) if want_w else None
        with torch.autocast(hc.device.type, enabled=False):
            for sl in chunk_slices(hc.shape[0], ctx.chunk):
                grad = _fns(sl.stop - sl.start).grad
                logits, rows_lse, rows_ids, g = _rows_vary(
                    hc[sl] @ wc.T, lse[sl], ids[sl], grad_logp[sl]
                )
                d = grad(logits, rows_lse, rows_ids, g, ctx.inv_t, acc, wc.dtype)
                grad_h[sl] = (d @ wc).to(ctx.h_dtype)
                if grad_w is not None:
                    accumulate_product(grad_w, d.T, hc[sl])
        grad_w = grad_w.to(ctx.w_dtype) if grad_w is not None else None
        return grad_h, grad_w, None, None, None, None


def linear_logp(
    h: torch.Tensor,
    weight: torch.Tensor,
    ids: torch.Tensor,
    chunk: int = DEFAULT_CHUNK_TOKENS,
    scoring: Scoring = Scoring(),
) -> tuple[torch.Tensor, torch.Tensor]:
    """``log_softmax(h @ weight.T / T)[ids]`` and the entropy of that softmax (detached),
    both fp32, for ``h`` [N, H], ``weight`` [V, H], ``ids`` [N]; differentiable w.r.t.
    ``h`` and ``weight``. ``scoring``: ``T`` and the precision of the product."""
    t = scoring.temperature
    if not t > 0:
        raise ValueError(f"temperature must be > 0, got {t}")
    return _LinearLogp.apply(h, weight, ids.long(), chunk, 1.0 / t, scoring.fp32)


LOGIT_TRANSFORMS = {
    "final_logit_softcapping": None,  # Gemma 2/3: z = c tanh(z / c)
    "logit_scale": 1.0,  # Cohere: z = s z
    "logits_scaling": 1.0,  # Granite: z = z / s
}
"""Config fields (with their neutral value) of transformers models that transform the
logits after the head's product: the fused head computes ``h W^T`` only."""


def head_problem(model: torch.nn.Module) -> str | None:
    """Why the fused head cannot score ``model`` exactly (one line), or None."""
    inner = getattr(model, "module", model)
    head = inner.get_output_embeddings()
    if not isinstance(head, torch.nn.Linear):  # FSDP2's wrapped class is still a Linear
        # e.g. LoRA on lm_head (peft's lora.Linear): h W^T alone would skip its adapter
        return f"its LM head is a {type(head).__name__}, not a plain linear layer"
    if getattr(head, "bias", None) is not None:
        return "its LM head has a bias"
    config = inner.config
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    for field, neutral in LOGIT_TRANSFORMS.items():
        value = getattr(text, field, neutral)
        if value is not None and value != neutral:
            return f"its config sets {field}={value!r} (logits transformed after the head)"
    return None


@dataclass
class HeadResult:
    logp: torch.Tensor | None = None
    """[B, C] log-probability of each target token (fp32)."""
    entropy: torch.Tensor | None = None
    """[B, C] entropy of the next-token distribution there (fp32, detached)."""


@contextlib.contextmanager
def fused_logp_head(
    model: torch.nn.Module,
    positions: torch.Tensor,
    targets: torch.Tensor,
    chunk: int = DEFAULT_CHUNK_TOKENS,
    scoring: Scoring = Scoring(),
    packed: bool = False,
) -> Iterator[HeadResult]:
    """During one forward of ``model``, its LM head computes, for every row ``b`` and
    completion index ``t``, the log-prob of ``targets[b, t]`` from the hidden state at
    ``positions[b, t]`` (instead of logits for every position). The HF model returns a
    placeholder as ``logits``; read the result from the yielded :class:`HeadResult`.
    ``scoring``: the temperature of the softmax and the precision of the product.
    ``packed``: the forward is one sequence holding every row ([1, N] hidden states), and
    ``positions`` index into it."""
    problem = head_problem(model)
    if problem is not None:
        raise ConfigError(f"the update's fused log-prob head cannot score this model: {problem}")
    inner = getattr(model, "module", model)  # DDP keeps the HF model in .module
    head = inner.get_output_embeddings()
    result = HeadResult()

    def forward(hidden: torch.Tensor) -> torch.Tensor:
        b, c = targets.shape
        if packed:
            picked = hidden[0][positions]  # [B, C, H]
        else:
            picked = hidden.gather(1, positions.unsqueeze(-1).expand(-1, -1, hidden.shape[-1]))
        flat = picked.reshape(b * c, -1)
        logp, ent = linear_logp(flat, head.weight, targets.reshape(-1), chunk, scoring)
        result.logp, result.entropy = logp.view(b, c), ent.view(b, c)
        return result.logp.unsqueeze(-1)

    head.forward = forward
    try:
        yield result
    finally:
        del head.forward  # back to the class's forward
