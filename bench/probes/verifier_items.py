"""Which math-verify items are slow, and is it the item or the worker's first meeting with it?

The question behind a real run's remaining slow scoring: in the real 2-GPU GSM8K runs of
SmolLM2-135M-Instruct (after the worker's ``gc.freeze()``), each step sent 5-25 items per
rank to math-verify, the typical one taking 2-6 ms, and now and then ONE took 0.08-0.45 s
(``time/verify_slowest``) while the other rank waited.

This probe runs the trainer's own path (``score_correctness``: ``extract_gold``,
``extract_answer``, ``prejudge``, then ``(answer, gold, gold_value(gold) is None)`` jobs)
over real completions, and times every job through ``VERIFIER.judge([job], 5.0)``, one at
a time, as the parent waits for it, in seven passes:

* ``first``: a fresh worker that has judged only ``SELF_CHECK`` (as every rank's worker
  has, at start-up: ``rewards.prove_workers``), the jobs in the run's order;
* ``warm``: a fresh worker that has judged every job once, the same order again;
* ``rev``: like ``first``, the jobs in reverse order;
* ``warmed``: like ``first``, the worker having judged :data:`WARMUP` too (timed);
* ``preimport``: like ``first``, the parent having imported :data:`PREIMPORT` (timed)
  before the fork, as ``_Verifier._start`` imports math_verify;
* ``both``: ``preimport`` and ``warmed`` together;
* ``parent``: like ``preimport``, the parent having judged :data:`WARMUP` itself (timed)
  before the fork, so that every worker, a restarted one too, inherits what it warmed.

The parent imports torch and transformers first (the trainer's heap; ``--bare`` skips
them). Inside the worker each item's own time and the garbage collections it ran are
recorded too (``_judge`` and ``gc.callbacks`` wrapped before the fork). An item slow in
``first`` but not in ``rev`` or ``warm`` paid a first-use cost; slow in all three, it is
intrinsically slow. It also checks whether :func:`wider_prejudge` (the pre-judge settling a
wrong plain number too) gives math-verify's verdict on every job it would settle.
``--extra`` appends :data:`EXTRA`'s synthetic jobs (marked ``x`` in the table).

Input (``--completions``): JSONL, one object a line, in the order the run meets them:
``{"completion": str, "gold": str}`` (``gold`` the raw GSM8K answer text or the bare gold;
``extract_gold`` takes either); other keys (``prompt``: the GSM8K train row) are ignored.
``--generate N`` writes such a file first: N GSM8K train prompts (random, seed 0) x 8
completions of SmolLM2-135M-Instruct, sampled with HF ``generate`` on the CPU at
temperature 1.0, 256 new tokens, the trainer's chat prompt (``prompt_text``).

    python -m bench.probes.verifier_items --generate 32 --completions /tmp/completions.jsonl
    python -m bench.probes.verifier_items --completions /tmp/completions.jsonl [--bare]

The answer (2-core CPU machine shared with other sessions, Python 3.11, math-verify 0.9.0,
sympy 1.14, 2026-11-27; three runs, two while the machine was loaded, one quiet; 128
completions of 16 prompts, of which 8 went to math-verify, all wrong plain numbers, plus
``--extra``'s 13): first use, not the items. The 8 real jobs took 0.8-15.8 ms in every pass
(the slowest: the run's first job, the worker's first bare-text parse). The slow jobs were a
worker's first meeting with a kind of answer: the first to reach sympy's ``simplify`` (a
percent, a fraction, a root; ``75%`` here) imported ``sympy.physics.units`` (33 modules):
105 ms quiet, 234-252 ms loaded (1.2-1.8 s in-process under heavier load); the first bare
symbol (``y``) 16-70 ms, the first ``\\times`` 14-72 ms, ``\\div``, ``\\cdot``, ``\\text``,
``\\sqrt`` 6-45 ms. Met again in another string of their kind they took 1-16 ms. Max / p90
per pass (quiet; loaded): ``first`` 105 / 14; 234-252 / 35-42 ms. ``preimport`` (the imports
alone) 15 / 8; 36-72 / 23-27 ms. ``warmed`` (:data:`WARMUP` in the worker, 183; 321-541 ms
at each worker's start) 5 / 3; 9-16 / 6-11 ms. ``parent`` (:data:`PREIMPORT`, 260; 352-688
ms, then :data:`WARMUP`, 113; 232-350 ms, once in the parent before the fork, inherited by
every worker, a restarted one too, and frozen by its ``gc.freeze()``) 6 / 4; 12-14 / 8-9 ms.
:func:`wider_prejudge` gave math-verify's verdict on all 12 jobs it would settle, but those
were never the slow ones (at most 15.8 ms).

Adopted: the trainer does the ``parent`` pass's warm-up itself before its first fork
(``verifier._warm_up``, :data:`WARMUP` is its ``WARM_UP``); this probe marks it done so
that the other passes still start cold. Not yet seen on a GPU node's real run.
"""

from __future__ import annotations

import argparse
import gc
import importlib
import json
import logging
import os
import random
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from grpo_hpc.tasks.answers import extract_answer, extract_gold, gold_value, prejudge
from grpo_hpc.train.rewards import verifier

Job = tuple[str, str, bool]

WARMUP: tuple[Job, ...] = verifier.WARM_UP
"""The trainer's own warm-up answers (``verifier.WARM_UP``), judged once when a warmed
worker starts or, in the ``parent`` pass, by the parent before the fork."""

EXTRA: tuple[Job, ...] = (
    ("75%", "12", False),
    ("\\sqrt{9}", "12", False),
    ("y", "12", False),
    ("$7.25", "12", False),
    ("5 apples", "12", False),
    ("5/8", "12", False),
    ("-0.75", "12", False),
    ("10 + 5", "12", False),
    ("6 \\times 2", "12", False),
    ("3 \\cdot 4", "12", False),
    ("15 \\div 3", "12", False),
    ("\\text{5 apples}", "12", False),
    ("1/2 cup", "12", False),
)
"""Synthetic answer lines of :data:`WARMUP`'s kinds but other strings, appended to the
run's jobs with ``--extra``: does a warm-up cover a kind, or only its own string?"""

PREIMPORT: tuple[str, ...] = verifier._WARM_MODULES
"""Modules math-verify's judging imports lazily (``sympy.simplify`` imports the units
package on its first call), imported in the parent before the fork in the last pass."""


def generate(
    n_prompts: int, out: Path, per_prompt: int = 8, seed: int = 0, max_new_tokens: int = 256
) -> None:
    """Sample ``per_prompt`` completions for each of ``n_prompts`` GSM8K train prompts."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from grpo_hpc.config.schema import ModelConfig
    from grpo_hpc.tasks.problems import GSM8K_DIR, load_file, prompt_text
    from grpo_hpc.train.setup.models import SMOLLM2, materialize

    torch.manual_seed(seed)
    path = materialize(ModelConfig(name_or_path=SMOLLM2), Path(tempfile.gettempdir()), seed)
    tok = AutoTokenizer.from_pretrained(path)
    tok.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    rows = load_file(GSM8K_DIR / "train.jsonl")
    picked = random.Random(seed).sample(range(len(rows)), n_prompts)
    with out.open("w") as f:
        for b in range(0, n_prompts, 8):
            t = time.perf_counter()
            batch = [rows[i] for i in picked[b : b + 8]]
            texts = [prompt_text(tok, p["question"]) for p in batch]
            enc = tok(texts, return_tensors="pt", padding=True, add_special_tokens=False)
            with torch.no_grad():
                ids = model.generate(
                    **enc, do_sample=True, temperature=1.0, top_p=1.0, top_k=0,
                    max_new_tokens=max_new_tokens, num_return_sequences=per_prompt,
                    pad_token_id=tok.pad_token_id,
                )  # fmt: skip
            done = tok.batch_decode(ids[:, enc["input_ids"].shape[1] :], skip_special_tokens=True)
            for k, text in enumerate(done):
                row = {"prompt": picked[b + k // per_prompt], "completion": text}
                f.write(json.dumps({**row, "gold": batch[k // per_prompt]["gold"]}) + "\n")
            f.flush()
            took = time.perf_counter() - t
            print(f"generated {b + len(batch)}/{n_prompts} prompts ({took:.0f} s)", flush=True)


def trainer_jobs(rows: list[dict[str, Any]]) -> tuple[list[Job], list[float | None], int]:
    """The jobs ``score_correctness`` (require_marker=true) sends to math-verify, the
    pre-judge's score of each row (None: sent), and the number of rows."""
    jobs, pre = [], []
    for row in rows:
        gold, answer = extract_gold(row["gold"] or ""), extract_answer(row["completion"])
        score = prejudge(answer, gold)
        pre.append(score)
        if score is None:
            jobs.append((answer, gold, gold_value(gold) is None))
    return jobs, pre, len(rows)


_PLAIN_REST_RE = re.compile(r"[A-Za-z]{2,}|[\s$.,:;!?'\"]")
_FUNCTION_WORDS = {"sqrt", "log", "ln", "exp", "sin", "cos", "tan", "pi", "infty", "frac"}


def wider_prejudge(answer: str, gold: str) -> float | None:
    """A candidate pre-judge that would also settle a wrong plain number: 0 when the answer
    line is one number (as :func:`prejudge` reads it, commas and decimals allowed) and
    otherwise only words (no function names), spaces and ``$.,:;!?``, and the number is
    not the numeric gold (nor within 1e-6 of it, relatively); else None (math-verify)."""
    from fractions import Fraction

    from grpo_hpc.tasks.answers import _TOKEN_RE, numeric_values

    g, values = gold_value(gold), numeric_values(answer)
    if g is None or not values or len(values) != 1:
        return None
    rest = _TOKEN_RE.sub(" ", answer)
    words = set(re.findall(r"[A-Za-z]+", rest.lower()))
    if _PLAIN_REST_RE.sub("", rest) or words & _FUNCTION_WORDS:
        return None
    (v,) = values
    return None if abs(v - g) <= Fraction(1, 10**6) * max(1, abs(g)) else 0.0


def _instrument(log: Path) -> None:
    """Wrap the worker's ``_judge`` (looked up at each call) to append, per item, its own
    time and the collections it ran, as one JSON line to ``log``; runs in the parent
    before the fork, so every worker inherits it."""
    real = verifier._judge
    collections: list[tuple[int, float]] = []
    began = [0.0]

    def cb(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            began[0] = time.perf_counter()
        else:
            collections.append((info["generation"], time.perf_counter() - began[0]))

    def judged(answer: str, gold: str, symbolic: bool) -> float:
        if cb not in gc.callbacks:
            gc.callbacks.append(cb)
        collections.clear()
        before = set(sys.modules)
        t = time.perf_counter()
        score = real(answer, gold, symbolic)
        took = time.perf_counter() - t
        gcs = [(g, round(d, 6)) for g, d in collections]
        new = sorted(set(sys.modules) - before)
        with log.open("a") as f:
            f.write(json.dumps({"pid": os.getpid(), "s": took, "gc": gcs, "imports": new}) + "\n")
        return score

    judged.real = real  # type: ignore[attr-defined]
    verifier._judge = judged


def timed_pass(jobs: list[Job], log: Path, warmup: tuple[Job, ...] = ()) -> dict[str, Any]:
    """A fresh worker judges ``SELF_CHECK`` (as every trainer rank does at start-up:
    ``rewards.prove_workers``) and ``warmup``, each timed as a whole, then each job alone."""
    from grpo_hpc.train.rewards.verifier import SELF_CHECK, VERIFIER

    VERIFIER._stop()
    VERIFIER._start()
    start_s = []
    for items in (SELF_CHECK, warmup):
        t = time.perf_counter()
        if items:
            VERIFIER.judge(list(items), 30.0)
        start_s.append(time.perf_counter() - t)
    log.write_text("")
    walls, scores = [], []
    for job in jobs:
        t = time.perf_counter()
        got, failures = VERIFIER.judge([job], 5.0)
        walls.append(time.perf_counter() - t)
        scores.append(-1.0 if failures else got[0])
    inner = [json.loads(line) for line in log.read_text().splitlines()]
    return {"wall": walls, "score": scores, "inner": inner, "self_check_s": start_s[0],
            "warmup_s": start_s[1]}  # fmt: skip


def _q(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * len(s)))]


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--completions", type=Path, required=True, help="JSONL (see above)")
    p.add_argument("--generate", type=int, default=0, metavar="N",
                   help="first sample N prompts x 8 completions into --completions")  # fmt: skip
    p.add_argument("--max-new-tokens", type=int, default=256, help="for --generate")
    p.add_argument("--extra", action="store_true", help="append EXTRA's synthetic jobs")
    p.add_argument("--bare", action="store_true", help="do not import torch/transformers")
    p.add_argument("--slow-ms", type=float, default=30.0, help="what counts as a slow item")
    p.add_argument("--top", type=int, default=10, help="slowest items listed")
    p.add_argument("--out", type=Path, help="every time, as JSON")
    args = p.parse_args()
    if args.generate:
        generate(args.generate, args.completions, max_new_tokens=args.max_new_tokens)
    if not args.bare:
        import torch  # noqa: F401  (the trainer's heap and modules, inherited by the fork)
        import transformers  # noqa: F401
    rows = [json.loads(line) for line in args.completions.read_text().splitlines() if line]
    jobs, pre, n = trainer_jobs(rows)
    settled = [s for s in pre if s is not None]
    real = len(jobs)
    if args.extra:
        jobs += EXTRA
    print(f"{n} completions: pre-judge settles {len(settled)} ({sum(settled):.0f} right); "
          f"{real} go to math-verify (+{len(jobs) - real} synthetic: --extra)")  # fmt: skip
    if not jobs:
        return
    log = Path(tempfile.mkstemp(prefix="verifier_items_", suffix=".jsonl")[1])
    # The trainer now warms the parent before its first fork (verifier._warm_up: the
    # ``parent`` pass below); taken as done here, so the earlier passes start cold.
    verifier._warmed = True
    _instrument(log)
    passes = {"first": timed_pass(jobs, log)}
    passes["warm"] = timed_pass(jobs, log, tuple(jobs))  # a worker that has judged them all
    rev = timed_pass(jobs[::-1], log)
    passes["rev"] = {k: v[::-1] if isinstance(v, list) else v for k, v in rev.items()}
    passes["warmed"] = timed_pass(jobs, log, WARMUP)
    t = time.perf_counter()
    for name in PREIMPORT:  # in the parent: every worker forked from now on has them
        importlib.import_module(name)
    preimport_s = time.perf_counter() - t
    passes["preimport"] = timed_pass(jobs, log)
    passes["both"] = timed_pass(jobs, log, WARMUP)
    logging.getLogger("math_verify").setLevel(logging.CRITICAL)  # as the worker does
    t = time.perf_counter()
    for job in WARMUP:  # in the parent, before the fork: every worker inherits the caches
        verifier._judge.real(*job)  # type: ignore[attr-defined]
    parent_s = time.perf_counter() - t
    passes["parent"] = timed_pass(jobs, log)
    from grpo_hpc.train.rewards.verifier import VERIFIER

    VERIFIER._stop()
    log.unlink()

    print(f"{'pass':8} {'median ms':>9} {'p90 ms':>7} {'max ms':>7} {'slow':>5}  in-worker max ms")
    for name, r in passes.items():
        w = [x * 1e3 for x in r["wall"]]
        inner = max((i["s"] for i in r["inner"]), default=0) * 1e3
        slow = sum(x > args.slow_ms for x in w)
        print(f"{name:8} {statistics.median(w):9.1f} {_q(w, 0.9):7.1f} {max(w):7.1f} "
              f"{slow:5d}  {inner:.1f}")  # fmt: skip
    print(f"worker start-up: SELF_CHECK {passes['first']['self_check_s'] * 1e3:.0f} ms "
          f"(first), {passes['preimport']['self_check_s'] * 1e3:.0f} ms (preimport); "
          f"WARMUP's {len(WARMUP)} items after it {passes['warmed']['warmup_s'] * 1e3:.0f} ms "
          f"({passes['both']['warmup_s'] * 1e3:.0f} ms after PREIMPORT); "
          f"PREIMPORT in the parent {preimport_s * 1e3:.0f} ms, then WARMUP in the parent "
          f"{parent_s * 1e3:.0f} ms")  # fmt: skip
    order = sorted(range(len(jobs)), key=lambda i: -passes["first"]["wall"][i])
    print(f"\nslowest {args.top} items in 'first' (ms: {' / '.join(passes)}; worker gc in first)")
    for i in order[: args.top]:
        times = " / ".join(f"{passes[k]['wall'][i] * 1e3:5.1f}" for k in passes)
        first = passes["first"]["inner"][i]
        gcs = sum(d for _, d in first["gc"]) * 1e3
        a, g, sym = jobs[i]
        mods = first["imports"]
        tag = "x" if i >= real else "#"
        print(f"{tag}{i:3d} {times}  gc {gcs:5.1f}  score {passes['first']['score'][i]:.0f}  "
              f"gold {g!r}{' (symbolic)' if sym else ''}  answer {a[:70]!r}")  # fmt: skip
        if mods:
            print(f"      imported {len(mods)} modules: {', '.join(mods[:4])}")
    agree = [passes[k]["score"] == passes["first"]["score"] for k in passes]
    print(f"\nverdicts equal across passes: {all(agree)}")
    wider = [wider_prejudge(a, g) for a, g, _ in jobs]
    settled_i = [i for i, w in enumerate(wider) if w is not None]
    differ = [i for i in settled_i if wider[i] != passes["first"]["score"][i]]
    took = max((passes["first"]["wall"][i] for i in settled_i), default=0.0) * 1e3
    print(f"wider_prejudge would settle {len(settled_i)} of {len(jobs)} jobs, "
          f"{len(differ)} with another verdict than math-verify's: "
          f"{[jobs[i][:2] for i in differ][:5]}; math-verify's slowest of them in 'first': "
          f"{took:.1f} ms")  # fmt: skip
    if args.out:
        args.out.write_text(json.dumps({"jobs": jobs, "passes": passes}, indent=1))


if __name__ == "__main__":
    main()
