"""Code problems: HumanEval and MBPP rows load into one problem format, a wrong-shaped file
is refused at submission in one line, and held-out pass@k is judged in the sandbox."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from grpo_hpc.config.load import build_config
from grpo_hpc.config.schema import DataConfig, RewardConfig
from grpo_hpc.core.errors import ConfigError
from grpo_hpc.status.plot import CODE_HELD_OUT_TITLE, CODE_REWARD, build_figure, panel, plot_data
from grpo_hpc.status.view import held_out_figure
from grpo_hpc.submit.preflight import check_data, check_model
from grpo_hpc.tasks import code as code_data
from grpo_hpc.tasks import problems as data
from grpo_hpc.train.evaluation import scoring
from grpo_hpc.train.rewards import functions as rewards

# MBPP-shaped rows written for these tests (text, test_list, optional test_setup_code).
MBPP_ROWS = [
    {
        "task_id": 1,
        "text": "Write a function to return the sum of the squares of a list of integers.",
        "code": "def square_sum(xs):\n    return sum(x * x for x in xs)",
        "test_list": [
            "assert square_sum([1, 2, 3]) == 14",
            "assert square_sum([]) == 0",
            "assert square_sum([-2]) == 4",
        ],
        "test_setup_code": "",
        "challenge_test_list": [],
    },
    {
        "task_id": 2,
        "text": "Write a function that returns the area of a Box (given in the setup) as an int.",
        "code": "def box_area(b):\n    return b.w * b.h",
        "test_list": ["assert box_area(Box(2, 3)) == 6", "assert box_area(Box(0, 9)) == 0"],
        "test_setup_code": (
            "class Box:\n    def __init__(self, w, h):\n        self.w, self.h = w, h"
        ),
    },
]


def _jsonl(path: Path, rows: list) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def _fenced(code: str) -> str:
    return f"Here is my solution:\n```python\n{code}\n```\n"


def test_humaneval_loads_with_a_fixed_held_out_split() -> None:
    splits = data.load_splits(DataConfig(source="humaneval", num_train=0, num_eval=100), 0)
    train, held = splits.train, splits.test
    # 123 training problems: the last data.num_val (32) validate, never trained on
    assert (len(train), len(splits.validation), len(held)) == (91, 32, 41)
    assert {p["task_id"] for p in train}.isdisjoint(p["task_id"] for p in splits.validation)
    assert {p["task_id"] for p in train}.isdisjoint(p["task_id"] for p in held)
    assert [p["task_id"] for p in held[:3]] == ["HumanEval/0", "HumanEval/4", "HumanEval/8"]
    first = held[0]
    assert first["entry_point"] == "has_close_elements" and first["gold"] == ""
    assert first["tests"][-1] == "check(has_close_elements)"
    assert "def check(candidate)" in first["tests"][0]
    assert first["setup"].startswith("from typing import List")
    assert "```python" in first["question"] and "has_close_elements" in first["question"]
    # the same split whatever the seed; num_train/num_eval only cap it
    again = data.load_problems(DataConfig(source="humaneval", num_train=5, num_eval=2), 7)
    assert again == (train[:5], held[:2])
    # nothing evaluates (training.eval_every=0): all 123 train, none validates
    quiet = data.load_splits(DataConfig(source="humaneval", num_eval=100), 0, evaluates=False)
    assert (len(quiet.train), len(quiet.validation), quiet.test) == (123, 0, held)
    assert quiet.train[:91] == train


def test_mbpp_rows_load_from_a_file(tmp_path: Path) -> None:
    path = _jsonl(tmp_path / "mbpp.jsonl", MBPP_ROWS)
    train, held = data.load_problems(DataConfig(source=str(path), num_train=0, num_eval=1), 0)
    assert len(train) == len(held) == 1
    (p,) = held
    assert p["task_id"] == "mbpp/1" and p["entry_point"] == "square_sum" and p["gold"] == ""
    assert p["tests"] == MBPP_ROWS[0]["test_list"] and p["setup"] == ""
    assert MBPP_ROWS[0]["text"] in p["question"]
    assert "assert square_sum([1, 2, 3]) == 14" in p["question"]  # MBPP shows its tests
    assert train[0]["setup"].startswith("class Box")


def test_mbpp_setup_code_runs_before_the_solution() -> None:
    problems = [code_data.mbpp_problem(r, "row") for r in MBPP_ROWS]
    right = [_fenced(r["code"]) for r in MBPP_ROWS]
    wrong = [_fenced("def square_sum(xs):\n    return sum(xs)"), _fenced("def box_area(b): 0")]
    assert rewards.code_scores(right + wrong, problems + problems) == [1.0, 1.0, 0.0, 0.0]


def test_humaneval_rows_in_a_file_load_like_the_package(tmp_path: Path) -> None:
    rows = code_data.humaneval_rows()[:4]
    path = _jsonl(tmp_path / "he.jsonl", rows)
    problems, _ = data.load_problems(DataConfig(source=str(path), num_eval=0, num_val=0), 0)
    assert problems == [code_data.humaneval_problem(r, "") for r in rows]


@pytest.mark.parametrize(
    ("row", "field"),
    [
        ({"text": "Write a function.", "tests": ["assert f() == 1"]}, "'test_list'"),
        ({"test_list": ["assert f() == 1"]}, "'text'"),
        ({"prompt": "def f():\n", "entry_point": "f", "task_id": "x/1"}, "'test'"),
        ({"question": "What is 2+2?"}, "'answer'"),
    ],
)
def test_a_wrong_shaped_file_is_refused_at_submission_in_one_line(
    tmp_path: Path, row: dict, field: str
) -> None:
    path = _jsonl(tmp_path / "bad.jsonl", [row])
    problems = check_data(DataConfig(source=str(path)), is_offline=True)
    assert len(problems) == 1 and "\n" not in problems[0], problems
    assert field in problems[0] and "bad.jsonl:1" in problems[0]
    with pytest.raises(ConfigError, match=field):  # and the trainer refuses it the same way
        data.load_problems(DataConfig(source=str(path)), 0)


def test_mbpp_test_list_must_be_assert_lines(tmp_path: Path) -> None:
    path = _jsonl(tmp_path / "bad.jsonl", [{"text": "t", "test_list": "assert f() == 1"}])
    (problem,) = check_data(DataConfig(source=str(path)), is_offline=False)
    assert "'test_list' must be a non-empty list of assert lines" in problem


def test_humaneval_source_passes_preflight_when_installed() -> None:
    assert check_data(DataConfig(source="humaneval"), is_offline=True) == []


def test_code_configs_load_and_ask_for_code() -> None:
    for name in ("code", "code-qwen"):
        cfg = build_config(name)
        assert cfg.data.source == "humaneval" and cfg.reward.code == 1.0
        assert cfg.reward.correctness == 0.0 and "```python" in cfg.data.system_prompt
    # `--config code` is the offline run (`--profile local`, a CPU): nothing to download
    code = build_config("code")
    assert code.model.name_or_path == "smollm2-135m"
    assert check_model(code.model, is_offline=True) == []
    assert check_data(code.data, is_offline=True) == []
    assert build_config("code-qwen").model.name_or_path == "Qwen/Qwen2.5-0.5B-Instruct"
    train, _ = data.load_problems(DataConfig(source="humaneval", num_eval=1), 0)
    assert data.default_instruction(train) == code_data.CODE_INSTRUCTION
    assert data.default_instruction([{"question": "q", "gold": "1"}]) == rewards.ANSWER_INSTRUCTION


def test_pass_at_k_is_the_unbiased_estimator() -> None:
    assert scoring.pass_at_k(10, 0, 1) == 0.0
    assert scoring.pass_at_k(10, 3, 1) == pytest.approx(0.3)
    assert scoring.pass_at_k(10, 3, 10) == 1.0
    # 1 - C(7,5)/C(10,5) = 1 - 21/252
    assert scoring.pass_at_k(10, 3, 5) == pytest.approx(1 - 21 / 252)
    assert scoring.pass_at_k(4, 1, 2) == pytest.approx(0.5)
    with pytest.raises(ValueError):
        scoring.pass_at_k(4, 1, 5)
    assert scoring.reported_ks(1) == [1]
    assert scoring.reported_ks(10) == [1, 5, 10] and scoring.reported_ks(8) == [1, 5, 8]
    sums = scoring.pass_at_k_sums([[1, 0, 0, 0], [0, 0, 0, 0], [1, 1, 1, 1]], [1, 2])
    assert sums[1] == pytest.approx(0.25 + 0 + 1) and sums[2] == pytest.approx(0.5 + 0 + 1)


def test_judge_problems_runs_code_in_the_sandbox_and_answers_by_the_reward() -> None:
    code = code_data.mbpp_problem(MBPP_ROWS[0], "row")
    math = {"question": "2+2?", "gold": "4"}
    texts = [_fenced(MBPP_ROWS[0]["code"]), "Answer: 4", _fenced("def square_sum(xs): 0"), "5"]
    problems = [code, math, code, math]
    assert scoring.judge_problems(texts, problems, RewardConfig()) == [1.0, 1.0, 0.0, 0.0]
    # a code problem's reward and its held-out judgement agree
    rc = RewardConfig(correctness=0.0, format=0.0, code=1.0)
    reward = rewards.run_rewards(texts[::2], [code, code], rc).components["code"]
    assert reward == scoring.judge_problems(texts[::2], [code, code], rc)


def test_status_and_plot_show_pass_at_1() -> None:
    metrics = [
        {"time": 1.0, "step": 0, "eval/pass@1": 0.0, "eval/pass@4": 0.1},
        {"time": 2.0, "step": 1, "reward/mean": 0.25, "reward/code": 0.25},
        {"time": 3.0, "step": 2, "eval/pass@1": 0.125, "eval/pass@4": 0.3},
        {"time": 4.0, "step": 3, "reward/mean": 0.5},
    ]
    assert held_out_figure(metrics) == ("eval/pass@1", 0.125)
    assert held_out_figure([{"step": 1, "eval/accuracy": 0.5}]) == ("eval/accuracy", 0.5)
    assert held_out_figure(metrics[1:2]) is None
    pd = plot_data(metrics, [])
    assert panel(pd, "eval/accuracy", "t") == ("eval/pass@1", CODE_HELD_OUT_TITLE, "eval/pass@4")
    assert pd.series["eval/pass@1"] == [(0, 0.0), (2, 0.125)]
    assert panel(pd, "reward/correctness", "c") == ("reward/code", CODE_REWARD[1], "")
    math_run = plot_data([{"time": 1.0, "step": 1, "eval/accuracy": 0.5}], [])
    assert panel(math_run, "eval/accuracy", "t") == ("eval/accuracy", "t", "eval/accuracy_strict")

    fig = build_figure(pd, "code-run")
    try:  # the run's name heads the figure; the code panels replace the math ones
        assert fig._suptitle.get_text() == "code-run"
        titles = [ax.get_title() for ax in fig.get_axes()]
        assert CODE_HELD_OUT_TITLE in titles and CODE_REWARD[1] in titles
    finally:
        import matplotlib.pyplot as plt

        plt.close(fig)


def test_mbpp_sanitized_rows_name_the_text_prompt_and_bring_test_imports() -> None:
    row = {
        "task_id": 3,
        "prompt": "Write a function that returns the square root of x rounded to 2 places.",
        "test_imports": ["import math"],
        "test_list": ["assert root2(2) == round(math.sqrt(2), 2)"],
    }
    p = code_data.mbpp_problem(row, "row")
    assert p["setup"] == "import math" and row["prompt"] in p["question"]
    ok = _fenced("def root2(x):\n    return round(x ** 0.5, 2)")
    assert rewards.code_scores([ok], [p]) == [1.0]
