"""The native rollout engine: static KV cache, shared prompt prefill, CUDA-graph decode.

One ``generate`` call:
1. refill the packed low-precision weights from the policy (once per rollout);
2. prefill each *prompt* once and copy its K/V into the cache rows of its G completions
   (no G-fold prefill);
3. decode one token per row per step. On CUDA each step is a captured graph, one per
   (row bucket, attention-span bucket), captured the first time it is needed and
   replayed for every later step and rollout; attention reads only the span bucket
   that holds the filled slots. Token choice, EOS tracking and the output write happen
   inside the graph; the host looks at the device only every ``check_every`` tokens to
   refresh the heartbeat, enforce the time budget and stop once every row has ended.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from grpo_hpc.errors import StalledError
from grpo_hpc.train.native import forward, weights
from grpo_hpc.train.native.sampling import choose
from grpo_hpc.train.rollout_types import GenerationAborted, RolloutBatch, to_batch


def round_up(n: int, k: int) -> int:
    return -(-n // k) * k


@dataclass
class Workspace:
    """Static tensors for one row bucket; CUDA graphs read and write exactly these."""

    cache: forward.KVCache
    tokens: torch.Tensor
    """[rows] token fed to the next step."""
    pos: torch.Tensor
    """[1] cache slot the next step writes."""
    first_slot: torch.Tensor
    """[1] slot of completion token 0 (= padded prompt length)."""
    left_pad: torch.Tensor
    """[rows] leading pad tokens of each row's prompt."""
    done: torch.Tensor
    """[rows] row has emitted EOS."""
    out: torch.Tensor
    """[rows, max_new] completion tokens."""
    out_logp: torch.Tensor
    """[rows, max_new] log-probability of each under the policy (fp32)."""
    graphs: dict[tuple[int, bool], Any] = field(default_factory=dict)


@dataclass
class NativeEngine:
    """Rollouts from the policy's own weights with the decode loop of this package."""

    model: torch.nn.Module
    tokenizer: Any
    max_new_tokens: int
    temperature: float
    top_p: float
    timeout_s: float
    dtype: torch.dtype = torch.float32
    """Compute dtype of weights, activations and cache (bf16/fp16 on GPU)."""
    use_graphs: bool = True
    """Capture decode steps in CUDA graphs (ignored on CPU)."""
    compile: bool = True
    """torch.compile the decode layers on CUDA (ignored on CPU; falls back to eager,
    with a warning, if compilation fails)."""
    tick: Callable[[], None] = lambda: None
    abort: Callable[[], bool] = lambda: False
    span_bucket: int = 64
    """Attention span granularity: one graph per multiple of this."""
    row_bucket: int = 8
    """Rows are padded up to a multiple of this (fewer distinct graphs)."""
    check_every: int = 16
    """Decode steps between host checks (heartbeat, deadline, all rows done)."""

    def __post_init__(self) -> None:
        self.device = next(self.model.parameters()).device
        self.packed = weights.allocate(self.model, self.dtype, self.device)
        self.graphed = self.use_graphs and self.device.type == "cuda"
        self.pool = torch.cuda.graph_pool_handle() if self.graphed else None
        cuda = self.device.type == "cuda"
        self.fns = forward.DecodeFns.compiled() if self.compile and cuda else forward.EAGER
        self.spaces: dict[int, Workspace] = {}
        self.eos = int(self.tokenizer.eos_token_id)
        self.pad = int(self.tokenizer.pad_token_id)

    # ------------------------------------------------------------------ public
    def generate(
        self, prompts: list[str], num_generations: int, *, greedy: bool = False
    ) -> RolloutBatch:
        enc = self.tokenizer(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
        ids = enc.input_ids.to(self.device)
        pmask = enc.attention_mask.to(self.device)
        g, n_rows, length = num_generations, len(prompts) * num_generations, ids.shape[1]
        deadline = time.monotonic() + self.timeout_s
        weights.refill(self.packed, self.model)
        with torch.no_grad(), torch.autocast(self.device.type, enabled=False):
            ws = self._workspace(round_up(n_rows, self.row_bucket), length + self.max_new_tokens)
            self._start(ws, ids, pmask, g, n_rows, greedy)
            cols = self.max_new_tokens
            for t in range(1, self.max_new_tokens):
                if t % self.check_every == 0:
                    self.tick()
                    if time.monotonic() > deadline:
                        raise StalledError(
                            "generation exceeded "
                            f"rollout.generation_timeout_s={self.timeout_s:.0f}s"
                        )
                    if self.abort():
                        raise GenerationAborted()
                    if bool(ws.done[:n_rows].all()):
                        cols = t
                        break
                self._step(ws, round_up(length + t, self.span_bucket), greedy)
            completion = ws.out[:n_rows, :cols].clone()
            logp = ws.out_logp[:n_rows, :cols].clone()
        self.tick()
        full = torch.cat([ids.repeat_interleave(g, 0), completion], 1)
        batch = to_batch(full, pmask.repeat_interleave(g, 0), length, self.tokenizer)
        batch.sampled_logp = logp * batch.completion_mask
        return batch

    # ------------------------------------------------------------------ internals
    def _workspace(self, rows: int, capacity: int) -> Workspace:
        ws = self.spaces.get(rows)
        if ws is not None and ws.cache.capacity >= capacity:
            return ws
        self.spaces.pop(rows, None)  # drop the old graphs before allocating anew
        capacity = round_up(capacity, self.span_bucket)
        dev, m = self.device, self.max_new_tokens

        def zeros(*size: int, dt: torch.dtype = torch.long) -> torch.Tensor:
            return torch.zeros(*size, dtype=dt, device=dev)

        ws = Workspace(
            cache=forward.KVCache.empty(self.packed, rows, capacity, self.dtype),
            tokens=zeros(rows),
            pos=zeros(1),
            first_slot=zeros(1),
            left_pad=zeros(rows),
            done=zeros(rows, dt=torch.bool),
            out=zeros(rows, m),
            out_logp=zeros(rows, m, dt=torch.float32),
        )
        self.spaces[rows] = ws
        return ws

    def _start(
        self,
        ws: Workspace,
        ids: torch.Tensor,
        pmask: torch.Tensor,
        g: int,
        n_rows: int,
        greedy: bool,
    ) -> None:
        """Prefill, choose completion token 0 of every row, set the decode state."""
        rows = ws.tokens.shape[0]
        pad_p = (pmask.shape[1] - pmask.sum(1)).long()
        logits = forward.prefill(self.packed, ids, pad_p, ws.cache, g, self.dtype)
        spread = _pad_rows(logits.repeat_interleave(g, 0), rows)
        token, logp = choose(spread, self.temperature, self.top_p, greedy)
        ws.left_pad.copy_(_pad_rows(pad_p.repeat_interleave(g, 0), rows))
        ws.tokens.copy_(token)
        ws.done.copy_(token == self.eos)
        ws.done[n_rows:] = True  # bucket padding rows never count as running
        ws.out.fill_(self.pad)
        ws.out_logp.zero_()
        ws.out[:, 0] = token
        ws.out_logp[:, 0] = logp
        ws.first_slot.fill_(ids.shape[1])
        ws.pos.fill_(ids.shape[1])

    def _step(self, ws: Workspace, span: int, greedy: bool) -> None:
        if not self.graphed:
            self._step_eager(ws, span, greedy)
            return
        graph = ws.graphs.get((span, greedy))
        if graph is None:
            graph = ws.graphs[(span, greedy)] = self._capture(ws, span, greedy)
        graph.replay()

    def _step_eager(self, ws: Workspace, span: int, greedy: bool) -> None:
        """Feed ``ws.tokens`` at slot ``ws.pos``; write the next token of every row."""
        logits = forward.decode_step(
            self.packed, ws.cache, ws.tokens, ws.pos, ws.left_pad, span, self.fns
        )
        token, logp = choose(logits, self.temperature, self.top_p, greedy)
        token = torch.where(ws.done, torch.full_like(token, self.pad), token)
        logp = torch.where(ws.done, torch.zeros_like(logp), logp)
        col = ws.pos - ws.first_slot + 1
        ws.out.index_copy_(1, col, token.unsqueeze(1))
        ws.out_logp.index_copy_(1, col, logp.unsqueeze(1))
        ws.done.logical_or_(token == self.eos)
        ws.tokens.copy_(token)
        ws.pos.add_(1)

    def _capture(self, ws: Workspace, span: int, greedy: bool) -> torch.cuda.CUDAGraph:
        """Warm up on a side stream, capture, and restore the state (and RNG) the warm-up
        advanced, so capturing is invisible to the rollout."""
        state = [t.clone() for t in (ws.tokens, ws.pos, ws.done, ws.out, ws.out_logp)]
        rng = torch.cuda.get_rng_state(self.device)
        side = torch.cuda.Stream(self.device)
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side):
            try:
                self._step_eager(ws, span, greedy)  # compiles on first use
            except Exception as e:  # noqa: BLE001  (any compiler failure: run eager)
                if self.fns is forward.EAGER:
                    raise
                warnings.warn(
                    f"native engine: torch.compile failed, decoding eagerly ({e})", stacklevel=2
                )
                self.fns = forward.EAGER
                for dst, src in zip(
                    (ws.tokens, ws.pos, ws.done, ws.out, ws.out_logp), state, strict=True
                ):
                    dst.copy_(src)
                self._step_eager(ws, span, greedy)
        torch.cuda.current_stream(self.device).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            self._step_eager(ws, span, greedy)
        for dst, src in zip((ws.tokens, ws.pos, ws.done, ws.out, ws.out_logp), state, strict=True):
            dst.copy_(src)
        torch.cuda.set_rng_state(rng, self.device)
        return graph


def _pad_rows(x: torch.Tensor, rows: int) -> torch.Tensor:
    """Extend dim 0 to ``rows`` by repeating the last row (bucket padding)."""
    extra = rows - x.shape[0]
    return torch.cat([x, x[-1:].expand(extra, *x.shape[1:])]) if extra else x
