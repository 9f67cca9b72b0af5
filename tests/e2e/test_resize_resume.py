"""A run resumed on fewer ranks and back (4 -> 2 -> 4 processes, FSDP2, gloo), as the
monitor does when a node is lost and returns (``nodes_wait_s``): with
``rollout.seed_per_group`` it ends where the uninterrupted 4-process run ends.

What is the same to the bit: every sampled completion (each group's stream is seeded by its
place in the data order, not by its rank), the data position, the learning-rate schedule,
the step. What cannot be: the sums. Two ranks of two groups each add their micro-batches'
gradients before the all-reduce, four ranks of one group each after it, and fp32 addition
is not associative, so weights and optimizer state agree within fp32 rounding only."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from grpo_hpc.core.fsutil import read_jsonl
from grpo_hpc.core.paths import RunPaths
from grpo_hpc.submit.job import rewind

from .helpers import make_run, train

STEPS = 6
ARGS = [
    "dist.strategy=fsdp",
    f"training.max_steps={STEPS}",
    "training.save_every_steps=2",
    "rollout.prompts_per_step=4",
    "rollout.seed_per_group=true",
    "training.keep_last=3",
]


def on(paths: RunPaths, nproc: int) -> None:
    """Train the run (from its newest checkpoint) with ``nproc`` processes."""
    text = paths.config.read_text()
    for n in (1, 2, 4):
        text = text.replace(f"nproc_per_node: {n}\n", f"nproc_per_node: {nproc}\n")
    paths.config.write_text(text)
    result = train(paths, nproc=nproc, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]


def state(paths: RunPaths, step: int, tmp: Path) -> dict:
    """A checkpoint's model and optimizer in one dict (DCP shards gathered)."""
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    ckpt = paths.checkpoint(step)
    if (ckpt / "dcp").is_dir():
        out = tmp / f"{paths.name}-{step}.pt"
        dcp_to_torch_save(ckpt / "dcp", out)
        return torch.load(out, weights_only=False)
    model = torch.load(ckpt / "model.pt", weights_only=False)
    return {"model": model, "optim": torch.load(ckpt / "optim.pt", weights_only=False)}


def tensors(d: object, prefix: str = "") -> dict[str, torch.Tensor]:
    if isinstance(d, torch.Tensor):
        return {prefix: d}
    items = d.items() if isinstance(d, dict) else enumerate(d) if isinstance(d, list) else []
    return {k: v for key, sub in items for k, v in tensors(sub, f"{prefix}/{key}").items()}


def rewards(paths: RunPaths) -> dict[int, float]:
    """reward/mean per step, the last attempt's line for a step logged twice."""
    return {
        int(m["step"]): m["reward/mean"] for m in read_jsonl(paths.metrics) if "reward/mean" in m
    }


@pytest.mark.slow
def test_four_two_four_processes_end_as_the_uninterrupted_run(tmp_path: Path) -> None:
    ref = make_run(tmp_path, "ref", *ARGS, nproc=4)
    on(ref, 4)
    resized = RunPaths(tmp_path / "resized")  # the same run, taken from its step-2 checkpoint
    shutil.copytree(ref.root, resized.root, ignore=shutil.ignore_patterns("*.lock"))
    (resized.root / "config.yaml").write_text(ref.config.read_text())
    for f in (resized.metrics, resized.samples):
        f.unlink(missing_ok=True)
    rewind(resized, 2)
    on(resized, 2)  # steps 3-6 on two processes (two groups each)
    rewind(resized, 4)
    on(resized, 4)  # steps 5-6 on four again

    sizes = [json.loads((resized.checkpoint(s) / "manifest.json").read_text())["world_size"]
             for s in (2, 4, 6)]  # fmt: skip
    assert sizes == [4, 2, 4]
    # Bit for bit: the completions (so the rewards), the data position, the schedule.
    got, want = rewards(resized), rewards(ref)
    assert sorted(got) == [3, 4, 5, 6] and all(got[s] == want[s] for s in got), (got, want)
    # samples.jsonl: rank 0's first completion of each of its groups; the 4-process run's
    # (group 0) is among the 2-process run's (groups 0, 1), the same text for the same problem
    said = {(s["step"], s["question"], s["completion"]) for s in read_jsonl(resized.samples)}
    ref_said = {(s["step"], s["question"], s["completion"]) for s in read_jsonl(ref.samples)}
    assert {x for x in ref_said if x[0] > 2} <= said and len(said) > len(ref_said) - 2
    a, b = (
        torch.load(p.checkpoint(STEPS) / "trainer.pt", weights_only=False) for p in (resized, ref)
    )
    for key in ("step", "sampler", "scheduler"):
        assert a[key] == b[key], key
    # Within fp32 rounding: weights and optimizer state.
    mine, theirs = tensors(state(resized, STEPS, tmp_path)), tensors(state(ref, STEPS, tmp_path))
    assert mine.keys() == theirs.keys() and len(mine) > 10
    worst = max(
        (mine[k] - theirs[k]).abs().max().item() for k in mine if mine[k].is_floating_point()
    )
    for k in mine:
        torch.testing.assert_close(mine[k], theirs[k], rtol=1e-4, atol=1e-5, msg=k)
    print(f"largest difference from the uninterrupted run: {worst:.3g}")
