"""torchrun target: ``torchrun ... -m grpo_hpc.train <run_dir>``.

Reads the run's resolved config, joins the process group, trains, and records how
it ended in progress.json (state, exit code, reason) before exiting with that code.
"""

from __future__ import annotations

from grpo_hpc.train import signals

signals.install_early()  # first: Slurm's warning may arrive while torch loads

import os  # noqa: E402
import signal  # noqa: E402
import sys  # noqa: E402
import traceback  # noqa: E402
from pathlib import Path  # noqa: E402

from grpo_hpc.config import load_resolved  # noqa: E402
from grpo_hpc.errors import (  # noqa: E402
    ExitCode,
    GrpoError,
    RunDirBusyError,
    StoppedBeforeTrainingError,
)
from grpo_hpc.paths import RunPaths  # noqa: E402
from grpo_hpc.progress import ProgressRecord, TrainState, write_progress  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        sys.stderr.write("usage: torchrun ... -m grpo_hpc.train <run_dir>\n")
        return ExitCode.CONFIG_ERROR
    paths = RunPaths(Path(argv[0]).resolve())
    trainer = None
    try:
        cfg = load_resolved(paths.config)
        _stop_if_signalled()
        from grpo_hpc.train import dist

        info = dist.init(cfg.dist)
        from grpo_hpc.train.trainer import Trainer

        _stop_if_signalled()
        trainer = Trainer(cfg, paths, info, stop_signal=signals.pending())
        trainer.setup()
        code = trainer.run()
    except StoppedBeforeTrainingError as e:
        code = e.exit_code
        _record_failure(trainer, code, str(e), paths, TrainState.INTERRUPTED)
        sys.stderr.write(f"grpo_hpc.train: {e}\n")
    except GrpoError as e:
        code = e.exit_code
        if not isinstance(e, RunDirBusyError):  # progress.json is the other trainer's
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
        from grpo_hpc.train import dist

        dist.shutdown()  # on failure peers may be gone; exiting is what unblocks them
    return int(code)


def _stop_if_signalled() -> None:
    """Before the trainer exists no step has run in this attempt: exit 5 at once."""
    sig = signals.pending()
    if sig is not None:
        raise StoppedBeforeTrainingError(
            f"stopped on {signal.Signals(sig).name} during start-up, before any step of this "
            "attempt: nothing new to checkpoint; resubmit me"
        )


def _record_failure(
    trainer: object, code: int, reason: str, paths: RunPaths, state: TrainState = TrainState.FAILED
) -> None:
    if trainer is not None:
        trainer.tracker.update(state, exit_code=int(code), reason=reason)
    elif os.environ.get("RANK", "0") == "0":  # failed before the trainer existed
        rec = ProgressRecord(run=paths.name, state=state, exit_code=int(code), reason=reason)
        write_progress(paths.progress, rec)


if __name__ == "__main__":
    sys.exit(main())
