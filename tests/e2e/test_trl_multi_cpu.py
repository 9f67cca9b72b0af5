"""bench.trl.baseline --nproc 2 end to end on a CPU: TRL under a real ``accelerate launch``
of two processes with the FSDP2 config, grpo_hpc under torchrun with two ranks, one result.
On a CPU the Trainer wraps nothing (it trains each rank alone), and the result says so;
on GPUs the same check turns that into an error (bench/trl/multi.py)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from ..slowdown import guard

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_two_process_trl_and_grpo_hpc_in_one_result(tmp_path: Path) -> None:
    out = tmp_path / "r.json"
    cmd = [
        sys.executable, "-m", "bench.trl.baseline", "--shape=tiny", "--prompts=2", "--G=2",
        "--max-new=8", "--micro=1", "--steps=2", "--precision=fp32", "--nproc=2",
        "--trl-mode=fsdp2", "--engine=native",
        "--variants", "fsdp=--strategy fsdp --no-compile --no-packing", f"--out={out}",
    ]  # fmt: skip
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=guard(600))
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(out.read_text())
    trl = result["trl"]
    assert "error" not in trl, trl.get("error", "")[-2000:]
    assert trl["mode"] == "fsdp2" and trl["accelerate"]["distributed_type"] == "FSDP"
    assert trl["accelerate"]["fsdp_config"]["fsdp_transformer_layer_cls_to_wrap"] == (
        "LlamaDecoderLayer"
    )
    assert len(trl["peak_gib_per_rank"]) == 2  # both ranks ran and wrote their result
    assert len(trl["s_per_step_all"]) == 2 and trl["s_per_step_median"] > 0
    assert "unsharded" in trl["distributed_problem"]  # the CPU's limit, stated
    ours = result["grpo_hpc"]["fsdp"]
    assert ours["config"]["nproc"] == 2 and ours["config"]["strategy"] == "fsdp"
    assert ours["speedup_vs_trl"] > 0
