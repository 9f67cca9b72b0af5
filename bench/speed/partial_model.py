"""What partial rollouts save in decode passes, on a CPU, before a GPU measures their time:
the real pool (``grpo_hpc.train.rollout.partial.PartialPool``: its rounds, stop rule,
staleness bound and choice of groups) driven by an engine that does no arithmetic. Each
row's total answer length is drawn from a recorded distribution scaled to the cap
(``length_dist``; a continued row keeps its target), and the engine stops a round exactly
where the native engine would: at the first host check (every ``--check-every`` tokens) at
which every row has ended or the pool's ``stop_when`` says the round may stop.

    python -m bench.speed.partial_model --cap 4096 --prompts 8 --G 8 --steps 60 \
        --configs 2:2 2:3 3:3 2:4 4:4 --out bench/results/partial_model_cpu_2026-12-05.json

Per trained step, against the synchronous step that waits for its longest row (the same
distribution, fresh draws): decode passes (steps of the decode loop: what a memory-bound
GPU decode pays for, whatever the rows), row-steps (rows x passes they ran: what a
compute-bound decode pays for), the tokens prefilled again for continued answers (their
prompt, ``--prompt-tokens``, and their answer so far), and the groups' staleness. A model of
the decode loop, not a timing: the time a pass takes with more rows is the GPU's to say
(bench/results/LOG-decode.md: on one H100, 4x the rows cost 1.7x the time).
"""

from __future__ import annotations

import argparse
import math
import random
import statistics
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from bench.common import env_info, write_result
from bench.speed.length_dist import load, scaled
from grpo_hpc.config.schema import Config
from grpo_hpc.tasks.char_tokenizer import char_tokenizer
from grpo_hpc.tasks.problems import Sampler
from grpo_hpc.train.distributed.dist import DistInfo
from grpo_hpc.train.rollout.collect import Collector
from grpo_hpc.train.rollout.partial import PartialPool
from grpo_hpc.train.rollout.types import RolloutBatch, left_padded, repeat_rows, rooms, to_batch

REPO = Path(__file__).resolve().parents[2]
LENGTHS = REPO / "bench/speed/lengths/smollm2_gsm8k_cap1024.json"
FILLER = 4  # the token every answer repeats after its first (a printable character's id)


@dataclass
class Round:
    """What one engine call did."""

    passes: int
    """Decode steps until the round stopped."""
    row_steps: int
    """Tokens decoded, over the rows (each row until it ended or the round stopped)."""
    reprefill: int
    """Tokens prefilled again for continued rows (their nominal prompt and answer so far)."""


@dataclass
class CountingEngine:
    """``generate_rows`` without arithmetic: each row's first token names it (a vocabulary
    id of its own), its total answer length is a draw it keeps across rounds, and the round
    stops where the native engine's loop would (module docstring)."""

    tok: Any
    targets: list[int]
    max_new_tokens: int
    check_every: int
    prompt_tokens: int
    rng: random.Random
    first_id: int
    next_id: int = 0
    target_of: dict[int, int] = field(default_factory=dict)
    rounds: list[Round] = field(default_factory=list)

    def generate_rows(
        self,
        prompt_ids: list[list[int]],
        counts: list[int],
        *,
        greedy: bool = False,
        stop_when: Any = None,
        answered: list[int] | None = None,
    ) -> RolloutBatch:
        cap, done = self.max_new_tokens, answered or [0] * len(counts)
        room = rooms(answered, counts, cap).tolist()
        names, had = [], []  # per output row: its id, the answer tokens it came with
        for p, n, a in zip(prompt_ids, counts, done, strict=True):
            for _ in range(n):
                names.append(p[-a] if a else self._new_row())
                had.append(a)
        # new tokens each row would make this round, and whether it ends with EOS
        left = [self.target_of[i] - a for i, a in zip(names, had, strict=True)]
        ends = [min(x, r) for x, r in zip(left, room, strict=True)]
        eos = [
            x <= r and self.target_of[i] <= cap for x, r, i in zip(left, room, names, strict=True)
        ]
        t = max(room)
        for check in range(self.check_every, max(room), self.check_every):
            ended = [e <= check for e in ends]
            if all(ended) or (stop_when is not None and stop_when(ended, check)):
                t = check
                break
        made = [min(e, t) for e in ends]
        self.rounds.append(
            Round(max(made), sum(made), sum(self.prompt_tokens + a for a in had if a))
        )
        ids, mask = left_padded(prompt_ids, self.tok.pad_token_id)
        ids, mask = repeat_rows(ids, counts), repeat_rows(mask, counts)
        cols = torch.full((len(names), max(1, max(made))), self.tok.pad_token_id)
        for r, (name, n, a) in enumerate(zip(names, made, had, strict=True)):
            cols[r, :n] = FILLER
            if not a and n:
                cols[r, 0] = name  # a fresh row's first token names it
            if eos[r] and n == ends[r]:
                cols[r, n - 1] = self.tok.eos_token_id
        batch = to_batch(
            torch.cat([ids, cols], 1), mask, ids.shape[1], self.tok, torch.tensor(room)
        )
        batch.sampled_logp = torch.zeros(cols.shape) * batch.completion_mask
        return batch

    def _new_row(self) -> int:
        name = self.first_id + self.next_id
        self.next_id += 1
        self.target_of[name] = self.rng.choice(self.targets)
        return name


def _collector(engine: CountingEngine, prompts: int, g: int, cap: int) -> Collector:
    cfg = Config()
    cfg.rollout.prompts_per_step, cfg.rollout.num_generations = prompts, g
    cfg.rollout.max_new_tokens = cap
    cfg.reward.correctness = cfg.reward.format = 0.0
    train = [{"question": f"q{i}", "gold": "0"} for i in range(10_000)]
    collector = Collector(
        cfg, DistInfo(), engine.tok, train, Sampler(len(train), 1), {}, None, engine
    )
    collector.ahead = True  # no progress file: as the decode thread
    return collector


def simulate(
    steps: int, pool: int, k: int, *, cap: int, prompts: int, g: int, targets: list[int],
    check_every: int = 16, prompt_tokens: int = 320, seed: int = 0,
) -> dict[str, Any]:  # fmt: skip
    """``steps`` rounds of a pool of ``pool`` steps at bound ``k`` (the thread placement's
    schedule: the round for step s by the weights of step s - 1), each round's counts, and
    the trained groups' staleness."""
    tok = char_tokenizer(vocab_size=100_000)
    engine = CountingEngine(
        tok, targets, cap, check_every, prompt_tokens, random.Random(seed), first_id=1_000
    )
    collector = _collector(engine, prompts, g, cap)
    pp = PartialPool(pool, k)
    stale: list[int] = []
    dropped = continued = 0
    for s in range(steps):
        _, report = pp.make(collector, s, max(0, s - 1), 0, None, torch.device("cpu"))
        stale += [s - v for v in report.versions]
        dropped += report.dropped
        continued += report.continued
    return {"rounds": engine.rounds, "staleness": stale, "dropped": dropped, "continued": continued}


def synchronous(
    steps: int, *, cap: int, rows: int, targets: list[int], check_every: int = 16, seed: int = 0
) -> list[Round]:
    """The synchronous step's decode: fresh rows until the longest ends (the loop stops at
    the first host check with every row done)."""
    rng = random.Random(seed)
    out = []
    for _ in range(steps):
        ends = [min(rng.choice(targets), cap) for _ in range(rows)]
        passes = min(cap, math.ceil(max(ends) / check_every) * check_every)
        out.append(Round(passes, sum(ends), 0))
    return out


def per_step(rounds: list[Round], skip: int) -> dict[str, float]:
    kept = rounds[skip:]
    return {
        "passes": statistics.fmean(r.passes for r in kept),
        "row_steps": statistics.fmean(r.row_steps for r in kept),
        "reprefill_tokens": statistics.fmean(r.reprefill for r in kept),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="example: python -m bench.speed.partial_model --cap 4096 --configs 2:2 2:3",
    )
    ap.add_argument("--lengths", type=Path, default=LENGTHS, help="a recorded distribution")
    ap.add_argument("--cap", type=int, default=4096, help="rollout.max_new_tokens")
    ap.add_argument("--prompts", type=int, default=8, help="prompts a step")
    ap.add_argument("--G", type=int, default=8, help="completions a prompt")
    ap.add_argument("--steps", type=int, default=60, help="rounds (trained steps) simulated")
    ap.add_argument("--skip", type=int, default=4, help="first steps left out (the pool fills)")
    ap.add_argument("--check-every", type=int, default=16, help="tokens between host checks")
    ap.add_argument("--prompt-tokens", type=int, default=320, help="a prompt's tokens")
    ap.add_argument(
        "--configs", nargs="+", default=["2:2", "2:3", "3:3", "2:4", "4:4"],
        help="P:k pairs (rollout.partial_pool : algo.max_staleness)",
    )  # fmt: skip
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, help="write the results here (JSON, and .md beside)")
    args = ap.parse_args(argv)
    targets = scaled(load(args.lengths), args.cap)
    common = {"cap": args.cap, "targets": targets, "check_every": args.check_every}
    sync = per_step(
        synchronous(args.steps, rows=args.prompts * args.G, seed=args.seed, **common), args.skip
    )
    rows = [{"config": "synchronous", **sync, "staleness_mean": 0.0, "staleness_max": 0}]
    for spec in args.configs:
        p, k = (int(x) for x in spec.split(":"))
        sim = simulate(
            args.steps, p, k, prompts=args.prompts, g=args.G, seed=args.seed,
            prompt_tokens=args.prompt_tokens, **common,
        )  # fmt: skip
        stale = sim["staleness"][args.skip * args.prompts :]
        rows.append(
            {"config": f"partial_pool={p}, max_staleness={k}", **per_step(sim["rounds"], args.skip),
             "staleness_mean": statistics.fmean(stale), "staleness_max": max(stale),
             "dropped_groups": sim["dropped"], "continued_rows": sim["continued"]}
        )  # fmt: skip
    table = markdown(rows, sync)
    print(table)
    if args.out:
        given = sys.argv[1:] if argv is None else argv
        command = "python -m bench.speed.partial_model " + " ".join(given)
        write_result(
            {"command": command, "args": {k: str(v) for k, v in vars(args).items()},
             "rows": rows, "env": env_info()},
            args.out,
        )  # fmt: skip
        args.out.with_suffix(".md").write_text(f"`{command}`\n\n{table}\n")
    return 0


def markdown(rows: list[dict[str, Any]], sync: dict[str, float]) -> str:
    head = (
        "| run | decode passes / step | vs sync | rows a pass | row-steps / step | vs sync "
        "| tokens prefilled again / step | staleness mean (max) |"
    )
    out = [head, "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        out.append(
            f"| {r['config']} | {r['passes']:,.0f} | {r['passes'] / sync['passes']:.2f}x | "
            f"{r['row_steps'] / r['passes']:.1f} | {r['row_steps']:,.0f} | "
            f"{r['row_steps'] / sync['row_steps']:.2f}x | "
            f"{r['reprefill_tokens']:,.0f} | {r['staleness_mean']:.2f} ({r['staleness_max']}) |"
        )
    return "\n".join(out)


if __name__ == "__main__":
    raise SystemExit(main())
