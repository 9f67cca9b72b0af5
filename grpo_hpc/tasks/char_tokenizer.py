"""The character-level tokenizer of the built-in ``tiny`` model and of ``random:<dir>``
models: here, below both the trainer and grpo-submit, so that the login node measures a
run's prompts with the very tokenizer the job will use (grpo_hpc.submit.preflight).
Imports tokenizers/transformers only when called: importing this module loads no torch."""

from __future__ import annotations

import string
from typing import Any

CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
SPECIALS = ["<pad>", "<eos>", "<|system|>", "<|user|>", "<|assistant|>"]


def char_tokenizer(vocab_size: int | None = None) -> Any:
    """A character-level tokenizer with a chat template, padded with filler tokens up to
    ``vocab_size``. Every printable character has its own id: an unknown character mapped
    to the pad token (a zero embedding row) at position 0 gives NaN attention gradients."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = SPECIALS + ["<unk>"] + [c for c in string.printable if c not in "\x0b\x0c\r"]
    words += [f"<t{i}>" for i in range((vocab_size or 0) - len(words))]
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    tok.decoder = decoders.Fuse()
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        pad_token="<pad>",
        eos_token="<eos>",
        unk_token="<unk>",
        additional_special_tokens=SPECIALS[2:],
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast
