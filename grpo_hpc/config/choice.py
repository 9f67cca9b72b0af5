"""A config key that takes one of a few words: its allowed values are written beside the
key in :mod:`grpo_hpc.config.schema` (``dtype: str = one_of("auto", ("auto", ...))``), kept in
the field's metadata, and read from there by the check (:func:`choices`,
``config.validate``) and by anyone else who must know them."""

from __future__ import annotations

import dataclasses
from typing import Any

KEY = "choices"
"""The field metadata key holding the allowed values."""


def one_of(default: str, allowed: tuple[str, ...]) -> Any:
    """A dataclass field that defaults to ``default`` and takes only ``allowed``."""
    if default not in allowed:
        raise ValueError(f"default {default!r} is not one of {allowed}")
    return dataclasses.field(default=default, metadata={KEY: allowed})


def choices(root: type) -> dict[str, tuple[str, ...]]:
    """``section.key`` -> allowed values of every key of a config tree with a fixed set
    (``root``: a dataclass whose fields are its sections)."""
    found = {}
    for section in dataclasses.fields(root):
        kind = section.default_factory  # the section's dataclass
        if not dataclasses.is_dataclass(kind):
            continue
        for f in dataclasses.fields(kind):
            if KEY in f.metadata:
                found[f"{section.name}.{f.name}"] = f.metadata[KEY]
    return found
