"""torchrun target: ``torchrun ... -m grpo_hpc.train <run_dir>``.

Reads the run's resolved config, joins the process group, trains, and records how
it ended in progress.json (state, exit code, reason) before exiting with that code.
"""

from __future__ import annotations

import os
import signal
import sys
import traceback
from pathlib import Path

from grpo_hpc.config import load_resolved
from grpo_hpc.errors import ExitCode, GrpoError
from grpo_hpc.paths import RunPaths
from grpo_hpc.progress import ProgressRecord, TrainState, write_progress


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        sys.stderr.write("usage: torchrun ... -m grpo_hpc.train <run_dir>\n")
        return ExitCode.CONFIG_ERROR
    paths = RunPaths(Path(argv[0]).resolve())
    from grpo_hpc.train import dist

    trainer = None
    try:
        cfg = load_resolved(paths.config)
        info = dist.init(cfg.dist)
        from grpo_hpc.train.trainer import Trainer

        trainer = Trainer(cfg, paths, info)
        trainer.setup()
        code = trainer.run()
    except GrpoError as e:
        code = e.exit_code
        _record_failure(trainer, code, str(e), paths)
        sys.stderr.write(f"grpo_hpc.train: error: {e}\n")
    except Exception as e:  # noqa: BLE001 - a crash is recorded, then reported with its traceback
        code = ExitCode.CRASH
        _record_failure(trainer, code, f"{type(e).__name__}: {e}", paths)
        traceback.print_exc()
    # The outcome is recorded: a late Slurm signal during interpreter shutdown (when
    # Python restores default handlers) must not turn it into a crash.
    for sig in (signal.SIGUSR1, signal.SIGUSR2):
        signal.signal(sig, signal.SIG_IGN)
    if code == ExitCode.OK:
        dist.shutdown()  # on failure peers may be gone; exiting is what unblocks them
    return int(code)


def _record_failure(trainer: object, code: int, reason: str, paths: RunPaths) -> None:
    if trainer is not None:
        trainer.tracker.update(TrainState.FAILED, exit_code=int(code), reason=reason)
    elif os.environ.get("RANK", "0") == "0":  # failed before the trainer existed
        rec = ProgressRecord(
            run=paths.name, state=TrainState.FAILED, exit_code=int(code), reason=reason
        )
        write_progress(paths.progress, rec)


if __name__ == "__main__":
    sys.exit(main())
