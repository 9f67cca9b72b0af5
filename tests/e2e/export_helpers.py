"""What the export tests share: the trainer's own model at a checkpoint, and log-probs of a
fixed batch."""

from __future__ import annotations

from pathlib import Path

import torch

from grpo_hpc.config.load import load_resolved
from grpo_hpc.core.paths import RunPaths
from grpo_hpc.train.algo.loss import selective_log_softmax
from grpo_hpc.train.setup import models
from grpo_hpc.train.state import checkpoint

TEXTS = ["Ada has 3 apples. How many?", "Answer: 42", "12 + 7 = 19, so the answer is 19."]


def trainer_model(paths: RunPaths, step: int) -> torch.nn.Module:
    """The policy as the trainer holds it after resuming from ``step`` (full fine-tuning):
    the run's model built the trainer's way, with the checkpoint's weights loaded (DCP
    shards gathered by checkpoint.model_weights)."""
    cfg = load_resolved(paths.config)
    model_dir = models.materialize(cfg.model, paths.root, cfg.training.seed)
    model, _ = models.load_model_and_tokenizer(model_dir, "sdpa", torch.device("cpu"))
    model.load_state_dict(checkpoint.model_weights(paths.checkpoint(step)))
    return model.eval()


def batch(tok_dir: Path) -> dict[str, torch.Tensor]:
    """A fixed, right-padded batch tokenized by the export's own tokenizer."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tok_dir)
    return tok(TEXTS, return_tensors="pt", padding=True, add_special_tokens=False)


@torch.no_grad()
def logprobs(model: torch.nn.Module, enc: dict[str, torch.Tensor]) -> torch.Tensor:
    """Log-prob of every next token of the batch (masked positions zeroed)."""
    ids, mask = enc["input_ids"], enc["attention_mask"]
    logits = model(input_ids=ids, attention_mask=mask).logits[:, :-1].float()
    lp = selective_log_softmax(logits, ids[:, 1:])
    return lp * mask[:, 1:]


def load_export(out: Path) -> torch.nn.Module:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(out, attn_implementation="sdpa")
    return model.eval()
