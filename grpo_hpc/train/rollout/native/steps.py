"""The native engine's decode step (:class:`DecodeSteps`, a base of
:class:`~grpo_hpc.train.rollout.native.engine.NativeEngine`): one token per row, eager, or on
CUDA replayed from a graph captured per (workspace, attention-span bucket, greedy, noise
rows), every graph a batch shape can meet captured at its first rollout, all of them dropped
with their memory pool when a cache must regrow. The loop that calls it, the workspaces it
writes and the prefill are engine.py's.
"""

from __future__ import annotations

import gc
import warnings
from typing import Any

import torch

from grpo_hpc.train.rollout.native import forward, weights
from grpo_hpc.train.rollout.native.sampling import choose
from grpo_hpc.train.rollout.native.workspace import Workspace, compaction_buckets, spans


class DecodeSteps:
    """The decode step and its CUDA graphs, over the engine's attributes below (set by
    ``NativeEngine.__post_init__``)."""

    device: torch.device
    graphed: bool
    """Decode steps replay captured CUDA graphs (``use_graphs`` on a CUDA device)."""
    pool: Any
    """The graphs' shared memory pool (None without graphs)."""
    fns: forward.DecodeFns
    """The decode layers' functions (compiled, or ``forward.EAGER``)."""
    packed: weights.Packed
    spaces: dict[int, Workspace]
    prepared: set[tuple[int, bool]]
    totals: dict[str, int]
    temperature: float
    top_p: float
    logp_temperature: float
    capture_ahead: bool
    span_bucket: int
    row_bucket: int
    eos: int
    pad: int

    def _compact_space(self, root: Workspace, rows: int) -> Workspace:
        """The workspace of ``rows`` rows that ``root``'s rollouts compact into: the
        engine's (engine.py), which keeps the workspaces."""
        raise NotImplementedError

    def _drop_all_graphs(self) -> None:
        """Forget every workspace and captured graph; later captures use a fresh memory
        pool. Freeing one workspace's graphs while the others' stay in the shared pool
        and new ones are captured into it trips an assert in PyTorch's caching allocator
        ("use_count > 0", seen on an H100 with torch 2.11)."""
        self.spaces.clear()
        self.prepared.clear()
        if self.graphed:
            torch.cuda.synchronize(self.device)
            gc.collect()
            self.pool = torch.cuda.graph_pool_handle()
        else:
            gc.collect()

    def _capture_ahead(self, root: Workspace, greedy: bool) -> None:
        """Capture every graph a rollout decoding in ``root`` can meet (``capture_ahead``),
        once per batch shape. Each capture restores the decode state and the RNG it
        advanced, so the rollout samples what it would have sampled without it."""
        if not (self.graphed and self.capture_ahead) or (root.rows, greedy) in self.prepared:
            return
        spaces = [root] + [
            self._compact_space(root, r) for r in compaction_buckets(root.rows, self.row_bucket)
        ]
        for ws in spaces:
            # A workspace may hold the end of an earlier rollout (its slot past the last
            # output column): the captures' warm-up steps write at slot 0, column 1, which
            # the prefill and the decode write again before anything reads them.
            ws.pos.zero_()
            ws.first_slot.zero_()
            for span in spans(root.cache.capacity, self.span_bucket):
                self._graph(ws, span, greedy, root.rows)
        self.prepared.add((root.rows, greedy))

    def _step(self, ws: Workspace, span: int, greedy: bool, draw: int) -> None:
        """One decode step; ``draw``: rows of the rollout's first batch (sampling noise)."""
        if not self.graphed:
            self._step_eager(ws, span, greedy, draw)
            return
        self._graph(ws, span, greedy, draw).replay()

    def _graph(self, ws: Workspace, span: int, greedy: bool, draw: int) -> Any:
        """The captured decode step of ``ws`` for ``span`` (captured now if it is new)."""
        key = (span, greedy, 0 if greedy else draw)
        graph = ws.graphs.get(key)
        if graph is None:
            graph = ws.graphs[key] = self._capture(ws, span, greedy, draw)
            self.totals["captures"] += 1
        return graph

    def _step_eager(self, ws: Workspace, span: int, greedy: bool, draw: int) -> None:
        """Feed ``ws.tokens`` at slot ``ws.pos``; write the next token of every row."""
        logits = forward.decode_step(
            self.packed, ws.cache, ws.tokens, ws.pos, ws.left_pad, span, self.fns
        )
        rows_of = None if draw == ws.rows else ws.rows_of  # compacted: noise of its rows
        token, logp = choose(
            logits,
            self.temperature,
            self.top_p,
            greedy,
            rows_of,
            draw,
            self.logp_temperature,
            self.fns.pick,
        )
        token = torch.where(ws.done, torch.full_like(token, self.pad), token)
        logp = torch.where(ws.done, torch.zeros_like(logp), logp)
        col = ws.pos - ws.first_slot + 1
        ws.out.index_copy_(1, col, token.unsqueeze(1))
        ws.out_logp.index_copy_(1, col, logp.unsqueeze(1))
        ws.done.logical_or_(token == self.eos)
        # A row that wrote its room's last column ends as at EOS (later columns: padding).
        # Compared on the device: no host look inside the (captured) step.
        ws.done.logical_or_(col + 1 >= ws.room)
        ws.tokens.copy_(token)
        ws.pos.add_(1)

    def _capture(self, ws: Workspace, span: int, greedy: bool, draw: int) -> torch.cuda.CUDAGraph:
        """Warm up on a side stream, capture, and restore the state (and RNG) the warm-up
        advanced, so capturing is invisible to the rollout."""
        state = [t.clone() for t in (ws.tokens, ws.pos, ws.done, ws.out, ws.out_logp)]
        rng = torch.cuda.get_rng_state(self.device)
        side = torch.cuda.Stream(self.device)
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side):
            try:
                self._step_eager(ws, span, greedy, draw)  # compiles on first use
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
                self._step_eager(ws, span, greedy, draw)
        torch.cuda.current_stream(self.device).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        # "thread_local": an asynchronous run's update allocates and launches on another
        # thread while a new batch shape is captured here; under the default ("global")
        # that thread's cudaMalloc failed with "operation not permitted when stream is
        # capturing" (partial rollouts on an H100, 2026-12-05). The capture's stream is
        # this thread's alone; vLLM captures this way for its background threads too.
        with torch.cuda.graph(graph, pool=self.pool, capture_error_mode="thread_local"):
            self._step_eager(ws, span, greedy, draw)
        for dst, src in zip((ws.tokens, ws.pos, ws.done, ws.out, ws.out_logp), state, strict=True):
            dst.copy_(src)
        torch.cuda.set_rng_state(rng, self.device)
        return graph
