"""Preloaded first by the trainer fork server (tests/e2e/trainer_fork.py): Python's
automatic collection off while the server imports torch, transformers and the trainer (as
the trainer's entry point does: grpo_hpc.train.supervision.gc_schedule.imports_frozen);
tests/e2e/freeze_preloaded.py, preloaded last, freezes what they made and turns it on."""

import gc

gc.disable()
