"""Reward functions for GRPO: math correctness, answer format, code execution, custom rewards.

Correctness: :mod:`answers` finds the final answer and settles most items exactly (missing
answer, hedged answers, exact numeric matches); the rest go to math-verify in the worker
process of :mod:`verifier`, under a per-item deadline. ``bench/speed/answer_throughput.py``
measured (2 shared CPU cores, ~900-character completions) 4,000-6,000 items/s for items
the pre-judge settles and ~800 items/s for items math-verify decides: a 512-completion
step costs well under a second of scoring.
"""

from __future__ import annotations

import importlib
import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from grpo_hpc.config.schema import RewardConfig
from grpo_hpc.core.errors import ConfigError
from grpo_hpc.tasks.answers import (  # noqa: F401  (extract_*: part of this module's API)
    ANSWER_INSTRUCTION,
    MARKER,
    NUM,
    extract_answer,
    extract_gold,
    gold_value,
    prejudge,
)
from grpo_hpc.train.rewards import verifier
from grpo_hpc.train.rewards.code import (  # noqa: F401  (code_*: part of this module's API)
    CODE_MEMORY_MB,
    CODE_TIMEOUT_S,
    CodeJob,
    announce_sandbox,
    code_reward,
    code_scores,
    code_workers,
    extract_code,
)
from grpo_hpc.train.rewards.verifier import VERIFIER

if TYPE_CHECKING:
    from grpo_hpc.config.schema import RewardConfig

BUILTIN_REWARDS = ("correctness", "format", "code", "overlong")

_FORMAT_RE = re.compile(rf"Answer:[ \t]*[-+]?(?:{NUM})(?:/\d+)?")


Job = tuple[str, str, bool]
"""What math-verify is asked: (answer, gold, gold is symbolic)."""
Verdicts = dict[Job, tuple[float, bool]]
"""math-verify's (score, timed out or crashed) per job, judged ahead (while generating)."""


def correctness_job(
    completion: str, gold: str, require_marker: bool = True
) -> tuple[float | None, Job]:
    """The pre-judge's score of one completion (None: undecided) and the math-verify job
    that decides it otherwise (pure). The one place a completion becomes a job: the
    scoring after generation and the one during it (:mod:`streaming`) agree by it."""
    gold = extract_gold(gold or "")
    answer = extract_answer(completion, not require_marker)
    return prejudge(answer, gold), (answer, gold, gold_value(gold) is None)


def score_correctness(
    completions: Sequence[str],
    golds: Sequence[str],
    timeout_s: float,
    require_marker: bool = True,
    verdicts: Verdicts | None = None,
) -> tuple[list[float], int]:
    """Correctness of each completion (1.0/0.0) and how many distinct answers math-verify
    timed out on.

    The one judge of answers: the training reward and held-out evaluation both call it, so
    that a held-out figure means what the reward means. ``require_marker=False`` judges a
    completion without an answer convention by its last number. Each distinct (answer,
    gold) goes to math-verify once: a group's samples often repeat an answer line, and a
    pathological one repeated would otherwise cost its full deadline once per copy. Jobs
    in ``verdicts`` (judged while the rollout was still decoding) are not judged again.
    """
    known = verdicts or {}
    judged = [
        correctness_job(c, g, require_marker) for c, g in zip(completions, golds, strict=True)
    ]
    todo = list(dict.fromkeys(job for s, job in judged if s is None and job not in known))
    verdict = dict(zip(todo, VERIFIER.judge_each(todo, timeout_s), strict=True))
    scores = [s if s is not None else (verdict.get(job) or known[job])[0] for s, job in judged]
    used = {job for s, job in judged if s is None}
    failures = sum((verdict.get(job) or known[job])[1] for job in used)
    return [float(s) for s in scores], failures


def score_correctness_batch(
    completions: Sequence[str], golds: Sequence[str], timeout_s: float = 2.0
) -> list[float]:
    """:func:`correctness_reward` for a batch; each item that needs math-verify gets
    ``timeout_s`` seconds (wall), after which it scores 0."""
    return score_correctness(completions, golds, timeout_s)[0]


def correctness_reward(completion: str, gold: str, timeout_s: float = 2.0) -> float:
    """1.0 if the ``Answer:`` line equals ``gold`` (plain or GSM8K ``#### x`` text), else 0.0.

    Equality is math-verify's (``\\boxed{3/4}`` = ``0.75``, ``$1,000.00`` = ``1000``).
    No ``Answer:`` marker scores 0 (a lucky last number is not rewarded). For a numeric
    gold the answer line must contain exactly one distinct number ("3 or 4" scores 0) and
    no powers or factorials. Pathological input scores 0 within ``timeout_s``.
    """
    return score_correctness_batch([completion], [gold], timeout_s)[0]


def format_reward(completion: str) -> float:
    """1.0 iff ``Answer:`` occurs exactly once, on the last non-empty line, followed only by
    one number (sign, thousands commas, decimals, ``a/b`` allowed); else 0.0.

    Repeated markers ("Answer: Answer: 5", two Answer lines) and trailing text score 0.
    """
    if completion.count(MARKER) != 1:
        return 0.0
    last = completion.rstrip().rsplit("\n", 1)[-1].strip()
    return 1.0 if _FORMAT_RE.fullmatch(last) else 0.0


def overlong_reward(length: int, finished: bool, cap: int, buffer: int) -> float:
    """DAPO's overlong reward shaping, in [-1, 0]: -1 for a completion cut off at the length
    cap (it never reached EOS, so it has no final answer of its own), a linear penalty for
    one that ended inside the last ``buffer`` tokens before the cap, 0 otherwise.

    Without it a policy can drift into rambling to the cap (repeating a sentence whose last
    number happens to score) and lose the answer line; the penalty makes ending pay.
    """
    if not finished:
        return -1.0
    start = cap - buffer
    if buffer <= 0 or length <= start:
        return 0.0
    return -min(1.0, (length - start) / buffer)


@dataclass(frozen=True)
class Lengths:
    """Token lengths of a batch's completions, for the ``overlong`` reward."""

    tokens: Sequence[int]
    """Completion tokens of each row (EOS included)."""
    finished: Sequence[bool]
    """True where the row ended with EOS, False where the length cap cut it off."""
    cap: int
    """rollout.max_new_tokens."""
    buffer: int = 0
    """reward.overlong_buffer: tokens before the cap where the soft penalty ramps up."""


def load_custom_reward(spec: str) -> Callable[[str, dict], float]:
    """Import ``module:function`` (fn(completion, sample) -> float); ConfigError if unusable."""
    module_name, sep, attr = spec.partition(":")
    if not (sep and module_name and attr):
        raise ConfigError(f"custom reward {spec!r}: expected 'module:function', e.g. 'my.mod:fn'")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as e:
        if e.name and (module_name + ".").startswith(e.name + "."):
            raise ConfigError(
                f"custom reward {spec!r}: module {module_name!r} not found; install it or add "
                "its directory to PYTHONPATH"
            ) from e
        raise ConfigError(f"custom reward {spec!r}: importing {module_name!r} failed: {e}") from e
    except Exception as e:
        msg = " ".join(f"{type(e).__name__}: {e}".split())
        raise ConfigError(f"custom reward {spec!r}: importing {module_name!r} failed: {msg}") from e
    obj: Any = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise ConfigError(
                f"custom reward {spec!r}: {module_name!r} has no attribute {attr!r}; "
                "check the function name after ':'"
            )
        obj = getattr(obj, part)
    if not callable(obj):
        raise ConfigError(
            f"custom reward {spec!r}: {attr!r} is a {type(obj).__name__}, not callable; point "
            "it at a function fn(completion, sample) -> float"
        )
    return obj


@dataclass
class RewardBatch:
    """Rewards of one batch. ``components`` holds one list per computed reward (name ->
    per-completion scores, unweighted); ``total`` is their weighted sum; ``errors`` counts
    items that scored 0 because the reward itself failed (a custom reward raised or returned
    a non-number; math-verify overran its time limit, under ``correctness``), and
    ``error_examples`` keeps the first message per reward for the logs."""

    components: dict[str, list[float]]
    total: list[float]
    errors: dict[str, int] = field(default_factory=dict)
    error_examples: dict[str, str] = field(default_factory=dict)


def _weights_for(weights: dict[str, float], custom: dict[str, Callable]) -> dict[str, float]:
    """Effective weights; custom rewards missing from ``weights`` weigh 1.0."""
    clash = sorted(set(custom) & set(BUILTIN_REWARDS))
    if clash:
        raise ConfigError(f"custom rewards {clash} clash with built-in reward names; rename them")
    unknown = sorted(set(weights) - set(BUILTIN_REWARDS) - set(custom))
    if unknown:
        raise ConfigError(
            f"reward weights {unknown} name no reward; use {list(BUILTIN_REWARDS)} or the "
            "name of a custom reward"
        )
    out: dict[str, float] = {}
    for name in (*BUILTIN_REWARDS, *custom):
        try:
            out[name] = float(weights.get(name, 0.0 if name in BUILTIN_REWARDS else 1.0))
        except (TypeError, ValueError):
            out[name] = math.nan
    bad = sorted(name for name, w in out.items() if not math.isfinite(w))
    if bad:
        raise ConfigError(f"reward weights {bad} are not finite numbers; fix reward.* weights")
    return out


def _run_custom(
    fn: Callable, completions: Sequence[str], samples: Sequence[dict]
) -> tuple[list[float], int, str]:
    """Scores of a custom reward; an item whose call fails scores 0 and is counted."""
    scores, errors, first = [], 0, ""
    for completion, sample in zip(completions, samples, strict=True):
        try:
            value = float(fn(completion, sample))
            if not math.isfinite(value):
                raise ValueError(f"returned {value}")
        except Exception as e:  # user code: a bug there must not kill the training step
            value, errors = 0.0, errors + 1
            first = first or " ".join(f"{type(e).__name__}: {e}".split())[:300]
        scores.append(value)
    return scores, errors, first


def prove_workers(weights: RewardConfig) -> None:
    """At startup: every reward process this run uses must score a trivial right answer 1
    and a wrong one 0, or the run stops here with one line (a reward that cannot run must
    not read as zero reward)."""
    if weights.code:
        announce_sandbox()
    if weights.correctness:
        why = verifier.self_check()
        if why is not None:
            raise ConfigError(f"the math-verify worker does not work on this node: {why}")


@dataclass
class Ahead:
    """Rewards computed while the rollout was still decoding (:mod:`streaming`), each kept
    by exactly what it was computed from: a reward can only go to the text it judged."""

    verdicts: Verdicts = field(default_factory=dict)
    """math-verify's verdicts (:func:`score_correctness`)."""
    code: dict[CodeJob, float] = field(default_factory=dict)
    """Code rewards (:func:`code_scores`)."""


def compute_rewards(
    completions: list[str],
    samples: list[dict],
    weights: dict[str, float],
    custom: dict[str, Callable] | None = None,
    timeout_s: float = 2.0,
    require_marker: bool = True,
    lengths: Lengths | None = None,
    ahead: Ahead | None = None,
) -> RewardBatch:
    """Score a batch. ``samples[i]`` describes ``completions[i]``: ``gold`` (str) and, for
    code tasks, ``tests`` (list of assert lines). ``weights`` maps reward names to weights;
    a weight of 0 skips the reward (no component). ``code`` is computed only when some sample
    has tests (others score 0). ``custom`` maps names to fn(completion, sample) -> float.
    ``timeout_s`` bounds math-verify per item; code runs under :func:`code_reward`'s limits.
    Custom rewards are trusted code run in-process: exceptions are caught, hangs are not.
    ``overlong`` needs ``lengths`` (the batch's token counts); without them it is skipped.
    ``ahead``: what was already computed while the rollout decoded.
    """
    if len(completions) != len(samples):
        raise ValueError(f"{len(completions)} completions but {len(samples)} samples")
    custom = dict(custom or {})
    w = _weights_for(weights, custom)
    comps: dict[str, list[float]] = {}
    errors: dict[str, int] = {}
    examples: dict[str, str] = {}
    if w["correctness"]:
        golds = [str(s.get("gold") or "") for s in samples]
        comps["correctness"], errors["correctness"] = score_correctness(
            completions, golds, timeout_s, require_marker, ahead.verdicts if ahead else None
        )
    if w["format"]:
        comps["format"] = [format_reward(c) for c in completions]
    if w["overlong"] and lengths is not None:
        comps["overlong"] = [
            overlong_reward(n, f, lengths.cap, lengths.buffer)
            for n, f in zip(lengths.tokens, lengths.finished, strict=True)
        ]
    if w["code"] and any(s.get("tests") for s in samples):
        comps["code"] = code_scores(completions, samples, known=ahead.code if ahead else None)
    for name, fn in custom.items():
        if w[name]:
            comps[name], errors[name], first = _run_custom(fn, completions, samples)
            if first:
                examples[name] = first
    total = [
        sum(w[name] * scores[i] for name, scores in comps.items()) for i in range(len(samples))
    ]
    return RewardBatch(comps, total, errors, examples)


FULL_MARK_TOL = 1e-6
"""How close to a term's best a score must be to count as earned in full."""


TASK_TERMS = ("correctness", "code")
"""The reward terms that judge the task itself (a right answer, passing tests)."""


def full_marks(components: dict[str, list[float]], rc: RewardConfig) -> list[bool]:
    """Per completion, whether it is right (pure): every task term scored (``correctness``,
    ``code``) at its best, 1.0; where no task term is scored (custom rewards alone), every
    weighted term at its best (1.0 for a positive weight, the ``overlong`` penalty and a
    negative weight's term at 0). A group of right completions whose rewards are also flat
    is solved: its advantages are zero because every answer is right, not because none is
    (the format term may still be unearned in every one of them: nothing in the group
    tells a better completion from a worse one). No terms: nothing was earned."""
    if not components:
        return []
    weights = {"correctness": rc.correctness, "format": rc.format, "code": rc.code,
               "overlong": rc.overlong, **rc.custom}  # fmt: skip
    task = {k: v for k, v in components.items() if k in TASK_TERMS}
    n = len(next(iter(components.values())))
    out = [True] * n
    for name, values in (task or components).items():
        best = 1.0 if weights.get(name, 1.0) > 0 and name != "overlong" else 0.0
        for i, v in enumerate(values):
            out[i] = out[i] and v >= best - FULL_MARK_TOL
    return out


def run_rewards(
    completions: list[str],
    samples: list[dict],
    rc: RewardConfig,
    custom: dict[str, Callable] | None = None,
    lengths: Lengths | None = None,
    ahead: Ahead | None = None,
) -> RewardBatch:
    """:func:`compute_rewards` with a run's ``reward`` settings: the trainer's scoring."""
    weights = {
        "correctness": rc.correctness,
        "format": rc.format,
        "code": rc.code,
        "overlong": rc.overlong,
        **rc.custom,
    }
    return compute_rewards(
        completions,
        samples,
        weights,
        custom,
        timeout_s=rc.timeout_s,
        require_marker=rc.require_marker,
        lengths=lengths,
        ahead=ahead,
    )
