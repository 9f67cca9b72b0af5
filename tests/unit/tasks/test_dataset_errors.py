"""A user's dataset file that cannot train is refused with one line that says what is wrong
(grpo_hpc.tasks.problems, the loader the trainer calls). The trainer's side (exit 2, the
line in progress.json and on stderr, no traceback) is tested once end to end in
tests/e2e/test_trainer_behaviour.py::test_bad_dataset_is_a_config_error."""

from __future__ import annotations

from pathlib import Path

import pytest

from grpo_hpc.config.schema import DataConfig
from grpo_hpc.core.errors import ConfigError
from grpo_hpc.tasks.problems import load_problems


@pytest.mark.parametrize(
    ("name", "text", "message"),
    [
        ("missing.jsonl", None, "does not exist: check data.source"),
        ("bad.jsonl", '{"question": "q", "answer": "#### 1"}\n{oops\n', "bad.jsonl:2: not valid"),
        ("norows.jsonl", '{"question": "q"}\n', "needs 'question' and 'answer'"),
        ("nogold.jsonl", '{"question": "q", "answer": ""}\n', "no final value after '####'"),
        ("empty.jsonl", "", "has no training problems: it is empty"),
    ],
)
def test_a_dataset_that_cannot_train_is_refused_in_one_line(
    tmp_path: Path, name: str, text: str | None, message: str
) -> None:
    path = tmp_path / name
    if text is not None:
        path.write_text(text)
    with pytest.raises(ConfigError) as err:
        load_problems(DataConfig(source=str(path)), seed=0)
    assert message in str(err.value) and "\n" not in str(err.value)
