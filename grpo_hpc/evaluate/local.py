"""grpo-eval: accuracy of a run's checkpoint, or of any Hugging Face model directory, on a
data set, judged as the run's correctness reward judges.

``grpo-eval MODEL_OR_RUN`` loads a model directory (an export, a run's ``final/``, any HF
directory) or a run's checkpoint (exported in fp32 first into a temporary directory
through :mod:`grpo_hpc.export.run`: the trainer's master weights), generates greedily (or
``--samples k`` sampled completions per problem for pass@k), judges each completion with
:mod:`grpo_hpc.train.evaluation.scoring` under the run's ``reward`` settings (the defaults for a
model that is not ours), writes a JSON result atomically and prints one summary line.

A model of one of our runs (a run, or an export carrying its config) is run the way its
trainer's held-out evaluation runs it (:func:`~grpo_hpc.evaluate.target.numerics_for`,
:func:`evaluate`): fp32 weights under the run's precision (bf16/fp16 autocast and engine
dtype on a GPU), the run's rollout engine, the engine's cache sized for the run's
prompts, its system prompt and generation cap, and greedy batches composed as on the
trainer's ranks; so grpo-eval of
a run, or of its fp32 export, reproduces the trainer's last ``eval/accuracy``. A bf16
export holds rounded weights (norms included) and can differ at a near-tie.

The choice "how is a completion judged for this data source" is :func:`judge_for`.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from grpo_hpc.config.schema import Config, DataConfig, RewardConfig
from grpo_hpc.core.errors import ConfigError
from grpo_hpc.evaluate.target import Target, numerics_for
from grpo_hpc.train.evaluation.scoring import pass_at_k  # the one unbiased estimator (re-exported)

Problem = dict[str, Any]
Judge = Callable[[Sequence[str], Sequence[Problem]], list[float]]
RUN_DATA = "run"
"""``--data run``: the run's own held-out problems (what its eval/accuracy was measured on)."""
DEFAULT_MAX_NEW_TOKENS = 512
DEFAULT_CHUNK = 64


# ----------------------------------------------------------------------------- pure parts


def ks_for(samples: int) -> list[int]:
    """The k of the pass@k figures reported for ``samples`` completions per problem:
    1, 2, 4, ... up to and including ``samples``."""
    ks, k = [], 1
    while k < samples:
        ks.append(k)
        k *= 2
    return ks + [samples]


def summarize(correct: Sequence[Sequence[float]], strict: Sequence[Sequence[float]]) -> dict:
    """Accuracy figures of per-problem judgements (``correct[i]``: one score per sample of
    problem i): greedy accuracy for one sample, pass@k for more."""
    n_problems = len(correct)
    samples = len(correct[0]) if correct else 1
    hits = [int(sum(1 for s in row if s >= 1.0)) for row in correct]
    strict_hits = [int(sum(1 for s in row if s >= 1.0)) for row in strict]
    out: dict[str, Any] = {"problems": n_problems, "samples": samples}
    total = max(n_problems * samples, 1)
    out["accuracy"] = sum(hits) / total
    out["correct"] = sum(hits)
    out["accuracy_strict"] = sum(strict_hits) / total
    if samples > 1:
        out["pass@k"] = {
            str(k): sum(pass_at_k(samples, c, k) for c in hits) / max(n_problems, 1)
            for k in ks_for(samples)
        }
    return out


def data_slug(spec: str) -> str:
    """A file-name-safe form of a ``--data`` value."""
    return re.sub(r"[^A-Za-z0-9._-]+", "_", Path(spec).stem if "/" in spec else spec)


def judge_for(source: str, reward: RewardConfig) -> Judge:
    """How a completion is judged for problems of ``source``: the one place that decides.
    Math (GSM8K, arithmetic, GSM8K-format files): the run's correctness reward; code
    problems (tests, no gold): the code reward's sandbox; both through
    :func:`grpo_hpc.train.evaluation.scoring.judge_problems`, as the trainer's evaluation judges."""
    from grpo_hpc.train.evaluation import scoring

    def run_judge(texts: Sequence[str], problems: Sequence[Problem]) -> list[float]:
        return scoring.judge_problems(texts, problems, reward)

    return run_judge


def load_data(spec: str, cfg: Config | None, num: int | None) -> list[Problem]:
    """The problems ``--data`` names: ``run`` (the run's held-out set), ``gsm8k:test`` /
    ``gsm8k:train`` (the GSM8K in the package), ``arithmetic`` (the generator's held-out
    problems under the run's or the default settings), or a GSM8K-format .jsonl/.parquet."""
    from grpo_hpc.tasks import problems as data

    seed = cfg.training.seed if cfg is not None else 0
    data_cfg = cfg.data if cfg is not None else DataConfig()
    if spec == RUN_DATA:
        if cfg is None:
            raise ConfigError("--data run needs a run (or an export of one): name a data set")
        problems = data.load_problems(data_cfg, seed)[1]
    elif spec in ("gsm8k:test", "gsm8k:train", "gsm8k"):
        split = "train" if spec.endswith("train") else "test"
        problems = data.load_file(data.GSM8K_DIR / f"{split}.jsonl")
    elif spec == "arithmetic":
        arith = replace(data_cfg, source="arithmetic", num_eval=num or data_cfg.num_eval)
        problems = data.load_problems(arith, seed)[1]
    elif spec.endswith((".jsonl", ".json", ".parquet")):
        problems = data.load_file(Path(spec).expanduser())
    else:
        raise ConfigError(
            f"--data {spec!r}: use gsm8k:test, gsm8k:train, arithmetic, run, or a "
            "GSM8K-format .jsonl file"
        )
    problems = problems[:num] if num else problems
    if not problems:
        raise ConfigError(f"--data {spec!r} holds no problems")
    return problems


def _trainer_sets(cfg: Config | None) -> tuple[list[Problem], list[Problem]] | None:
    """The run's (train, held-out) problems, as its trainer loaded them; None when they
    cannot be read here (a data set of the cluster's disk, an offline hub source)."""
    if cfg is None:
        return None
    from grpo_hpc.tasks import problems as data

    try:
        return data.load_problems(cfg.data, cfg.training.seed)
    except Exception:  # noqa: BLE001 - only the engine's cache size and prompt depend on it
        return None


# ----------------------------------------------------------------------------- running


@dataclass(frozen=True)
class EvalOptions:
    """What the user asked ``grpo-eval`` for."""

    data: str | None = None
    """Data set (see load_data); None: the run's held-out set, or gsm8k:test."""
    num: int | None = None
    """First K problems only."""
    samples: int = 0
    """0: greedy; k: k sampled completions per problem (pass@k)."""
    max_new_tokens: int | None = None
    """Generation cap; None: the run's rollout.max_new_tokens, else 512."""
    batch_size: int | None = None
    """Rows generated at once; None: a rollout's rows of the run, else 64."""
    seed: int = 0
    """Sampling seed (--samples)."""


def evaluate(target: Target, opts: EvalOptions) -> dict[str, Any]:
    """Generate, judge and summarise (the result dict written as JSON). A model of one of
    our runs is run as its trainer evaluates (see docs/ARCHITECTURE.md, "grpo-eval and the
    trainer's evaluation"): fp32 weights under the run's precision, the run's engine, the
    engine's cache sized for the run's prompts, the run's system prompt and generation cap,
    and greedy batches composed as on the trainer's ranks."""
    import torch

    from grpo_hpc.tasks import problems as data
    from grpo_hpc.train.evaluation import scoring
    from grpo_hpc.train.rollout import engines as rollout
    from grpo_hpc.train.setup import models

    cfg = target.cfg
    spec = opts.data or (RUN_DATA if cfg is not None else "gsm8k:test")
    problems = load_data(spec, cfg, opts.num)
    reward = cfg.reward if cfg is not None else RewardConfig()
    num = numerics_for(cfg, torch.cuda.is_available())
    device = torch.device(num.device)
    compute = getattr(torch, num.compute_dtype)
    if device.type == "cpu" and cfg is not None and cfg.training.num_threads:
        torch.set_num_threads(cfg.training.num_threads)  # the trainer's (a GEMM's split)
    attn = cfg.model.attn_implementation if cfg is not None else "auto"
    attn = "sdpa" if attn == "auto" else attn
    model, tok = models.load_model_and_tokenizer(
        target.model_dir, attn, device, getattr(torch, num.load_dtype)
    )
    model.eval()
    if cfg is not None and cfg.dist.compile is True and device.type == "cuda":
        # As the trainer's, if set (HF generate runs its compiled layers); auto's
        # compilation pays in the update, which evaluation does not run.
        models.compile_layers(model)
    sets = _trainer_sets(cfg)
    # The trainer's system prompt: the config's, else the instruction its train set implies.
    system = cfg.data.system_prompt if cfg is not None else ""
    system = system or data.default_instruction(sets[0] if sets else problems)
    prompts = [data.prompt_text(tok, p["question"], system) for p in problems]
    max_new = opts.max_new_tokens or (
        cfg.rollout.max_new_tokens if cfg is not None else DEFAULT_MAX_NEW_TOKENS
    )
    world = target.world if cfg is not None else 1
    chunk = opts.batch_size or (
        scoring.eval_chunk(cfg.rollout.prompts_per_step, cfg.rollout.num_generations, world)
        if cfg is not None
        else DEFAULT_CHUNK
    )
    temperature = cfg.rollout.temperature if cfg is not None else 1.0
    top_p = cfg.rollout.top_p if cfg is not None else 1.0
    # The engine's KV cache is sized for the longest prompt it will see; the trainer's for
    # its train and held-out sets (a cache's capacity is the stride its attention reads).
    longest = data.longest_prompt_tokens(tok, problems, system)
    if sets is not None:
        longest = max(longest, data.longest_prompt_tokens(tok, sets[0] + sets[1], system))
    engine_opts = rollout.EngineOptions(
        max_new, temperature, top_p, 86400.0, dtype=compute, max_prompt_tokens=longest,
        logp_temperature=cfg.logp_temperature if cfg is not None else 1.0,
    )  # fmt: skip
    engine = rollout.build_engine(
        num.engine, model, tok, engine_opts, tick=lambda: None, abort=lambda: False,
        autocast=lambda: torch.autocast(device.type, dtype=compute, enabled=num.autocast),
    )  # fmt: skip
    samples = max(opts.samples, 1)
    t0 = time.monotonic()
    ranks = 1 if opts.batch_size else world
    texts = _generate(engine, prompts, samples, chunk, opts.seed, ranks)
    seconds = time.monotonic() - t0
    judge = judge_for(spec, reward)
    strict_judge = judge_for(spec, replace(reward, require_marker=True))
    rows = [texts[i * samples : (i + 1) * samples] for i in range(len(problems))]
    flat_problems = [p for p in problems for _ in range(samples)]
    scores = judge(texts, flat_problems)
    strict = scores if reward.require_marker else strict_judge(texts, flat_problems)
    correct = [scores[i * samples : (i + 1) * samples] for i in range(len(problems))]
    strict_rows = [strict[i * samples : (i + 1) * samples] for i in range(len(problems))]
    result = {
        "model": target.label,
        "model_dir": str(target.model_dir),
        "run": target.run,
        "step": target.step,
        "data": spec,
        "mode": "greedy" if opts.samples <= 0 else f"sampled (temperature {temperature})",
        "engine": type(engine).__name__,
        "device": device.type,
        "weights_dtype": num.load_dtype,
        "compute_dtype": num.compute_dtype,
        "batch": {"rows": chunk, "ranks": ranks},
        "max_new_tokens": max_new,
        "judge": {"require_marker": reward.require_marker, "timeout_s": reward.timeout_s},
        "seconds": seconds,
        **summarize(correct, strict_rows),
        "per_problem": [
            {"question": p["question"], "gold": p.get("gold"), "completions": r, "correct": c}
            for p, r, c in zip(problems, rows, correct, strict=True)
        ],
    }
    return result


def _generate(
    engine: Any, prompts: list[str], samples: int, chunk: int, seed: int, ranks: int = 1
) -> list[str]:
    """Completions of every prompt (``samples`` each, grouped), with a progress bar; greedy
    ones in the batches of the trainer's ``ranks`` processes."""
    import torch
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeRemainingColumn

    from grpo_hpc.train.evaluation import scoring

    console = Console(stderr=True)
    columns = ("[progress.description]{task.description}", BarColumn(), MofNCompleteColumn())
    with Progress(*columns, TimeRemainingColumn(), console=console, transient=True) as bar:
        task = bar.add_task("generating", total=len(prompts))
        if samples == 1:
            return scoring.generate_greedy_ranked(
                engine, prompts, chunk, ranks, lambda done, s: bar.update(task, completed=done)
            )
        torch.manual_seed(seed)
        per_call = max(1, chunk // samples)
        texts: list[str] = []
        for i in range(0, len(prompts), per_call):
            texts += engine.generate(prompts[i : i + per_call], samples).texts
            bar.update(task, completed=min(i + per_call, len(prompts)))
        return texts


def summary_line(result: dict[str, Any], out: Path) -> str:
    """The one line grpo-eval prints."""
    n, k = result["problems"], result["samples"]
    head = f"{result['model']} on {result['data']} ({n} problems"
    head += ", greedy)" if k == 1 else f", {k} samples each)"
    acc = f"accuracy {result['accuracy']:.3f} ({result['correct']}/{n * k})"
    if k > 1:
        acc += ", " + ", ".join(f"pass@{kk} {v:.3f}" for kk, v in result["pass@k"].items())
    strict = f"with an answer line {result['accuracy_strict']:.3f}"
    return f"{head}: {acc}, {strict}; {result['seconds']:.0f} s -> {out}"


# ----------------------------------------------------------------------------- command line
