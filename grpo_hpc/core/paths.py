"""RunPaths: the one place that knows every file name of a run directory.

Layout of ``logs/<run>/``::

    config.yaml            resolved config, written once at submission, read by every attempt
    profile.yaml           resolved cluster profile used for the run
    <template>.sh.j2       the profile's setup template, kept for resubmissions
    jobs.jsonl             job history: one line per submission (job id, attempt, time, reason)
    progress.json          trainer's progress record (see grpo_hpc.core.progress)
    metrics.jsonl          one line per training step
    samples.jsonl          a few completions of each step, as written and scored
    events.jsonl           monitor decisions and actions, the trainer's collapse and solved
                           records (grpo_hpc.core.events: their one writer and reader)
    best.json              the best evaluation so far: step, metric, score, checkpoint (core.best)
    eval_samples/step_N.jsonl  each evaluation's held-out completions, scored
    training_output.log    combined stdout/stderr of the torchrun processes
    job_summary.txt        human summary written when an attempt ends
    monitor.lock           per-run lock held by a monitor pass (and by a resubmission)
    trainer.lock           held by the running trainer's rank 0: one trainer per run directory
    alive/<launch>/        each rank's pulse while it trains (grpo_hpc.train.supervision.liveness)
    nccl_trace/rank_<R>    NCCL's flight recorder, dumped when a collective times out or a
                           peer stops answering
    state_digest/          per-rank state digests at saves and resumes (faults.state_digest)
    torch_profile/         torch.profiler traces and summaries of profiled steps, per rank
                           (training.profile_steps)
    submitit/              submitit's own files (sbatch script, pickles, stdout/stderr)
    checkpoints/step-N/    checkpoints; COMPLETE + a manifest listing the weights make one count
    wandb/                 offline W&B run (one per training run, across attempts)
    wandb_id               its id, so that the next attempt resumes that W&B run
    tiny_model/            the random ``tiny`` model a run built for itself
    final/                 the finished run's model as a Hugging Face directory (export.run):
                           the best evaluation's by default (training.final)
    last/                  beside a best final/: the last step's model
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from grpo_hpc.core.errors import ConfigError
from grpo_hpc.core.manifest import COMPLETE_MARKER, is_complete  # noqa: F401 - re-exported

RUN_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")
CKPT_RE = re.compile(r"^step-(\d+)$")


def default_logs_root() -> Path:
    """Where runs live: ``$GRPO_HPC_LOGS`` or ``./logs``."""
    return Path(os.environ.get("GRPO_HPC_LOGS", "logs")).resolve()


def logs_root(arg: str | Path | None, must_exist: bool = False) -> Path:
    """The runs directory a command was given (``--logs``), else the default; ConfigError
    if it is a file, or (``must_exist``) if it is missing."""
    root = Path(arg).resolve() if arg else default_logs_root()
    if root.exists() and not root.is_dir():
        raise ConfigError(f"--logs {root} is not a directory: point it at your runs directory")
    if must_exist and not root.is_dir():
        raise ConfigError(
            f"no runs: {root} does not exist (submit one with grpo-submit, or point --logs "
            "or $GRPO_HPC_LOGS at your runs directory)"
        )
    return root


def validate_run_name(name: str) -> str:
    """Run names become directory names and Slurm job names: keep them boring."""
    if not RUN_NAME_RE.match(name):
        raise ConfigError(
            f"invalid run name {name!r}: use letters, digits, '.', '_' or '-' "
            "(at most 100 characters, starting with a letter or digit)"
        )
    return name


@dataclass(frozen=True)
class RunPaths:
    """Every path of one run, derived from its directory."""

    root: Path

    @classmethod
    def for_run(cls, name: str, logs_root: Path | None = None) -> RunPaths:
        return cls((logs_root or default_logs_root()) / validate_run_name(name))

    @property
    def name(self) -> str:
        return self.root.name

    @property
    def config(self) -> Path:
        return self.root / "config.yaml"

    @property
    def profile(self) -> Path:
        return self.root / "profile.yaml"

    @property
    def jobs(self) -> Path:
        return self.root / "jobs.jsonl"

    @property
    def progress(self) -> Path:
        return self.root / "progress.json"

    @property
    def metrics(self) -> Path:
        return self.root / "metrics.jsonl"

    @property
    def samples(self) -> Path:
        return self.root / "samples.jsonl"

    @property
    def best(self) -> Path:
        """The best evaluation so far (grpo_hpc.core.best)."""
        return self.root / "best.json"

    @property
    def eval_samples(self) -> Path:
        """Each held-out evaluation's completions, one file per evaluated step."""
        return self.root / "eval_samples"

    def eval_samples_at(self, step: int) -> Path:
        return self.eval_samples / f"step_{step}.jsonl"

    @property
    def events(self) -> Path:
        return self.root / "events.jsonl"

    @property
    def training_log(self) -> Path:
        return self.root / "training_output.log"

    @property
    def torch_profile(self) -> Path:
        return self.root / "torch_profile"

    @property
    def job_summary(self) -> Path:
        return self.root / "job_summary.txt"

    @property
    def monitor_lock(self) -> Path:
        return self.root / "monitor.lock"

    @property
    def trainer_lock(self) -> Path:
        return self.root / "trainer.lock"

    @property
    def nccl_trace(self) -> Path:
        return self.root / "nccl_trace"

    @property
    def state_digest(self) -> Path:
        return self.root / "state_digest"

    @property
    def alive_dir(self) -> Path:
        return self.root / "alive"

    @property
    def submitit_dir(self) -> Path:
        return self.root / "submitit"

    @property
    def checkpoints(self) -> Path:
        return self.root / "checkpoints"

    @property
    def wandb_id(self) -> Path:
        """The W&B run id, kept so that every attempt logs to one W&B run."""
        return self.root / "wandb_id"

    @property
    def tiny_model(self) -> Path:
        """The ``tiny`` model built for this run (model.name_or_path=tiny)."""
        return self.root / "tiny_model"

    @property
    def final(self) -> Path:
        """The finished run's model as a Hugging Face directory: written by the trainer
        after the final checkpoint verifies (training.export_final), or by grpo-export."""
        return self.root / "final"

    @property
    def last(self) -> Path:
        """The last step's model beside a ``final/`` that holds the best one (keep-best)."""
        return self.root / "last"

    def checkpoint(self, step: int) -> Path:
        return self.checkpoints / f"step-{step}"

    def checkpoint_tmp(self, step: int) -> Path:
        return self.checkpoints / f".tmp-step-{step}"

    def checkpoint_steps(self, complete_only: bool = True) -> list[int]:
        """Steps with a checkpoint directory, ascending; by default only complete ones
        (COMPLETE marker and a manifest listing the weights: manifest.is_complete)."""
        try:
            entries = list(self.checkpoints.iterdir())
        except (FileNotFoundError, NotADirectoryError):  # none yet, or deleted under us
            return []
        steps = []
        for p in entries:
            m = CKPT_RE.match(p.name)
            if m and (not complete_only or is_complete(p)):
                steps.append(int(m.group(1)))
        return sorted(steps)

    def latest_checkpoint(self) -> int | None:
        """Newest complete checkpoint step, or None."""
        steps = self.checkpoint_steps()
        return steps[-1] if steps else None
