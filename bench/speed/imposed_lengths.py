"""The trainer with each generated row's length imposed, and every generation recorded: a
bench-side hook, nothing in the package changes.

    torchrun ... -m bench.speed.imposed_lengths RUN_DIR --record DIR [--lengths FILE --seed S]

runs ``grpo_hpc.train RUN_DIR`` (as ``bench/speed/grpo_step.py`` does) with the native
engine's class replaced by :class:`ImposingEngine`, a subclass that

- with ``--lengths``, makes row ``i`` of a sampled rollout end at the length drawn for it
  (``length_dist.draw``: seeded by the seed, the generation's number and the rank) from
  FILE scaled to the run's cap: EOS is written at that column, and an EOS the model chose
  earlier is replaced by another token; a row drawn past the cap runs to it. Random
  weights never stop by themselves, so this is how a real long tail is put on them;
- always writes one JSON line per ``generate`` to ``DIR/generations-rank<R>.jsonl``: the
  rows, their prompt tokens, the drawn and the resulting lengths, the host-check times
  (the wait for the longest row is read from them) and the decode cost.

Why a subclass of the engine and not a logits processor: the native engine samples inside
captured CUDA graphs; the correction here is a few tensor operations after each decode
step, on the workspace's own tensors, so it is captured and replayed with the step and
needs no host look. The forced or replaced token keeps the log-prob of the token the
sampler drew (one token a row): an imposed run's importance-weight metrics are not the
algorithm's, its speed is. Greedy calls (held-out evaluation) are recorded, not imposed.
The engine must be the native one (``rollout.engine=native``); a run that generated
nothing through it fails here.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

import torch

from bench.speed.length_dist import draw, load, scaled
from grpo_hpc.train.rollout.native import engine as native_engine
from grpo_hpc.train.rollout.native.workspace import Workspace, round_up

RECORD_NAME = "generations-rank{rank}.jsonl"


class ImposingEngine(native_engine.NativeEngine):
    """The native engine, recording each generation and (with ``targets``) imposing each
    sampled row's length. Class attributes are set by :func:`install` before the trainer
    builds its engines (the policy's and an asynchronous run's generator's)."""

    targets: list[int] | None = None
    """Lengths to draw from, scaled to the run's cap (``length_dist.scaled``); None: only
    record (real lengths)."""
    seed: int = 0
    record: Path | None = None
    rank: int = 0
    calls = 0
    """Sampled generations so far in this process, over every instance: the n-th draws the
    n-th lengths in a synchronous and an asynchronous run alike."""
    lock = threading.Lock()

    def __post_init__(self) -> None:
        super().__post_init__()
        self.target_bufs: dict[int, torch.Tensor] = {}
        """Per root row bucket: each row's target length. One tensor per bucket for the
        engine's life, because captured graphs read it by address."""
        self.imposing = False
        self.ticks: list[float] = []
        inner = self.tick

        def tick() -> None:  # the host checks, every check_every decode steps
            self.ticks.append(time.monotonic())
            inner()

        self.tick = tick
        special = set(getattr(self.tokenizer, "all_special_ids", []) or []) | {self.eos, self.pad}
        self.filler = next(i for i in range(self.packed.shape.vocab) if i not in special)

    def generate(self, prompts: list[str], num_generations: int, **kw: Any) -> Any:
        greedy = bool(kw.get("greedy", False))
        n_rows = len(prompts) * num_generations
        drawn = None
        with self.lock:
            call = -1 if greedy else ImposingEngine.calls
            if not greedy:
                ImposingEngine.calls += 1
        self.imposing = self.targets is not None and not greedy
        if self.imposing:
            drawn = draw(self.targets, n_rows, self.seed, call, self.rank)
            rows = round_up(n_rows, self.row_bucket)
            buf = self.target_bufs.get(rows)
            if buf is None:
                buf = self.target_bufs[rows] = torch.empty(
                    rows, dtype=torch.long, device=self.device
                )
            buf.fill_(self.width + 1)  # padding rows: never forced
            buf[:n_rows] = torch.tensor(drawn, dtype=torch.long)
        self.ticks = []
        t0 = time.monotonic()
        batch = super().generate(prompts, num_generations, **kw)
        t1 = time.monotonic()
        self._write(call, greedy, n_rows, batch, drawn, t0, t1)
        return batch

    def generate_rows(self, prompt_ids: list[list[int]], counts: list[int], **kw: Any) -> Any:
        """Neither imposed nor recorded: the hook drives ``generate``'s rollouts only, and
        an earlier ``generate``'s targets must not leak into these rows."""
        self.imposing = False
        return super().generate_rows(prompt_ids, counts, **kw)

    # ---------------------------------------------------------------- the correction
    def _start(self, ws: Workspace, ids: torch.Tensor, pmask: torch.Tensor, counts: list[int],
               n_rows: int, greedy: bool) -> None:  # fmt: skip
        super()._start(ws, ids, pmask, counts, n_rows, greedy)
        if self.imposing:
            before = torch.zeros_like(ws.done)
            before[n_rows:] = True  # bucket padding
            self._impose(ws, torch.zeros_like(ws.pos), before, ws.rows)

    def _step_eager(self, ws: Workspace, span: int, greedy: bool, draw_rows: int) -> None:
        before = ws.done.clone() if self.imposing else None
        super()._step_eager(ws, span, greedy, draw_rows)
        if before is not None:
            self._impose(ws, ws.pos - ws.first_slot, before, draw_rows)

    def _impose(self, ws: Workspace, col: torch.Tensor, before: torch.Tensor, root: int) -> None:
        """After the token of column ``col`` was chosen: a running row whose target is
        ``col + 1`` tokens gets EOS there; one that chose EOS before its target gets the
        filler token instead. Device tensors only (captured in the step's graph)."""
        target = self.target_bufs[root].index_select(0, ws.rows_of)
        running = ~before
        length = col + 1
        force = running & (target == length)
        early = running & ~force & (ws.tokens == self.eos)
        tok = torch.where(force, self.eos, torch.where(early, self.filler, ws.tokens))
        ws.tokens.copy_(tok)
        ws.out.index_copy_(1, col, tok.unsqueeze(1))
        ws.done.copy_(before | (running & (tok == self.eos)))

    # ---------------------------------------------------------------- the record
    def _write(self, call: int, greedy: bool, n_rows: int, batch: Any, drawn: list[int] | None,
               t0: float, t1: float) -> None:  # fmt: skip
        if self.record is None:
            return
        lengths = batch.completion_mask.sum(1).tolist()
        prompt = batch.attention_mask[:, : batch.prompt_len].sum().item()
        row = {
            "call": call,
            "rank": self.rank,
            "greedy": greedy,
            "rows": n_rows,
            "cap": self.max_new_tokens,
            "prompt_tokens": int(prompt),
            "drawn": drawn,
            "lengths": [int(n) for n in lengths],
            "finished": [bool(f) for f in batch.finished.tolist()],
            "start": t0,
            "end": t1,
            "check_every": self.check_every,
            # in-loop host checks (the last tick is the one after the loop)
            "ticks": [round(t - t0, 6) for t in self.ticks[:-1]],
            "row_steps": self.stats.get("row_steps"),
            "compactions": self.stats.get("compactions"),
        }
        path = self.record / RECORD_NAME.format(rank=self.rank)
        with self.lock, path.open("a") as f:
            f.write(json.dumps(row) + "\n")


def install(lengths: Path | None, cap: int, seed: int, record: Path) -> None:
    """Make the trainer's native engines :class:`ImposingEngine` (``build_engine`` imports
    the class from its module when it builds one)."""
    ImposingEngine.targets = scaled(load(lengths), cap) if lengths else None
    ImposingEngine.seed = seed
    ImposingEngine.rank = int(os.environ.get("RANK", "0"))
    ImposingEngine.record = record
    record.mkdir(parents=True, exist_ok=True)
    native_engine.NativeEngine = ImposingEngine  # type: ignore[misc]


def child(run_dir: str, lengths: Path | None, seed: int, record: Path) -> int:
    """Train ``run_dir`` under the hook; fail when no generation went through it."""
    from grpo_hpc.config.load import load_resolved
    from grpo_hpc.core.paths import RunPaths
    from grpo_hpc.train.__main__ import main as train_main

    cfg = load_resolved(RunPaths(Path(run_dir)).config)
    install(lengths, cfg.rollout.max_new_tokens, seed, record)
    code = train_main([run_dir])
    if code == 0 and ImposingEngine.calls == 0:
        print("imposed_lengths: no generation went through the native engine "
              "(rollout.engine must be native)", file=sys.stderr)  # fmt: skip
        return 3
    return code


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("run_dir")
    p.add_argument("--record", type=Path, required=True, help="folder of the records")
    p.add_argument("--lengths", type=Path, help="a length distribution (length_dist.py)")
    p.add_argument("--seed", type=int, default=0, help="seeds the draws")
    a = p.parse_args()
    sys.exit(child(a.run_dir, a.lengths, a.seed, a.record))


if __name__ == "__main__":
    main()
