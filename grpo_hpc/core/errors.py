"""Exit codes and the user-facing exception tree.

Every exit code of every grpo_hpc program is defined here, once. The monitor
decides whether to resubmit from these codes (and from the progress file), so
each one names a *class* of outcome, not a particular bug.
"""

from __future__ import annotations

import enum


class ExitCode(enum.IntEnum):
    """Process exit codes shared by the CLIs, the launcher and the trainer."""

    OK = 0
    """Success: the command did what was asked; a training run finished all its steps."""
    CRASH = 1
    """Unexpected failure (an exception nobody anticipated), or a checkpoint with no room on
    disk (DiskFullError, which says how much it needs). Resubmit within the retry budget."""
    CONFIG_ERROR = 2
    """Bad configuration or usage (unknown key, missing file, bad dataset). Never resubmit."""
    CIRCUIT_BREAKER = 3
    """Training tripped a circuit breaker (zero reward for N steps, non-finite loss).
    A checkpoint was saved; resubmitting blindly would repeat the failure."""
    STALLED = 4
    """A phase exceeded its time budget (e.g. generation hung). Resubmit within budget."""
    CHECKPOINTED = 5
    """Preempted / time limit warning: a checkpoint was saved, resubmit me."""
    OUT_OF_MEMORY = 6
    """The GPU ran out of memory (CUDA out-of-memory in the trainer). Resubmitting the same
    settings would fail again: stop, and say the peak and what would fit."""


class GrpoError(Exception):
    """Base of all expected errors: the message says what is wrong and what to do."""

    exit_code: ExitCode = ExitCode.CRASH


class ConfigError(GrpoError):
    """Invalid configuration, profile, path or command-line usage."""

    exit_code = ExitCode.CONFIG_ERROR


class DiskFullError(GrpoError):
    """The run directory's filesystem cannot hold the next checkpoint; nothing was written.
    Exit 1: the monitor resubmits within the retry budget (scratch space is often freed by
    purges or by the user, and the last complete checkpoint is intact), and the reason in
    progress.json says how much room is needed and where."""


class SlurmUnavailableError(GrpoError):
    """sbatch/sacct missing or slurmctld not answering: nothing was submitted."""

    exit_code = ExitCode.CONFIG_ERROR


class RunDirBusyError(ConfigError):
    """Another trainer holds the run directory (train/state/checkpoint.lock_run_dir): this one
    must not touch it, not even progress.json, which is the other trainer's."""


class StalledError(GrpoError):
    """A phase (generation, typically) ran past its time budget."""

    exit_code = ExitCode.STALLED


class StoppedBeforeTrainingError(GrpoError):
    """A stop signal arrived before the attempt's first step: nothing new to checkpoint."""

    exit_code = ExitCode.CHECKPOINTED


class OutOfMemoryError(GrpoError):
    """The trainer ran out of GPU memory; the message gives the peak and what would fit."""

    exit_code = ExitCode.OUT_OF_MEMORY


class CircuitBreakerError(GrpoError):
    """Training must stop: continuing would waste the allocation."""

    exit_code = ExitCode.CIRCUIT_BREAKER
