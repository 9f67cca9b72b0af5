"""The native engine's decode state and row arithmetic: the static tensors its CUDA graphs
read and write (one :class:`Workspace` per row bucket), how rows compact into smaller
buckets, which attention spans a step can read, and the hand-over of finished rows."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from grpo_hpc.train.rollout.native import forward
from grpo_hpc.train.rollout.types import OnRows


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
    """[rows] row has emitted EOS or reached its room."""
    out: torch.Tensor
    """[rows, max_new] completion tokens."""
    out_logp: torch.Tensor
    """[rows, max_new] log-probability of each under the policy (fp32)."""
    rows_of: torch.Tensor
    """[rows] the row of the rollout each workspace row holds (identity until compacted)."""
    room: torch.Tensor
    """[rows] new tokens the row may have (``generate_rows``'s room: the cap less what it
    had answered); the step marks it done once it wrote that many, as at EOS."""
    graphs: dict[tuple[int, bool, int], Any] = field(default_factory=dict)
    compacted: dict[int, Workspace] = field(default_factory=dict)
    """Smaller batches finished rows are compacted into; their caches are views of the
    first rows of this one's (no memory beyond the decode state), and their graphs are
    kept for the next rollout."""

    @property
    def rows(self) -> int:
        return self.tokens.shape[0]


OnDone = OnRows
"""Hears of finished rows: their rollout row indices and completion tokens."""
OnRunning = OnRows
"""Hears of rows still decoding: their rollout row indices and the completion tokens they
produced since the last call (every row the same columns)."""


@dataclass
class HandOver:
    """What a rollout's host checks tell the scoring (``rollout.stream_scoring``): rows that
    finished since the last check (``on_done``, each once, with all its tokens) and the new
    tokens of the rows still decoding (``on_running``). Runs at a host check, after ``live``
    has waited for the device: these copies wait for nothing. Before any compaction: a row
    that finished is still in the workspace."""

    on_done: OnDone
    on_running: OnRunning | None = None
    handed: set[int] = field(default_factory=set)
    """Rows already given to ``on_done``."""
    shown: int = 0
    """Completion columns already given to ``on_running``."""

    def check(self, ws: Workspace, real: int, t: int) -> None:
        """Columns ``[0, t)`` of every row of ``ws`` are written."""
        # One copy says which rollout row each workspace row holds and whether it finished:
        # row r finished -> r, still running -> -1 - r.
        rows_of = ws.rows_of[:real]
        state = torch.where(ws.done[:real], rows_of, -1 - rows_of).tolist()
        new = [i for i, row in enumerate(state) if row >= 0 and row not in self.handed]
        if new:
            idx = torch.tensor(new, device=ws.out.device)
            rows = [state[i] for i in new]
            self.handed.update(rows)
            self.on_done(rows, ws.out.index_select(0, idx)[:, :t].tolist())
        running = [i for i, row in enumerate(state) if row < 0]
        if self.on_running is not None and running and t > self.shown:
            # all rows share the column count: one slice of the new columns, whole rows
            cols = ws.out[:real, self.shown : t].tolist()
            self.on_running([-1 - state[i] for i in running], [cols[i] for i in running])
        self.shown = t


def ended_rows(ws: Workspace, real: int, n_rows: int) -> list[bool]:
    """One bool per row of the rollout (``n_rows``): True where the row has written EOS or
    reached its room (``Workspace.room``).
    The first ``real`` rows of ``ws`` hold rollout rows ``ws.rows_of[:real]``, as
    :meth:`HandOver.check` reads them; a rollout row none of them holds was compacted out,
    which only a finished row is. One copy from the device (at a host check, which has
    already waited for it)."""
    ended = [True] * n_rows
    for row in ws.rows_of[:real][~ws.done[:real]].tolist():
        ended[row] = False
    return ended


def compact_rows(live: int, rows: int, bucket: int) -> int:
    """Rows of the batch to decode ``live`` running rows in: the smallest ``bucket * 2^k``
    that holds them, or ``rows`` (the current batch) when that is no smaller. Halving
    steps keep the distinct batch sizes (captured graphs, compiled shapes) few."""
    target = bucket
    while target < live:
        target *= 2
    return min(target, rows)


def compaction_buckets(rows: int, bucket: int) -> list[int]:
    """Every smaller batch :func:`compact_rows` can move a batch of ``rows`` rows into
    (pure): ``bucket * 2^k`` below ``rows``."""
    out, target = [], bucket
    while target < rows:
        out.append(target)
        target *= 2
    return out


def spans(capacity: int, bucket: int) -> range:
    """Every attention span a decode step of a cache of ``capacity`` slots can read (pure):
    the multiples of ``bucket`` up to the capacity (a step reads the span bucket that holds
    its filled slots: ``round_up(prompt + t, bucket)``, at most the capacity)."""
    return range(bucket, capacity + 1, bucket)


def pad_rows(x: torch.Tensor, rows: int) -> torch.Tensor:
    """Extend dim 0 to ``rows`` by repeating the last row (bucket padding)."""
    extra = rows - x.shape[0]
    return torch.cat([x, x[-1:].expand(extra, *x.shape[1:])]) if extra else x
