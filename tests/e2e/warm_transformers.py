"""Preloaded by the trainer fork server (tests/e2e/trainer_fork.py) after the trainer:
what each forked trainer otherwise did again after the fork, once per process, done once
in the server instead (~0.4 s of CPU a run here):

- the modules a trainer imports only when it gets there: its entry module's config
  loading (omegaconf), the final export's writer, the native engine's weight packing,
  the liveness pulse, and transformers' tokenizer classes (its lazy ``AutoTokenizer``);
- transformers' table of every model family's weight renamings, built at a process's
  first ``from_pretrained`` or ``save_pretrained`` (~850 regular expressions compiled).

The entry module itself (``grpo_hpc.train.__main__``) is still imported in each run, so
its early signal handlers are installed there as in production; a trainer started as a
program (torchrun, Slurm) does all of the above itself."""

import contextlib

import transformers.convert_slow_tokenizer  # noqa: F401
import transformers.models.auto.tokenization_auto  # noqa: F401
import transformers.tokenization_utils_tokenizers  # noqa: F401

import grpo_hpc.config.load  # noqa: F401
import grpo_hpc.export.run  # noqa: F401
import grpo_hpc.train.distributed.cpu_binding  # noqa: F401
import grpo_hpc.train.rollout.native.weights  # noqa: F401
import grpo_hpc.train.supervision.liveness  # noqa: F401

# A cache inside transformers (5.x): where a later version moves it, runs build it themselves.
with contextlib.suppress(ImportError):
    from transformers.conversion_mapping import get_checkpoint_conversion_mapping

    get_checkpoint_conversion_mapping("llama")
