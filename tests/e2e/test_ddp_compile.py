"""Decoder layers compiled inside DDP (the trainer's ``dist.compile`` under ``dist.strategy
=ddp``) all-reduce the same gradients as an eager model trained alone: real torchrun
processes, gloo, a real tiny Qwen2 loaded through from_pretrained, CPU Inductor.

The trainer compiles under DDP without Dynamo's DDPOptimizer (``dist.wrap``, after a real
2-GPU run died recompiling in it); this checks that DDP's own reducer still sums every
compiled layer's gradient over the ranks."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from tests.e2e.helpers import signal_job
from tests.unit.train.algo.test_packing import _model_dir

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]


def test_compiled_layers_under_ddp_match_eager(tmp_path: Path) -> None:
    model = _model_dir(tmp_path, "qwen2")
    worker = Path(__file__).with_name("ddp_compile_worker.py")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
           "--nproc-per-node=2", str(worker), str(model)]  # fmt: skip
    env = os.environ | {"PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1",
                        "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor")}  # fmt: skip
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen(cmd, stdout=out, stderr=err, text=True, env=env, cwd=ROOT)
        try:
            proc.wait(timeout=300)
        finally:  # a worker left behind would hold memory and CPU for the rest of the suite
            signal_job(proc.pid, signal.SIGKILL)
            proc.kill()
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read(), err.read()
    assert proc.returncode == 0, stderr[-3000:]
    assert "gradients match eager on 2 ranks" in stdout
