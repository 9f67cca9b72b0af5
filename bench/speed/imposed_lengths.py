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

Partial rollouts (``rollout.partial_pool``) call ``generate_rows`` once a round, with
rows continued from earlier rounds. There the drawn length follows a row across rounds: a
fresh row (``answered`` 0) draws its target as ``generate`` does; a row the round stopped
before its target is remembered by (its original prompt, its answer so far) and, continued
in a later round, ends at that same target in *total* answer length (its answered tokens
plus the new ones), or runs to the cap without EOS when the target is past it. Each round's
record also holds each row's ``answered`` and where its target came from (``drawn``,
``carried`` from an earlier round, ``lost``: a continued row whose target this process did
not keep, e.g. after a resume, drawn afresh and reported as not honoured).

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
Key = tuple[tuple[int, ...], tuple[int, ...]]
"""A row of a partial rollout: (its original prompt's ids, its answer so far)."""


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
        self.carried: dict[Key, list[int]] = {}
        """Targets of rows a round stopped before them, keyed by (original prompt ids,
        answer so far): the round that continues the row finds its target here. A list:
        two rows with the same prompt and answer so far are told apart by nothing, and
        either may take either target."""
        self.ticks: list[float] = []
        inner = self.tick

        def tick() -> None:  # the host checks, every check_every decode steps
            self.ticks.append(time.monotonic())
            inner()

        self.tick = tick
        special = set(getattr(self.tokenizer, "all_special_ids", []) or []) | {self.eos, self.pad}
        self.filler = next(i for i in range(self.packed.shape.vocab) if i not in special)

    def _call(self, greedy: bool) -> int:
        """This sampled generation's number (-1: greedy, not counted)."""
        with self.lock:
            call = -1 if greedy else ImposingEngine.calls
            if not greedy:
                ImposingEngine.calls += 1
        return call

    def _set_targets(self, remaining: list[int], least_rows: int = 0) -> None:
        """Each row's new tokens to its EOS, into the root bucket's buffer the steps read
        (the engine's: at least ``least_rows`` rows, ``batch_rows`` for a partial round)."""
        n_rows = len(remaining)
        rows = round_up(max(n_rows, least_rows), self.row_bucket)
        buf = self.target_bufs.get(rows)
        if buf is None:
            buf = self.target_bufs[rows] = torch.empty(rows, dtype=torch.long, device=self.device)
        buf.fill_(self.width + 1)  # padding rows: never forced
        buf[:n_rows] = torch.tensor(remaining, dtype=torch.long)

    def generate(self, prompts: list[str], num_generations: int, **kw: Any) -> Any:
        greedy = bool(kw.get("greedy", False))
        n_rows = len(prompts) * num_generations
        drawn = None
        call = self._call(greedy)
        self.imposing = self.targets is not None and not greedy
        if self.imposing:
            drawn = draw(self.targets, n_rows, self.seed, call, self.rank)
            self._set_targets(drawn)
        self.ticks = []
        t0 = time.monotonic()
        batch = super().generate(prompts, num_generations, **kw)
        t1 = time.monotonic()
        self._write(call, greedy, n_rows, batch, drawn, t0, t1)
        return batch

    def generate_rows(
        self,
        prompt_ids: list[list[int]],
        counts: list[int],
        *,
        greedy: bool = False,
        answered: list[int] | None = None,
        **kw: Any,
    ) -> Any:
        """A round of partial rollouts, imposed and recorded: each row's target follows it
        across rounds (the module's docstring). The forcing compares new columns, so a
        continued row's buffer holds its target less its answered tokens: EOS at total
        length ``answered + column + 1 == target``."""
        n_rows = sum(counts)
        call = self._call(greedy)
        per_prompt = answered if answered is not None else [0] * len(prompt_ids)
        done = [a for a, n in zip(per_prompt, counts, strict=True) for _ in range(n)]
        # Each row's identity: (original prompt, answer so far), per row in output order.
        keys = [
            (tuple(ids[: len(ids) - a]), tuple(ids[len(ids) - a :]))
            for ids, a, n in zip(prompt_ids, per_prompt, counts, strict=True)
            for _ in range(n)
        ]
        self.imposing = self.targets is not None and not greedy
        drawn, sources = None, None
        if self.imposing:
            # Every row of the call draws, as ``generate``'s rows do; a continued row then
            # takes the target it was drawn in its first round instead.
            drawn = draw(self.targets, n_rows, self.seed, call, self.rank)
            sources = ["drawn"] * n_rows
            for r, (key, a) in enumerate(zip(keys, done, strict=True)):
                if a == 0:
                    continue
                kept = self.carried.get(key)
                if kept:
                    drawn[r], sources[r] = kept.pop(), "carried"
                    if not kept:
                        del self.carried[key]
                else:
                    sources[r] = "lost"
            self._set_targets([d - a for d, a in zip(drawn, done, strict=True)], self.batch_rows)
        self.ticks = []
        t0 = time.monotonic()
        batch = super().generate_rows(prompt_ids, counts, greedy=greedy, answered=answered, **kw)
        t1 = time.monotonic()
        if drawn is not None:
            self._carry(batch, keys, done, drawn)
        self._write(call, greedy, n_rows, batch, drawn, t0, t1, done, sources, keys)
        return batch

    def _carry(
        self,
        batch: Any,
        keys: list[Key],
        done: list[int],
        drawn: list[int],
    ) -> None:
        """Remember the target of each row the round stopped before its end (no EOS, below
        the cap) under (original prompt, answer so far after this round): what the round
        that continues it will be given."""
        lengths = batch.completion_mask.sum(1).tolist()
        p = batch.prompt_len
        for r, (fin, n) in enumerate(zip(batch.finished.tolist(), lengths, strict=True)):
            if fin or done[r] + int(n) >= self.max_new_tokens:
                continue
            prompt, so_far = keys[r]
            new = tuple(batch.input_ids[r, p : p + int(n)].tolist())
            self.carried.setdefault((prompt, so_far + new), []).append(drawn[r])

    # ---------------------------------------------------------------- the correction
    def _start(self, ws: Workspace, ids: torch.Tensor, pmask: torch.Tensor, counts: list[int],
               n_rows: int, greedy: bool, room: torch.Tensor) -> None:  # fmt: skip
        super()._start(ws, ids, pmask, counts, n_rows, greedy, room)
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
        ``col + 1`` new tokens gets EOS there; one that chose EOS before its target gets
        the filler token instead. A row that reached its room (``ws.room``: a continued
        row's cap) stays done, without EOS. Device tensors only (captured in the step's
        graph)."""
        target = self.target_bufs[root].index_select(0, ws.rows_of)
        running = ~before
        length = col + 1
        force = running & (target == length)
        early = running & ~force & (ws.tokens == self.eos)
        tok = torch.where(force, self.eos, torch.where(early, self.filler, ws.tokens))
        ws.tokens.copy_(tok)
        ws.out.index_copy_(1, col, tok.unsqueeze(1))
        ws.done.copy_(before | (running & ((tok == self.eos) | (length >= ws.room))))

    # ---------------------------------------------------------------- the record
    def _write(self, call: int, greedy: bool, n_rows: int, batch: Any, drawn: list[int] | None,
               t0: float, t1: float, answered: list[int] | None = None,
               sources: list[str] | None = None,
               keys: list[Key] | None = None) -> None:  # fmt: skip
        """One JSON line for this generation. ``answered`` (a ``generate_rows`` round):
        each row's answer before the round and where its target came from (``sources``);
        ``drawn`` is then each row's target in total answer length, ``lengths`` the
        round's new tokens, and ``prompt_tokens`` the original prompts of the rows the
        round started (each group's prompts counted in the round that drew it: the
        trained steps' prompts, shifted by the pool), ``prefilled_tokens`` what the round
        prefilled (continued answers included)."""
        if self.record is None:
            return
        lengths = batch.completion_mask.sum(1).tolist()
        prompt = batch.attention_mask[:, : batch.prompt_len].sum().item()
        extra: dict[str, Any] = {}
        if answered is not None and keys is not None:
            extra = {
                "answered": answered,
                "sources": sources,
                "prefilled_tokens": int(prompt),
            }
            prompt = sum(len(k[0]) for k, a in zip(keys, answered, strict=True) if a == 0)
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
            **extra,
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


def child(
    run_dir: str, lengths: Path | None, seed: int, record: Path, switch_ms: float = 0.0
) -> int:
    """Train ``run_dir`` under the hook; fail when no generation went through it.
    ``switch_ms``: the interpreter's switch interval first (0: Python's own). A CUDA graph
    replay releases the GIL, and a decode thread that wants it back waits up to this
    interval for an update thread busy in Python: an experiment, not a setting."""
    if switch_ms:
        sys.setswitchinterval(switch_ms / 1000)
    from grpo_hpc.config.load import load_resolved
    from grpo_hpc.config.validate import training_ranks
    from grpo_hpc.core.paths import RunPaths
    from grpo_hpc.train.__main__ import main as train_main

    cfg = load_resolved(RunPaths(Path(run_dir)).config)
    install(lengths, cfg.rollout.max_new_tokens, seed, record)
    code = train_main([run_dir])
    # a split run's trainers generate nothing of the rollouts (their generators do)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    trainer = cfg.rollout.placement == "split" and ImposingEngine.rank < training_ranks(cfg, world)
    if code == 0 and ImposingEngine.calls == 0 and not trainer:
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
    p.add_argument("--switch-interval-ms", type=float, default=0.0, help="sys.setswitchinterval")
    a = p.parse_args()
    sys.exit(child(a.run_dir, a.lengths, a.seed, a.record, a.switch_interval_ms))


if __name__ == "__main__":
    main()
