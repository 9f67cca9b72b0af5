"""The GPU fault campaign's harness (bench/faults/gpu_run.py) on the CPU test cluster, as CI can
run it: the same 2-rank FSDP2 run through grpo-submit and grpo-monitor on CPU ranks (gloo),
a rank SIGKILLed inside a DCP save, resumed from the checkpoint before it with every rank's
state equal to its digest. On a GPU node the harness ran 18 trials of six kinds
(bench/results/gpu_faults_h100x4_2026-11-26.md); here CI keeps the harness honest. (The OOM stop has
its own end-to-end test: tests/e2e/test_oom_monitor.py.)"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from ..slowdown import guard
from .slurm_helpers import REPO, cli_env

pytestmark = pytest.mark.slurm

CI_TRIAL = "3"
"""kill_rank_in_save of seed 1 (KINDS[i % 6])."""


@pytest.mark.timeout(300)
def test_gpu_fault_harness_on_cpu_ranks(slurm_cluster, tmp_path: Path) -> None:
    out = tmp_path / "gpu_faults.json"
    cmd = [sys.executable, "-m", "bench.faults.gpu_run", "--only", CI_TRIAL, "--max-steps", "6"]
    cmd += ["--profile", str(REPO / "templates/slurm-local.yaml"), "--out", str(out)]
    cmd += ["--work", str(tmp_path / "work"), "--evidence", str(tmp_path / "evidence")]
    proc = subprocess.run(
        cmd, capture_output=True, text=True, env=cli_env(), timeout=guard(290), cwd=REPO
    )
    doc = json.loads(out.read_text()) if out.exists() else {}
    detail = proc.stdout[-3000:] + proc.stderr[-3000:] + json.dumps(doc.get("trials"), indent=1)
    assert proc.returncode == 0, detail
    trials = {t["kind"]: t for t in doc["trials"]}
    assert all(t["passed"] for t in trials.values()), detail
    save = trials["kill_rank_in_save"]
    assert save["injected"] and save["resumes"] == 2 and not save["resume_mismatch"], detail
    assert (tmp_path / "evidence" / "trial-003-kill_rank_in_save" / "state_digest").is_dir()
