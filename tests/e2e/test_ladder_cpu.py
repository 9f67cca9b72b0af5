"""bench/memory/ladder.py (``python -m bench.memory.ladder``) end to end on CPU with the tiny
shape: a row runs the real trainer in its own process, lands in the JSON with its figures and the
estimator's, and is not rerun."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.e2e.helpers import env

from ..slowdown import guard

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]
LADDER = [sys.executable, "-m", "bench.memory.ladder"]  # run from REPO


def test_ladder_runs_a_tiny_row_on_cpu(tmp_path: Path) -> None:
    out = tmp_path / "ladder.json"
    cmd = [*LADDER, "--device", "cpu", "--shapes", "tiny", "--budgets",
           "supercloud", "--modes", "full", "--steps", "2", "--max-new", "8", "--prompts", "2",
           "--G", "4", "--out", str(out)]  # fmt: skip
    first = subprocess.run(
        cmd, capture_output=True, text=True, env=env(), timeout=guard(300), cwd=REPO
    )
    assert first.returncode == 0, first.stderr[-3000:]
    (row,) = json.loads(out.read_text())["rows"]
    assert row["status"] == "fits" and row["measured"] and row["exit_code"] == 0
    assert row["s_per_step"] > 0 and row["generate_s"] > 0 and row["update_s"] > 0
    assert row["run_settings"]["precision"] == "fp32" and row["prompt_tokens"] > 100
    assert row["estimate_2gpu"]["settings"].startswith("ddp")  # supercloud's strategy
    again = subprocess.run(
        cmd, capture_output=True, text=True, env=env(), timeout=guard(300), cwd=REPO
    )
    assert again.returncode == 0 and again.stdout == ""  # the measured row is kept, not rerun
    # A stale row is not kept: it is taken up again. With no time left to run it (a zero
    # budget, so that the test runs the trainer twice, not three times) it is replaced by
    # the "not run" row, as any row due to run would be.
    result = json.loads(out.read_text())
    result["rows"][0]["stale"] = "measured before a change"
    out.write_text(json.dumps(result))
    third = subprocess.run([*cmd, "--time-budget", "0"], capture_output=True, text=True,
                           env=env(), timeout=guard(300), cwd=REPO)  # fmt: skip
    assert third.returncode == 0, third.stderr[-3000:]
    (taken_up,) = json.loads(out.read_text())["rows"]
    assert "stale" not in taken_up and not taken_up["measured"], taken_up
    assert taken_up["status"] == "not run: ladder time budget spent", taken_up


def test_ladder_runs_a_two_rank_row_as_the_2gpu_profile_would(tmp_path: Path) -> None:
    out = tmp_path / "ladder.json"
    cmd = [*LADDER, "--device", "cpu", "--nproc", "2", "--shapes", "tiny",
           "--budgets", "h100", "--modes", "lora", "--steps", "2", "--max-new", "8",
           "--prompts", "2", "--G", "4", "--out", str(out)]  # fmt: skip
    run = subprocess.run(
        cmd, capture_output=True, text=True, env=env(), timeout=guard(300), cwd=REPO
    )
    assert run.returncode == 0, run.stderr[-3000:]
    (row,) = json.loads(out.read_text())["rows"]
    assert row["status"] == "fits", row.get("error")
    assert row["gpus"] == 2 and row["s_per_step"] > 0
    # h100x2 replicates what fits (DDP); the row ran that plan, with LoRA, on two ranks.
    s = row["run_settings"]
    assert (s["ranks"], s["strategy"], s["lora_rank"]) == (2, "ddp", 16)
