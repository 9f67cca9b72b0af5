"""The end of a finished run: its final weights verified on disk, every rank agreeing."""

from __future__ import annotations

from grpo_hpc.core.manifest import CheckpointIncompleteError
from grpo_hpc.core.paths import RunPaths
from grpo_hpc.train.distributed import dist
from grpo_hpc.train.state import checkpoint


def verify_final_weights(paths: RunPaths, step: int, info: dist.DistInfo) -> None:
    """Success only with the final weights of ``step`` on disk and verified (sha256 of
    every file, on rank 0); every rank raises if they are not."""
    problems = checkpoint.final_weights_problems(paths, step) if info.is_main else []
    if dist.all_reduce_max(float(bool(problems)), info) > 0:
        why = "; ".join(problems[:3]) or "see rank 0"
        raise CheckpointIncompleteError(f"final weights of step {step} not verified: {why}")
