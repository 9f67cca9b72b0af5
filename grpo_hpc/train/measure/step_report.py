"""One step's metrics row: its figures summed or maxed over the ranks (every rank takes
part in the reductions), the waits that tell a slow step's cause, and this rank's
recompilations named. The trainer hands the row to its tracker (rank 0 writes it)."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any

from grpo_hpc.config.schema import Config
from grpo_hpc.train.algo.batching import Scored, Selection
from grpo_hpc.train.distributed import dist
from grpo_hpc.train.distributed.dist import DistInfo
from grpo_hpc.train.measure.tracking import (
    compiled_graphs,
    gpu_memory_metrics,
    recompile_line,
    recompile_reasons,
    step_metrics,
)


@dataclass
class StepReporter:
    """Builds each step's metrics row on every rank."""

    cfg: Config
    info: DistInfo
    engine: Any
    """The rollout engine; the native one counts its KV caches and CUDA graph captures."""
    gc_clock: Any
    """The scheduled collector's clock (``take()``: seconds collected since the last take)."""
    graphs_seen: int = 0
    """torch.compile graphs built so far in this process (``compile/graphs``)."""
    reasons_seen: int = 0
    """Dynamo's guard failures so far (named in the ``[Compile]`` line)."""

    def row(
        self,
        step: int,
        stats: dict,
        sel: Selection,
        scored: list[Scored],
        times: dict[str, float],
        t0: float,
        lr: float,
        verify: tuple[float, float, float, float, float],
    ) -> dict[str, Any]:
        """The row of ``step``: ``stats`` from the update, ``times`` this rank's phase
        seconds, ``t0`` the step's start, ``verify`` (items math-verify judged here, its
        slowest item's seconds, how many of them while the rollout still decoded, and the
        completions handed to scoring before their rollout ended)."""
        m = self._totals(step, sel, scored, times["time/generate"])
        m.update(times, **stats, lr=lr)
        # How far apart the ranks finished generating: the wait of the earliest at the next
        # collective, which no short process-group timeout may span (liveness.py)
        m["time/generate_skew"] = dist.spread(times["time/generate"], self.info)
        m["time/step"] = time.monotonic() - t0
        m.update(self._slowest_rank(step, times["time/score"], verify))
        m.update(gpu_memory_metrics(self.info.device))
        return m

    def _totals(
        self, step: int, sel: Selection, scored: list[Scored], generate_s: float
    ) -> dict[str, Any]:
        """Rewards, tokens and completions summed over the ranks (:func:`step_metrics`)."""
        n_tok = sum(s.batch.num_tokens for s in scored)
        sums = dist.all_reduce_sum(
            [sum(sel.rewards), len(sel.rewards), float(n_tok), generate_s]
            + [sum(r * r for r in sel.rewards)]
            + [sum(v) for v in sel.components.values()]
            + [float(sel.truncated), float(sum(s.batch.input_ids.shape[0] for s in scored))]
            + [float(sel.solved), float(sel.groups)],
            self.info,
        )
        *sums, truncated, generated, solved, groups = sums
        m = step_metrics(
            step, self.cfg, sums, list(sel.components), self.info.world_size, generated
        )
        m["rollout/truncated"] = truncated / max(sums[1], 1.0)  # share cut at the length cap
        # share of groups in which every completion earned the full reward (solved)
        m["rollout/solved"] = solved / max(groups, 1.0)
        return m

    def _slowest_rank(
        self, step: int, score_s: float, verify: tuple[float, float, float, float, float]
    ) -> dict[str, Any]:
        """What the slowest rank spent, for which its peers waited at the next collective:
        a first meeting with a new shape (a compilation, a CUDA graph capture), a GC pause,
        its scoring (math-verify on one odd completion can take tenths of a second), and
        whether one completion held the scoring (the slowest math-verify item) or many."""
        totals = getattr(self.engine, "totals", None)  # native engine: caches, captures
        own = compiled_graphs()
        counts = [own, (totals or {}).get("captures", 0), self.gc_clock.take(), score_s]
        graphs, captures, gc_s, score_max, items, slowest, streamed, rows, after = (
            dist.max_over_ranks([*counts, *verify], self.info)
        )
        self._name_recompilations(step, own)
        m: dict[str, Any] = {
            "compile/graphs": int(graphs),
            "engine/captures": int(captures),
            "time/gc": gc_s,
            "time/score_max": score_max,
            "reward/verify_items": int(items),
            "time/verify_slowest": slowest,
            "reward/verify_streamed": int(streamed),
            "reward/verify_after": int(after),
            "rollout/streamed": int(rows),
        }
        if totals is not None:
            m["engine/caches"] = totals["caches"]
        return m

    def _name_recompilations(self, step: int, own: int) -> None:
        """Each rank names its own recompilations: the guard that failed is in its process."""
        reasons = recompile_reasons()
        rank = self.info.rank if self.info.enabled else None
        why = reasons[self.reasons_seen :]
        if line := recompile_line(step, self.graphs_seen, own, why, rank):
            print(line, flush=True)
        self.graphs_seen, self.reasons_seen = own, len(reasons)


def finite(x: float | None) -> float | None:
    """``x`` unless it is NaN/inf (a step whose groups were all flat skips the forward and
    has no entropy): progress.json is JSON, which has no NaN."""
    return x if x is not None and math.isfinite(x) else None
