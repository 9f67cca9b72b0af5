"""Decoder layers compiled (the trainer's ``dist.compile``, dynamic shapes) inside DDP
(``dist.strategy=ddp``), gradient checkpointing recomputing through them, all-reduce the
same loss gradients as an eager model trained alone: two real processes (forked as torchrun
starts them: tests/e2e/trainer_fork.py), gloo, a real tiny Qwen2 loaded through
from_pretrained, CPU Inductor. (It also holds what a single-process test of compiled layers
against eager checked until 2026-12-02: one test compiling instead of two saves ~60 CPU s
of a cold-cache suite.)

The trainer compiles under DDP without Dynamo's DDPOptimizer (``dist.wrap``, after a real
2-GPU run died recompiling in it); this checks that DDP's own reducer still sums every
compiled layer's gradient over the ranks."""

from __future__ import annotations

import os
import signal
import tempfile
from pathlib import Path

import pytest

from tests.e2e.helpers import signal_job
from tests.e2e.trainer_fork import ForkedRun
from tests.unit.train.algo.test_packing import _model_dir

from ..slowdown import guard

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]
WORKER = "tests.e2e.ddp_compile_worker:cli"


def test_compiled_layers_under_ddp_match_eager(tmp_path: Path) -> None:
    model = _model_dir(tmp_path, "qwen2")
    # Inductor's cache is the suite's (the machine's default): a developer's second run
    # compiles nothing.
    env = os.environ | {"PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    with tempfile.NamedTemporaryFile("w+") as out, tempfile.NamedTemporaryFile("w+") as err:
        proc = ForkedRun([str(model)], env, out, err, nproc=2, entry=WORKER)
        try:
            proc.wait(timeout=guard(300))
        finally:  # a worker left behind would hold memory and CPU for the rest of the suite
            signal_job(proc.pid, signal.SIGKILL)
            proc.wait()
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read(), err.read()
    assert proc.returncode == 0, stderr[-3000:]
    assert "gradients match eager on 2 ranks" in stdout
