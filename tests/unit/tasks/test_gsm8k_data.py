"""The GSM8K shipped in the package: real rows, their gold answers, the config default."""

from __future__ import annotations

import hashlib
import json

from grpo_hpc.config.load import build_config
from grpo_hpc.tasks.problems import GSM8K_DIR, load_problems, load_splits
from grpo_hpc.train.rewards.functions import gold_value, score_correctness_batch

# The checksums the dataset's README states (original release, unchanged).
SHA256 = {
    "train.jsonl": "17f347dc51477c50d4efb83959dbb7c56297aba886e5544ee2aaed3024813465",
    "test.jsonl": "3730d312f6e3440559ace48831e51066acaca737f6eabec99bccb9e4b3c39d14",
}


def test_packaged_files_are_the_original_release() -> None:
    for name, digest in SHA256.items():
        assert hashlib.sha256((GSM8K_DIR / name).read_bytes()).hexdigest() == digest
    assert "MIT" in (GSM8K_DIR / "LICENSE").read_text()


def test_gsm8k_config_trains_on_train_and_holds_out_test() -> None:
    cfg = build_config("gsm8k", ["data.num_eval=1319"])
    assert cfg.data.source == "gsm8k"
    train, held_out = load_problems(cfg.data, seed=0)
    # the last 200 of the 7,473 train rows validate (keep-best), never trained on
    assert (len(train), len(held_out)) == (7273, 1319)
    validation = load_splits(cfg.data, seed=0).validation
    rows = (GSM8K_DIR / "train.jsonl").read_text().splitlines()
    assert validation[0]["question"] == json.loads(rows[-200])["question"]
    assert not {p["question"] for p in validation} & {p["question"] for p in train + held_out}
    # nothing evaluates (training.eval_every=0): no validation, every train row trains
    quiet = load_splits(cfg.data, seed=0, evaluates=False)
    assert (len(quiet.train), quiet.validation, quiet.test) == (7473, [], held_out)
    assert quiet.train[-1]["question"] == json.loads(rows[-1])["question"]
    # The first test problem, its gold from '#### 18'.
    first = json.loads((GSM8K_DIR / "test.jsonl").read_text().splitlines()[0])
    assert held_out[0] == {"question": first["question"], "gold": "18"}
    assert not {p["question"] for p in held_out} & {p["question"] for p in train}


def test_every_gold_is_one_number_and_the_reference_solution_scores_one() -> None:
    cfg = build_config("gsm8k", ["data.num_eval=1319", "data.num_train=0"])
    train, held_out = load_problems(cfg.data, seed=0)
    problems = train + held_out
    assert all(gold_value(p["gold"]) is not None for p in problems)
    # Thousands separators are stripped from the gold ('#### 1,000' -> '1000').
    rows = [json.loads(x) for x in (GSM8K_DIR / "train.jsonl").read_text().splitlines()]
    comma = next(r for r in rows if "," in r["answer"].rsplit("####", 1)[1])
    assert "," not in next(p["gold"] for p in train if p["question"] == comma["question"])
    # The dataset's own worked solutions end in '#### N': the reward judges them right,
    # and judges them wrong against another problem's gold.
    sample = held_out[:200]
    lines = (GSM8K_DIR / "test.jsonl").read_text().splitlines()
    solutions = [json.loads(x)["answer"] for x in lines]
    right = score_correctness_batch(solutions[:200], [p["gold"] for p in sample])
    assert sum(right) == 200
    shifted = [p["gold"] for p in sample[1:] + sample[:1]]
    wrong = score_correctness_batch(solutions[:200], shifted)
    assert sum(wrong) < 10
