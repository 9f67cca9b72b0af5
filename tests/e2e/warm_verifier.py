"""Preloaded by the trainer fork server (tests/e2e/trainer_fork.py) after the trainer: the
math-verify warm-up every trainer does before it forks its reward worker
(``grpo_hpc.train.rewards.verifier``: sympy's lazy imports and the first parse of each kind
of answer, ~0.4 s of CPU here), done once in the server, so each forked trainer and the
worker it forks start warm, as a production worker starts from its warmed trainer. The
warm-up itself stays under test in every trainer started as a program (torchrun, Slurm)
and in tests/unit/train/rewards."""

from grpo_hpc.train.rewards import verifier

verifier._warm_up()
