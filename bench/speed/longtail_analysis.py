"""What a synchronous and an asynchronous run of the long-tail benchmark measured (pure).

Inputs are a run's metrics rows (``metrics.jsonl``: one row per training step, with
``loss``) and its generation records (``bench/speed/imposed_lengths.py``: one per
``generate``). Steps after the first count (the first compiles and captures), except an
asynchronous run's last steps (:func:`drain_steps`): they train batches made ahead while
nothing generates beside them, which a long run does once; a figure a run does not log is
None, never 0.

- **tokens/s/GPU as NeMo RL counts them**: (prompt + response tokens of the steps) / (their
  step time) / GPUs. Response tokens are the trainer's own count (``gen_len/mean`` x
  ``completions``); prompt tokens are the records' (the trainer logs none), the n-th
  sampled generation being step n's batch (true of a synchronous run and of an
  asynchronous one, which generates each step's batch once, in step order, and nothing
  past the last step);
- **idle shares**: the part of the steps' time the engine did not generate
  (1 - generate / step) and the part the optimizer did not train (1 - train / step), each
  phase's seconds capped at the step's. In an asynchronous run the generation counted at
  step s ran during step s-1, beside its update; over the measured steps the sums agree;
- **wait for the longest row**: per generation, the seconds from the first host check at
  or after the median row's length (when half the rows had ended) to the end of the
  generation: the time the engine ran for the longer half of its rows (resolution: the
  engine's ``check_every`` decode steps). Median over the measured generations, rank 0;
- ``time/wait_rollouts`` (the step waiting for the generator after its update) and
  ``time/weight_sync`` (a weight transfer, where a placement logs one), means per step.

A partial-rollout run (``rollout.partial_pool``) records one call per round, with each
row's ``answered`` tokens from earlier rounds (:func:`is_partial`): its rows are judged in
total answer length (:func:`partial_mismatches`), its prompt tokens are those of the
groups each round started (one step's in steady state; the first round fills the pool and
is the skipped step), and a step's trained batch (answers stitched from several rounds)
is not compared with one round's lengths.
"""

from __future__ import annotations

import statistics
from typing import Any

Row = dict[str, Any]


def train_steps(rows: list[Row]) -> list[Row]:
    """The training rows (those with ``loss``) in step order."""
    return sorted((r for r in rows if "loss" in r), key=lambda r: r["step"])


def sampled_calls(records: list[Row]) -> list[Row]:
    """The sampled (not greedy) generations, in order, per rank merged by call number."""
    return sorted((r for r in records if not r.get("greedy")), key=lambda r: (r["call"], r["rank"]))


def prompt_tokens_per_step(records: list[Row], steps: int, grouped: int = 1) -> list[float] | None:
    """Prompt tokens of each step's batch, summed over ranks: the n-th sampled call is step
    n + 1's; with ``grouped`` steps' batches a call, each of its steps takes an equal share
    (exact over whole groups, which is what is measured). None when the calls do not
    cover the steps (a batch dropped and made again, extra rounds): then no call can be
    matched to its step."""
    by_call: dict[int, float] = {}
    for r in sampled_calls(records):
        by_call[r["call"]] = by_call.get(r["call"], 0.0) + r["prompt_tokens"]
    out: list[float] = []
    for i, c in enumerate(sorted(by_call)):
        n = max(0, min(grouped, steps - i * grouped))
        out += [by_call[c] / max(n, 1)] * n
    return out if len(out) == steps and len(by_call) == -(-steps // grouped) else None


def response_tokens(step: Row) -> float:
    """The step's generated tokens over every rank (EOS included), as the trainer counts."""
    return float(step["gen_len/mean"]) * float(step["completions"])


def tokens_per_gpu_s(steps: list[Row], prompts: list[float], skip: int = 1) -> float | None:
    """NeMo RL's throughput: (prompt + response tokens) / step seconds / GPUs over the
    steps after the first ``skip``; ``prompts[i]`` is step ``i``'s prompt tokens."""
    kept = list(zip(steps, prompts, strict=True))[skip:]
    seconds = sum(float(s["time/step"]) for s, _ in kept)
    if not kept or seconds <= 0:
        return None
    tokens = sum(p + response_tokens(s) for s, p in kept)
    return tokens / seconds / gpus(kept[0][0])


def gpus(step: Row) -> int:
    """The GPUs a step ran on: its ranks, and a split run's generators (``world_size``
    counts the trainers alone)."""
    return int(step.get("world_size", 1)) + int(step.get("generators", 0))


def idle_share(steps: list[Row], key: str, skip: int = 1) -> float | None:
    """1 - (phase ``key``'s seconds, each capped at its step's) / (the steps' seconds)."""
    kept = [s for s in steps[skip:] if key in s]
    total = sum(float(s["time/step"]) for s in kept)
    if not kept or total <= 0:
        return None
    busy = sum(min(float(s[key]), float(s["time/step"])) for s in kept)
    return 1.0 - busy / total


def mean_of(steps: list[Row], key: str, skip: int = 1) -> float | None:
    """Mean of ``key`` over the steps after the first ``skip`` that log it (None: none)."""
    vals = [float(s[key]) for s in steps[skip:] if key in s]
    return statistics.fmean(vals) if vals else None


def longest_row_wait(call: Row) -> float:
    """Seconds of one generation from the first host check at or after its median row's
    length to its end (0 when the median row ended after the last check: the tail was
    shorter than one check interval)."""
    median = statistics.median(call["lengths"])
    every = int(call["check_every"])
    for k, t in enumerate(call["ticks"]):
        if (k + 1) * every >= median:
            return (call["end"] - call["start"]) - t
    return 0.0


def longest_row_waits(records: list[Row], skip: int = 1, rank: int = 0) -> list[float]:
    """:func:`longest_row_wait` of each sampled generation of ``rank`` after the first
    ``skip`` (the first captures graphs and compiles)."""
    calls = [r for r in sampled_calls(records) if r["rank"] == rank]
    return [longest_row_wait(c) for c in calls[skip:]]


def is_partial(call: Row) -> bool:
    """Whether a record is a partial-rollout round (``generate_rows``: rows may continue
    answers of earlier rounds)."""
    return call.get("answered") is not None


def partial_mismatches(call: Row) -> list[str]:
    """Rows of one partial round whose imposed length was not honoured (pure). Row ``r``
    had ``answered`` tokens, made ``lengths`` more, and its target (``drawn``, in total
    answer length) came from a draw or was carried from its earlier round. Honoured: it
    ended with EOS at total length = target; or, without EOS, ran to the cap with a target
    past it; or was stopped by the round below both (continued later, its target carried:
    a continued row whose target was ``lost`` is not honoured)."""
    out = []
    cap = int(call["cap"])
    for r, (target, a, n, fin) in enumerate(
        zip(call["drawn"], call["answered"], call["lengths"], call["finished"], strict=True)
    ):
        total, where = a + n, f"call {call['call']} rank {call['rank']} row {r}"
        if call["sources"][r] == "lost":
            out.append(f"{where}: continued after {a} tokens, its target was not carried")
        elif fin and total != target:
            out.append(f"{where}: target {target}, ended with EOS at total length {total}")
        elif not fin and total >= min(target, cap) and not (target > cap and total == cap):
            out.append(f"{where}: target {target}, no EOS at total length {total}")
    return out


def length_mismatches(
    steps: list[Row], records: list[Row], tol: float = 1e-6, grouped: int = 1
) -> list[str]:
    """Where the imposed lengths were not honoured (empty: everywhere they were): a row
    whose recorded length is not its drawn one (capped at the cap), and a step whose
    logged mean length is not the mean of its generation's recorded lengths. Partial
    rounds: :func:`partial_mismatches`, and no step's mean is compared (its answers were
    made over several rounds)."""
    out = []
    calls = sampled_calls(records)
    if any(is_partial(c) for c in calls):
        return [m for c in calls if c.get("drawn") is not None for m in partial_mismatches(c)]
    for c in calls:
        if c.get("drawn") is None:
            continue
        want = [min(d, c["cap"]) for d in c["drawn"]]
        if want != c["lengths"]:
            out.append(f"call {c['call']} rank {c['rank']}: drawn {want}, got {c['lengths']}")
    if grouped > 1:  # a call's rows are several steps': only each row is compared
        return out
    by_call: dict[int, list[int]] = {}
    for c in calls:
        by_call.setdefault(c["call"], []).extend(c["lengths"])
    if len(by_call) != len(steps):
        return [*out, f"{len(by_call)} sampled generations for {len(steps)} steps"]
    for s, call in zip(steps, sorted(by_call), strict=True):
        mean = statistics.fmean(by_call[call])
        if abs(mean - float(s["gen_len/mean"])) > tol:
            out.append(f"step {s['step']}: logged mean length {s['gen_len/mean']}, {mean} made")
    return out


def drain_steps(max_staleness: int, partial_pool: int, cut: bool) -> int:
    """The last steps of a finished run that train batches generated ahead with nothing
    generating beside them (pure): the steps made ahead, ``max_staleness`` (one with
    partial rollouts, whose rounds run one step ahead); 0 for a synchronous run and for
    one stopped at its timeout (its last steps still had generation beside them). Counted
    in, they made a 5-step run at ``max_staleness=1`` look 1.25x faster than its steady
    steps were (one H200, 2026-12-05: LOG-speed.md)."""
    if cut or max_staleness <= 0:
        return 0
    return 1 if partial_pool else max_staleness


def window(
    steps: int, max_staleness: int, partial_pool: int, grouped: int, cut: bool
) -> tuple[int, int]:
    """The steps a run's figures leave out (pure): ``(skip, drain)``, first and last. One
    first step (it compiles and captures) and the drain (:func:`drain_steps`); a run of
    ``grouped`` = ``rollout.steps_per_generation`` > 1 steps' batches a rollout leaves out
    its first group (its rollout compiled and captured) and a last group cut short by the
    run's end (its rollout made fewer rows), so that whole groups are measured."""
    if grouped <= 1:
        return 1, drain_steps(max_staleness, partial_pool, cut)
    return grouped, max(steps - grouped, 0) % grouped


def summarize(
    name: str,
    rows: list[Row],
    records: list[Row],
    skip: int = 1,
    cut: bool = False,
    drain: int = 0,
    grouped: int = 1,
) -> dict:
    """One run's figures (see the module's docstring) over its steps after the first
    ``skip`` and before the last ``drain`` (:func:`drain_steps`). ``cut``: the run was
    stopped, and its generations past its last logged step (made ahead, or cut) are not
    counted. ``grouped``: ``rollout.steps_per_generation`` (a call makes that many steps'
    batches)."""
    steps = train_steps(rows)
    if cut:
        made = -(-len(steps) // grouped)  # the calls the logged steps trained from
        records = [r for r in records if r.get("greedy") or r["call"] < made]
    prompts = prompt_tokens_per_step(records, len(steps), grouped)
    end = max(len(steps) - drain, skip)
    kept = steps[skip:end]
    # rank 0's generations; a split run's trainers generate none: its first generator's
    first = min((int(r["rank"]) for r in records), default=0)
    waits = longest_row_waits(records, 1 if grouped > 1 else skip, first)
    return {
        "run": name,
        "cut": cut,
        "steps": len(steps),
        "steps_measured": len(kept),
        "steps_drained": len(steps) - end,
        "gpus": gpus(steps[0]) if steps else None,
        "step_s": mean_of(kept, "time/step", 0),
        "generate_s": mean_of(kept, "time/generate", 0),
        "train_s": mean_of(kept, "time/train", 0),
        "tokens_per_gpu_s": tokens_per_gpu_s(kept, prompts[skip:end], 0) if prompts else None,
        "engine_idle": idle_share(kept, "time/generate", 0),
        "optimizer_idle": idle_share(kept, "time/train", 0),
        "longest_row_wait_s": statistics.median(waits) if waits else None,
        "wait_rollouts_s": mean_of(kept, "time/wait_rollouts", 0),
        "weight_sync_s": mean_of(kept, "time/weight_sync", 0),
        "mean_length": mean_of(kept, "gen_len/mean", 0),
        "lengths_mismatched": length_mismatches(steps, records, grouped=grouped),
    }


COLUMNS = (
    ("run", "run", "{}"),
    ("tokens/s/GPU", "tokens_per_gpu_s", "{:,.0f}"),
    ("s/step", "step_s", "{:.2f}"),
    ("generate s", "generate_s", "{:.2f}"),
    ("train s", "train_s", "{:.2f}"),
    ("engine idle", "engine_idle", "{:.0%}"),
    ("optimizer idle", "optimizer_idle", "{:.0%}"),
    ("longest-row wait s", "longest_row_wait_s", "{:.2f}"),
    ("wait_rollouts s", "wait_rollouts_s", "{:.2f}"),
    ("weight_sync s", "weight_sync_s", "{:.3f}"),
    ("mean length", "mean_length", "{:.0f}"),
)


def markdown(runs: list[dict]) -> str:
    """The runs as one markdown table (``-``: not logged by that run)."""
    head = "| " + " | ".join(c[0] for c in COLUMNS) + " |"
    rule = "|" + "---|" * len(COLUMNS)
    lines = [head, rule]
    for r in runs:
        cells = ["-" if r.get(k) is None else fmt.format(r[k]) for _, k, fmt in COLUMNS]
        if r.get("failed"):  # its figures are of the steps it finished, if any
            cells[0] += f" (failed: {r['failed']})"
        elif r.get("cut"):
            cells[0] += " (stopped at its timeout)"
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def speedup(sync: dict, other: dict) -> float | None:
    """``other``'s tokens/s/GPU over ``sync``'s (None where either is missing)."""
    a, b = sync.get("tokens_per_gpu_s"), other.get("tokens_per_gpu_s")
    return b / a if a and b else None


def main(argv: list[str] | None = None) -> None:
    """``python -m bench.speed.longtail_analysis METRICS.jsonl --staleness K [--partial-pool
    P] [--steps-per-generation M]``: the mean step time and the response tokens/s/GPU
    (prompts not counted: the metrics have no prompt tokens) of a run's measured steps
    (:func:`window`: after the first step or group, before the drain or a group cut short)
    from its metrics alone: how runs kept without generation records are read again."""
    import argparse
    import json
    from pathlib import Path

    ap = argparse.ArgumentParser(description=main.__doc__)
    ap.add_argument("metrics", type=Path)
    ap.add_argument("--staleness", type=int, required=True)
    ap.add_argument("--partial-pool", type=int, default=0)
    ap.add_argument("--steps-per-generation", type=int, default=1, help="rollout's M")
    ap.add_argument("--cut", action="store_true", help="the run was stopped at its timeout")
    a = ap.parse_args(argv)
    rows = [json.loads(x) for x in a.metrics.read_text().splitlines() if x.strip()]
    steps = train_steps(rows)
    m = a.steps_per_generation
    skip, drain = window(len(steps), a.staleness, a.partial_pool, m, a.cut)
    kept = steps[skip : max(len(steps) - drain, skip)]
    times = ", ".join(f"{float(s['time/step']):.2f}" for s in steps)
    seconds = sum(float(s["time/step"]) for s in kept)
    rate = sum(response_tokens(s) for s in kept) / seconds / gpus(kept[0]) if kept else 0.0
    print(f"{a.metrics}: step s [{times}]; "
          f"measured {len(kept)} (first {skip}, last {drain} left out): "
          f"{mean_of(kept, 'time/step', 0) or float('nan'):.2f} s/step, "
          f"{rate:,.0f} response tokens/s/GPU")  # fmt: skip


if __name__ == "__main__":
    main()
