"""The task of bench/learning/run.py as TRL's runner needs it in Python: configs/demo.yaml's
system prompt and reward, and the problems (``data_config``) that grpo_hpc's run is given
through ``overrides`` in bench/learning/run.py.

Separate so that bench/learning/trl_runner.py does not import the benchmark script; a change here
must be matched in ``overrides`` (and configs/demo.yaml) for grpo_hpc's side.
"""

from __future__ import annotations

import argparse
from dataclasses import replace

from grpo_hpc.config.schema import DataConfig, RewardConfig

SYSTEM = "Solve it. End with the line 'Answer: <number>'."  # configs/demo.yaml's
REWARD = RewardConfig(correctness=1.0, format=0.2, overlong=0.5, require_marker=False)
"""configs/demo.yaml's reward; ``--overlong mask`` sets its overlong weight to 0."""


def reward_config(args: argparse.Namespace) -> RewardConfig:
    """The task's reward: the demo's, whose cut-off completions lose 0.5 (``penalty``), or
    with DAPO's overlong filtering instead (``mask``: they score 0 for length and train
    nothing, on both systems)."""
    return replace(REWARD, overlong=REWARD.overlong if args.overlong == "penalty" else 0.0)


def data_config(args: argparse.Namespace) -> DataConfig:
    """The task's problems: ``args.terms``-term word-problem sums (operands up to 20), 2000
    to train on and ``args.num_eval`` held out, under the demo's system prompt."""
    return DataConfig(
        source="arithmetic",
        num_train=2000,
        num_eval=args.num_eval,
        min_terms=args.terms,
        max_terms=args.terms,
        max_operand=20,
        system_prompt=SYSTEM,
    )
