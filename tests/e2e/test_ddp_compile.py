"""Decoder layers compiled inside DDP (the trainer's ``dist.compile`` under ``dist.strategy
=ddp``) all-reduce the same gradients as an eager model trained alone: real torchrun
processes, gloo, a real tiny Qwen2 loaded through from_pretrained, CPU Inductor.

The trainer compiles under DDP without Dynamo's DDPOptimizer (``dist.wrap``, after a real
2-GPU run died recompiling in it); this checks that DDP's own reducer still sums every
compiled layer's gradient over the ranks."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.unit.train.test_packing import _model_dir

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]


def test_compiled_layers_under_ddp_match_eager(tmp_path: Path) -> None:
    model = _model_dir(tmp_path, "qwen2")
    worker = Path(__file__).with_name("ddp_compile_worker.py")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
           "--nproc-per-node=2", str(worker), str(model)]  # fmt: skip
    # One compile thread: Inductor's worker pool can hang a process's exit after the work is
    # done (pytorch/pytorch#162199), which cost a CI run 600 s here after the check passed.
    env = os.environ | {"PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1",
                        "TORCHINDUCTOR_COMPILE_THREADS": "1",
                        "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor")}  # fmt: skip
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env, cwd=ROOT)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "gradients match eager on 2 ranks" in result.stdout
