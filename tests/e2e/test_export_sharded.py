"""grpo-export of a 2-rank FSDP2 run (DCP shards, gloo on CPU): the export, read in one
process without a process group and without the optimizer, gives exactly the log-probs of
the trainer's weights gathered from the same shards; the trainer's own final/ too; and
grpo-eval of the run, on one process, replays the two ranks' held-out batches and scores
what the trainer's last evaluation scored."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from grpo_hpc.cli import eval as evaluate
from grpo_hpc.cli import export
from grpo_hpc.train.state.checkpoint import SHARDED, format_of
from tests.e2e.export_helpers import batch, load_export, logprobs, trainer_model
from tests.e2e.helpers import make_run, train


@pytest.mark.slow
def test_export_of_a_sharded_checkpoint(tmp_path: Path) -> None:
    paths = make_run(
        tmp_path, "fsdp", "dist.strategy=fsdp", "training.max_steps=2", "training.eval_every=2",
        "data.num_eval=7", "data.num_val=0", nproc=2,
    )  # fmt: skip
    result = train(paths, nproc=2)
    assert result.returncode == 0, result.stderr[-3000:]
    assert format_of(paths.checkpoint(2)) == SHARDED
    out = tmp_path / "hf"
    assert export.main([str(paths.root), str(out)]) == 0
    enc = batch(out)
    want = logprobs(trainer_model(paths, 2), enc)
    assert torch.equal(logprobs(load_export(out), enc), want)
    assert torch.equal(logprobs(load_export(paths.final), enc), want)  # written by rank 0
    # 7 held-out problems over 2 ranks: 4 each, the second padded with a repeat.
    rows = map(json.loads, paths.metrics.read_text().splitlines())
    last = [m for m in rows if "eval/accuracy" in m]
    assert evaluate.main([str(paths.root), "--out", str(tmp_path / "e.json")]) == 0
    r = json.loads((tmp_path / "e.json").read_text())
    assert r["batch"] == {"rows": 4, "ranks": 2} and r["problems"] == 7
    assert r["accuracy"] == last[-1]["eval/accuracy"] and r["step"] == last[-1]["step"] == 2
