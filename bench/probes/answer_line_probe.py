"""How often does SmolLM2-135M-Instruct write the ``Answer: N`` line when *sampled*?

GRPO can only reinforce what its rollouts contain. The demo's held-out evaluation is
greedy; its rollouts are sampled. This samples 8 demo problems x 4 completions per setting
(system prompt, token cap, temperature) with the native engine on the CPU and reports the
share with a correct strict answer (answer line required), a correct lenient one (last
number), the format reward, and the share cut off at the cap.

    python -m bench.probes.answer_line_probe --model ~/.cache/grpo_hpc/models/smollm2-135m-instruct
"""

from __future__ import annotations

import argparse
import itertools
from pathlib import Path

import torch

from grpo_hpc.config.schema import DataConfig
from grpo_hpc.tasks.problems import load_problems, prompt_text
from grpo_hpc.train.rewards import functions as rewards
from grpo_hpc.train.rollout.native.engine import NativeEngine
from grpo_hpc.train.setup.models import load_model_and_tokenizer

PROMPTS = {
    "demo": "Solve it. End with the line 'Answer: <number>'.",
    "example": "Solve it. Reply like this example:\n3 + 4 = 7\nAnswer: 7",
}


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--model", type=Path, required=True)
    p.add_argument("--caps", type=int, nargs="+", default=[48, 96])
    p.add_argument("--temperatures", type=float, nargs="+", default=[0.9, 0.6])
    args = p.parse_args()
    torch.set_num_threads(2)
    model, tok = load_model_and_tokenizer(args.model, "sdpa", torch.device("cpu"))
    data = DataConfig(source="arithmetic", num_train=2000, num_eval=32, max_operand=20)
    problems = load_problems(data, 0)[0][:8]
    golds = [q["gold"] for q in problems for _ in range(4)]
    print("prompt   cap  T    strict  lenient  format  cut")
    for name, cap, temp in itertools.product(PROMPTS, args.caps, args.temperatures):
        engine = NativeEngine(model.eval(), tok, cap, temp, 1.0, 600)
        torch.manual_seed(0)
        texts = [prompt_text(tok, q["question"], PROMPTS[name]) for q in problems]
        batch = engine.generate(texts, 4)
        n = len(batch.texts)
        strict = sum(rewards.score_correctness(batch.texts, golds, 2.0, True)[0]) / n
        lenient = sum(rewards.score_correctness(batch.texts, golds, 2.0, False)[0]) / n
        fmt = sum(rewards.format_reward(t) for t in batch.texts) / n
        cut = (batch.completion_mask.sum(1) >= cap).float().mean().item()
        row = f"{name:8s} {cap:4d} {temp:.1f}  {strict:6.3f}  {lenient:7.3f}  {fmt:6.3f}"
        print(f"{row}  {cut:.2f}")


if __name__ == "__main__":
    main()
