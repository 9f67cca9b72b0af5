"""``optim.skip_empty_steps`` through the real trainer, at its defaults: a run trains three
steps with rewards (the tiny task's partial credit), then is resumed with every reward forced
to zero, so steps 4 and 5 are flat and their gradient is exactly zero. An asynchronous run
(``algo.max_staleness=1``, the option unset: on) keeps the weights and AdamW's state of step
3 at step 5, bit for bit; a synchronous one (unset: off, TRL's behaviour) lets AdamW's
momentum move the weights on the zero gradients. The explicit settings are the resolver's
(tests/unit/train/algo/test_optimizer_choice.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from grpo_hpc.core.fsutil import read_jsonl

from .helpers import assert_same, full_state, make_run, train


def _run_then_zero_reward(root: Path, staleness: int) -> tuple[dict, list[float]]:
    """Steps 1-3 at ``algo.max_staleness=staleness``, steps 4-5 resumed with every reward
    zero; the model and optimizer states of steps 3 and 5, and every step's gradient norm."""
    paths = make_run(root, f"k{staleness}", "training.max_steps=3", "training.save_every_steps=1",
                     "training.keep_last=10", f"algo.max_staleness={staleness}")  # fmt: skip
    first = train(paths)
    assert first.returncode == 0, first.stderr[-3000:]
    cfg = yaml.safe_load(paths.config.read_text())
    cfg["training"]["max_steps"] = 5
    cfg["faults"].update(enabled=True, zero_reward=True)
    paths.config.write_text(yaml.safe_dump(cfg, sort_keys=False))
    again = train(paths)  # resumes from step 3
    assert again.returncode == 0, again.stderr[-3000:]
    norms = [m["grad_norm"] for m in read_jsonl(paths.metrics) if "grad_norm" in m]
    return {"step3": full_state(paths, 3), "step5": full_state(paths, 5)}, norms


@pytest.mark.slow
def test_no_adamw_step_where_the_gradient_is_zero(tmp_path: Path) -> None:
    import torch

    kept, norms = _run_then_zero_reward(tmp_path, staleness=1)
    assert len(norms) == 5 and all(n > 0 for n in norms[:3]), norms  # momentum to carry on
    assert norms[3:] == [0.0, 0.0], norms  # the resumed steps are flat
    assert_same(kept["step3"], kept["step5"])  # weights and AdamW's moments untouched

    moved, norms = _run_then_zero_reward(tmp_path, staleness=0)
    assert norms[3:] == [0.0, 0.0], norms
    (model3, _), (model5, _) = moved["step3"], moved["step5"]
    assert any(not torch.equal(model3[k], model5[k]) for k in model3), "AdamW never drifted"
