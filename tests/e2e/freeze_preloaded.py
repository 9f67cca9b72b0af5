"""Preloaded last by the trainer fork server (tests/e2e/trainer_fork.py): what the imports
left alive is collected once and frozen (``gc.freeze``: moved where the collector never
walks it again), so the full collection each forked trainer starts training with
(grpo_hpc.train.supervision.gc_schedule) walks what that trainer made, not the server's
~400k objects of torch, transformers and the trainer: ~0.3 s of CPU each run here, and
the pages of those objects stay shared with the server instead of being copied into
every run when the collector writes their headers. A trainer started as a program
(torchrun, Slurm) still walks everything, as in production; the collections themselves,
their schedule and their timing are the trainer's own either way."""

import gc

gc.collect()
gc.freeze()
gc.enable()  # off since tests/e2e/collector_off.py, preloaded first
