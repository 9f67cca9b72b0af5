"""A stop signal that reaches the trainer while it is still importing torch (seconds to
minutes on a cluster's shared filesystem) is remembered and answered with exit 5, not lost.

The real torchrun and trainer run; a sitecustomize on the worker's PYTHONPATH holds the
worker's ``import torch``, says when, and holds it until the test has sent the signal, so
the signal lands there however loaded the machine."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from grpo_hpc.core.errors import ExitCode
from grpo_hpc.core.progress import TrainState, read_progress
from grpo_hpc.node.launch import ignore_preempt_signals
from tests.e2e.helpers import env, make_run, signal_job, torchrun_cmd
from tests.slowdown import guard

SLOW_TORCH_IMPORT = '''
import os, sys, time

class _HoldTorch:
    """In the trainer only (not in torchrun itself), stall the torch import until the test
    says it has signalled (HOLD_RELEASE), two minutes at most."""
    def find_spec(self, name, path=None, target=None):
        if name == "torch" and "grpo_hpc.train" in sys.modules:
            sys.meta_path.remove(self)
            open(os.environ["HOLD_MARKER"], "w").close()
            deadline = time.monotonic() + 120
            while not os.path.exists(os.environ["HOLD_RELEASE"]) and time.monotonic() < deadline:
                time.sleep(0.05)
        return None

sys.meta_path.insert(0, _HoldTorch())
'''


@pytest.mark.slow
def test_signal_during_imports_exits_resubmit_me(tmp_path: Path) -> None:
    paths = make_run(tmp_path, "early", "training.max_steps=2")
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(SLOW_TORCH_IMPORT)
    marker = tmp_path / "importing-torch"
    run_env = env()
    run_env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(hook), run_env.get("PYTHONPATH")]))
    run_env["HOLD_MARKER"] = str(marker)
    release = tmp_path / "signalled"
    run_env["HOLD_RELEASE"] = str(release)
    proc = subprocess.Popen(
        torchrun_cmd(paths, 1),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=run_env,
        start_new_session=True,
        preexec_fn=ignore_preempt_signals,  # as under the launcher: USR1 ignored at exec
    )
    deadline = time.time() + 120
    while not marker.exists() and time.time() < deadline and proc.poll() is None:
        time.sleep(0.05)
    assert marker.exists(), "the trainer never started importing torch"
    signal_job(proc.pid, signal.SIGUSR1)  # Slurm's time-limit warning, mid-import
    release.touch()  # the import goes on only now: the signal came while it was held
    proc.wait(timeout=guard(180))
    rec = read_progress(paths.progress)
    assert rec is not None and rec.state == TrainState.INTERRUPTED, rec
    assert rec.exit_code == ExitCode.CHECKPOINTED and rec.step == 0
    assert "SIGUSR1" in rec.reason and "start-up" in rec.reason
    assert paths.checkpoint_steps(complete_only=False) == []  # nothing to save: none written
