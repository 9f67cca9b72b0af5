"""A short fault campaign (bench/faults/run.py) on the real local Slurm cluster, as CI runs it:
a trainer SIGKILLed inside a checkpoint save, grpo-monitor SIGKILLed and started again,
the job scancel'd. Every trial must finish with the uninterrupted run's weights, with
never two live jobs of one run and no checkpoint failing grpo-ckpt verify. (slurmctld
stopped under a monitor: test_monitor_slurm.py; a node killed under a two-node run, whose
weights must match an uninterrupted one: test_multinode_slurm.py; a monitor on a full disk:
tests/unit/monitor/test_monitor_full_disk.py. With a disk_full trial added here, trial 8,
the test took 141 s instead of ~53 s in one run on the loaded 2-core machine.)"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from .slurm_helpers import REPO, cli_env

pytestmark = pytest.mark.slurm

CI_TRIALS = "1,33,4"
"""kill_trainer_in_save, kill_monitor and scancel of seed 1 (KINDS[i % 10]). Trial 33's
monitor kill comes 0.5 s after the start (trial 3's came at 8 s, after a 3-step run could
already have finished on a fast machine, and then the test proved nothing)."""


@pytest.mark.timeout(240)
def test_short_fault_campaign(slurm_cluster, tmp_path: Path) -> None:
    out = tmp_path / "campaign.json"
    cmd = [sys.executable, "-m", "bench.faults", "--seed", "1", "--only", CI_TRIALS]
    cmd += ["--max-steps", "3", "--parallel", "4"]
    cmd += ["--out", str(out), "--work", str(tmp_path / "work")]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=cli_env(), timeout=230, cwd=REPO)
    doc = json.loads(out.read_text()) if out.exists() else {}
    detail = proc.stdout[-3000:] + proc.stderr[-3000:] + json.dumps(doc.get("trials"), indent=1)
    assert proc.returncode == 0, detail
    total = doc["summary"]["total"]
    assert total["trials"] == 3 and total["passed"] == 3, detail
    assert total["duplicate_job_trials"] == 0 and total["bad_checkpoints"] == 0
    assert all(t["struck"] for t in doc["trials"]), "a fault never struck: the test proved nothing"
