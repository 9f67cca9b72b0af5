"""A key's allowed words are written beside it in the schema (``one_of``) and read from
there by the check: each is refused outside them with one line naming them all, and a
schema default outside its own set cannot be written."""

from __future__ import annotations

import dataclasses

import pytest

from grpo_hpc.config import schema
from grpo_hpc.config.choice import KEY, choices, one_of
from grpo_hpc.config.load import build_config
from grpo_hpc.core.errors import ConfigError


def test_each_key_with_choices_refuses_a_word_outside_them() -> None:
    found = choices(schema.Config)
    assert found["training.on_collapse"] == ("flag", "stop", "rollback")
    assert found["training.on_solved"] == ("finish", "flag")
    for dotted, allowed in found.items():
        with pytest.raises(ConfigError) as e:
            build_config("tiny", [f"{dotted}=no_such_word"])
        assert str(e.value) == f"{dotted}='no_such_word' is not one of {', '.join(allowed)}"


def test_choices_are_read_from_the_fields() -> None:
    """The check's table is the schema's metadata, key for key (no second list)."""
    from grpo_hpc.config.validate import CHOICES

    written = {
        f"{section.name}.{f.name}": f.metadata[KEY]
        for section in dataclasses.fields(schema.Config)
        if dataclasses.is_dataclass(section.default_factory)
        for f in dataclasses.fields(section.default_factory)
        if KEY in f.metadata
    }
    assert CHOICES == written and len(written) == 16


def test_a_default_outside_its_choices_is_refused() -> None:
    with pytest.raises(ValueError, match="'x' is not one of"):
        one_of("x", ("a", "b"))
