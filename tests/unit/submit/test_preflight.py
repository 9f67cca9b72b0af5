"""Submission checks (grpo_hpc.submit.preflight): one test per check, then through grpo-submit."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from grpo_hpc.config.load import build_config
from grpo_hpc.config.profiles import Profile, load_profile
from grpo_hpc.config.schema import DataConfig
from grpo_hpc.core.errors import ConfigError, ExitCode
from grpo_hpc.core.paths import RunPaths
from grpo_hpc.submit import preflight
from tests.conftest import REPO

GOOD_ROW = {"question": "Ada has 2 coins and gets 3 more. How many?", "answer": "2+3=5\n#### 5"}


def _cfg(*overrides: str):
    return build_config("tiny", list(overrides))


def _offline_profile() -> Profile:
    p = load_profile("slurm-local")
    return dataclasses.replace(p, env={**p.env, "HF_HUB_OFFLINE": "1"})


def _cache_with(tmp: Path, kind: str, repo_id: str, files: dict[str, str]) -> Path:
    """A hub cache laid out as huggingface_hub writes it (blobs elided: files in place)."""
    cache = tmp / "hub"
    snap = cache / f"{kind}--{repo_id.replace('/', '--')}" / "snapshots" / "0123abcd"
    snap.mkdir(parents=True)
    for name, text in files.items():
        (snap / name).write_text(text)
    return cache


# ------------------------------------------------------------------ values


@pytest.mark.parametrize(
    ("override", "fragment"),
    [
        ("optim.lr=0", "optim.lr=0.0 must be > 0"),
        ("optim.lr=-1e-5", "optim.lr=-1e-05 must be > 0"),
        ("training.save_every_steps=-1", "training.save_every_steps"),
        ("training.save_every_seconds=-5", "training.save_every_seconds"),
        ("training.keep_last=0", "training.keep_last=0 must be >= 1"),
    ],
)
def test_values_that_never_work(override: str, fragment: str) -> None:
    problems = preflight.check_values(_cfg(override), load_profile("slurm-local"))
    assert len(problems) == 1 and fragment in problems[0], problems


def test_lengths_must_be_positive() -> None:
    cfg = _cfg()
    cfg.rollout.max_new_tokens = 0  # build_config refuses it too; the check stands alone
    problems = preflight.check_values(cfg, load_profile("slurm-local"))
    assert problems == ["rollout.max_new_tokens=0 must be > 0"]


def test_time_limit_shorter_than_signal_lead() -> None:
    profile = dataclasses.replace(load_profile("slurm-local"), time_min=1, signal_lead_s=90)
    problems = preflight.check_values(_cfg(), profile)
    assert len(problems) == 1 and "signal lead (90 s)" in problems[0]


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_low_precision_without_gpus_refused(precision: str) -> None:
    """The local executor hides every GPU from a job that asks for none: a bf16 profile
    without gpus_per_node trained on the CPU, ~40x slower, and said nothing (GPU run)."""
    profile = dataclasses.replace(load_profile("local"), precision=precision)
    cfg = _cfg(f"dist.precision={precision}")
    (problem,) = preflight.check_values(cfg, profile)
    assert f"trains in {precision} but asks for no GPU" in problem and "gpus_per_node" in problem
    with_gpu = dataclasses.replace(profile, gpus_per_node=1)
    assert preflight.check_values(cfg, with_gpu) == []


@pytest.mark.parametrize(
    ("nproc", "overrides", "trainers"),
    [
        (3, ["rollout.prompts_per_step=4"], 3),  # three ranks, four prompts
        # a split run's generator trains nothing: 3 processes are 2 trainers
        (3, ["rollout.prompts_per_step=3", "algo.max_staleness=1", "rollout.placement=split"], 2),
    ],
)
def test_prompts_not_shared_in_whole_groups_refused_before_queueing(
    nproc: int, overrides: list[str], trainers: int
) -> None:
    """The trainer refused it at setup only, after the queue wait."""
    profile = dataclasses.replace(load_profile("slurm-local"), nproc_per_node=nproc)
    cfg = _cfg(*overrides, f"dist.nproc_per_node={nproc}")
    (problem,) = preflight.check_values(cfg, profile)
    assert f"must be a multiple of the {trainers} training processes" in problem, problem
    fixed = cfg.rollout.prompts_per_step // trainers * trainers + trainers
    assert f"rollout.prompts_per_step={fixed}" in problem
    cfg.rollout.prompts_per_step = fixed
    assert preflight.check_values(cfg, profile) == []


def test_good_values_pass() -> None:
    assert preflight.check_values(_cfg(), load_profile("slurm-local")) == []


# ------------------------------------------------------------------ data


def test_data_file_missing(tmp_path: Path) -> None:
    cfg = _cfg(f"data.source={tmp_path / 'nope.jsonl'}")
    [line] = preflight.check_data(cfg.data, is_offline=False)
    assert "no such file" in line and "nope.jsonl" in line


def test_data_rows_in_wrong_format(tmp_path: Path) -> None:
    f = tmp_path / "d.jsonl"
    f.write_text(json.dumps(GOOD_ROW) + "\n" + json.dumps({"prompt": "x"}) + "\n")
    [line] = preflight.check_data(_cfg(f"data.source={f}").data, is_offline=False)
    assert ":2:" in line and "'question' and 'answer'" in line


def test_data_row_not_json(tmp_path: Path) -> None:
    f = tmp_path / "d.jsonl"
    f.write_text(json.dumps(GOOD_ROW) + "\n{oops\n")
    [line] = preflight.check_data(_cfg(f"data.source={f}").data, is_offline=False)
    assert "d.jsonl:2: not valid JSON" in line


def test_data_only_first_rows_read(tmp_path: Path) -> None:
    f = tmp_path / "d.jsonl"
    rows = [json.dumps(GOOD_ROW)] * preflight.ROWS_CHECKED + ["{broken later"]
    f.write_text("\n".join(rows) + "\n")
    assert preflight.check_data(_cfg(f"data.source={f}").data, is_offline=False) == []


def test_data_empty_file(tmp_path: Path) -> None:
    f = tmp_path / "d.jsonl"
    f.write_text("\n")
    [line] = preflight.check_data(_cfg(f"data.source={f}").data, is_offline=False)
    assert "is empty" in line


def test_hf_dataset_offline_not_cached(tmp_path: Path) -> None:
    cfg = _cfg("data.source=hf:openai/gsm8k:main")
    [line] = preflight.check_data(cfg.data, is_offline=True, cache=tmp_path / "empty")
    assert "HF_HUB_OFFLINE=1" in line and "download openai/gsm8k --repo-type dataset" in line
    assert preflight.check_data(cfg.data, is_offline=False, cache=tmp_path / "empty") == []


def test_hf_dataset_offline_cached(tmp_path: Path) -> None:
    cache = _cache_with(tmp_path, "datasets", "openai/gsm8k", {"README.md": "x"})
    cfg = _cfg("data.source=hf:openai/gsm8k:main")
    assert preflight.check_data(cfg.data, is_offline=True, cache=cache) == []


# ------------------------------------------------------------------ model


def test_model_dir_missing(tmp_path: Path) -> None:
    [line] = preflight.check_model(_cfg(f"model.name_or_path={tmp_path}/m").model, False)
    assert "no such directory" in line


def test_model_dir_without_config(tmp_path: Path) -> None:
    (tmp_path / "m").mkdir()
    [line] = preflight.check_model(_cfg(f"model.name_or_path={tmp_path}/m").model, False)
    assert "has no config.json" in line


def test_model_dir_with_config(tmp_path: Path) -> None:
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text("{}")
    assert preflight.check_model(_cfg(f"model.name_or_path={tmp_path}/m").model, True) == []


def test_hub_model_offline(tmp_path: Path) -> None:
    model = _cfg("model.name_or_path=Qwen/Qwen2.5-0.5B").model
    [line] = preflight.check_model(model, is_offline=True, cache=tmp_path / "empty")
    assert "download Qwen/Qwen2.5-0.5B" in line and "--repo-type" not in line
    assert preflight.check_model(model, is_offline=False, cache=tmp_path / "empty") == []
    cache = _cache_with(tmp_path, "models", "Qwen/Qwen2.5-0.5B", {"config.json": "{}"})
    assert preflight.check_model(model, is_offline=True, cache=cache) == []


def test_builtin_models_need_nothing() -> None:
    assert preflight.check_model(_cfg().model, is_offline=True) == []


def test_offline_read_from_profile_env() -> None:
    assert preflight.offline(_offline_profile())
    assert not preflight.offline(load_profile("slurm-local"))


# ------------------------------------------------------------------ through grpo-submit


def _grpo_submit(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    """The installed console script, as a user runs it."""
    script = Path(sys.executable).parent / "grpo-submit"
    exe = str(script) if script.exists() else shutil.which("grpo-submit")
    assert exe, "grpo-submit is not installed next to this interpreter"
    return subprocess.run(
        [exe, *args], capture_output=True, text=True, env={**os.environ, **env}, timeout=300
    )


def _errors(result: subprocess.CompletedProcess) -> list[str]:
    lines = result.stderr.strip().splitlines()
    assert all(line.startswith("grpo-submit: error: ") for line in lines), result.stderr
    return lines


@pytest.mark.parametrize("dry_run", [False, True])
def test_cli_refuses_every_problem_and_leaves_nothing(tmp_path: Path, dry_run: bool) -> None:
    logs = tmp_path / "logs"
    args = ["--profile", "local", "--config", "tiny", "--name", "bad"]
    args += ["optim.lr=0", f"data.source={tmp_path}/none.jsonl", f"model.name_or_path={tmp_path}"]
    result = _grpo_submit(
        *args, *(["--dry-run"] if dry_run else []), env={"GRPO_HPC_LOGS": str(logs)}
    )
    assert result.returncode == ExitCode.CONFIG_ERROR, result.stderr
    lines = _errors(result)
    assert len(lines) == 3, lines
    assert "optim.lr" in lines[0] and "config.json" in lines[1] and "none.jsonl" in lines[2]
    assert not logs.exists(), "a run directory was left behind"
    if dry_run:  # the preview shows the same problems next to the job it would submit
        assert result.stdout.count("# refused at submission:") == 3


def test_cli_offline_profile_names_the_fetch_command(tmp_path: Path) -> None:
    profile = tmp_path / "offline.yaml"
    text = (REPO / "templates" / "slurm-local.yaml").read_text()
    profile.write_text(text.replace("env:\n", 'env:\n  HF_HUB_OFFLINE: "1"\n'))
    env = {"GRPO_HPC_LOGS": str(tmp_path / "logs"), "HF_HUB_CACHE": str(tmp_path / "hub")}
    args = ["--profile", str(profile), "--config", "tiny", "--dry-run"]
    result = _grpo_submit(*args, "model.name_or_path=Org/not-cached", env=env)
    assert result.returncode == ExitCode.CONFIG_ERROR
    [line] = _errors(result)
    assert line.endswith("download Org/not-cached"), line
    _cache_with(tmp_path, "models", "Org/not-cached", {"config.json": "{}"})
    result = _grpo_submit(*args, "model.name_or_path=Org/not-cached", env=env)
    assert result.returncode == ExitCode.OK, result.stderr


def test_cli_resume_refuses_when_data_went_away(tmp_path: Path) -> None:
    from grpo_hpc.submit.job import create_run

    data = tmp_path / "d.jsonl"
    data.write_text(json.dumps(GOOD_ROW) + "\n")
    paths = RunPaths.for_run("r", tmp_path / "logs")
    create_run(paths, load_profile("local"), "tiny", [f"data.source={data}"])
    data.unlink()
    result = _grpo_submit("--resume", "r", env={"GRPO_HPC_LOGS": str(tmp_path / "logs")})
    assert result.returncode == ExitCode.CONFIG_ERROR, result.stderr
    [line] = _errors(result)
    assert "d.jsonl" in line and "no such file" in line
    assert not paths.jobs.exists(), "nothing may be submitted"


def test_packaged_gsm8k_needs_no_file_or_cache() -> None:
    """``data.source=gsm8k`` is shipped in the package: nothing to find on an offline node."""
    assert preflight.check_data(DataConfig(source="gsm8k"), is_offline=True) == []


def test_cli_refuses_bf16_profile_without_gpus(tmp_path: Path) -> None:
    prof = tmp_path / "gpuless.yaml"
    prof.write_text("executor: local\nprecision: bf16\n")
    logs = tmp_path / "logs"
    r = _grpo_submit(
        "--profile", str(prof), "--config", "tiny", "--logs", str(logs), "--name", "g", env={}
    )  # fmt: skip
    assert r.returncode == int(ExitCode.CONFIG_ERROR), r.stderr
    (line,) = _errors(r)
    assert "asks for no GPU" in line
    assert not (logs / "g").exists()


@pytest.mark.parametrize(
    ("capability", "precision", "refused"),
    [(7.0, "bf16", True), (7.0, "fp16", False), (8.0, "bf16", False), (None, "bf16", False)],
)
def test_bf16_is_refused_where_the_profile_names_gpus_without_it(
    capability: float | None, precision: str, refused: bool
) -> None:
    profile = Profile(name="p", gpus_per_node=2, gpu_capability=capability, precision=precision)
    problems = preflight.check_values(_cfg(f"dist.precision={precision}"), profile)
    hits = [p for p in problems if "no bf16 arithmetic" in p]
    assert len(hits) == int(refused), problems
    if refused:
        assert "compute capability 7.0" in hits[0] and "dist.precision=fp16" in hits[0]


def test_cli_refuses_bf16_on_the_supercloud_profile_before_queueing(tmp_path: Path) -> None:
    """The built-in supercloud profile names its V100s' capability: a command-line bf16
    (which wins over the profile's fp16) is refused at submission, exit 2, nothing written."""
    logs = tmp_path / "logs"
    r = _grpo_submit(
        "--profile", "supercloud", "--config", "tiny", "--logs", str(logs), "--name", "v",
        "dist.precision=bf16", env={},
    )  # fmt: skip
    assert r.returncode == int(ExitCode.CONFIG_ERROR), r.stderr
    lines = [line for line in _errors(r) if "bf16" in line]
    assert len(lines) == 1 and "profile 'supercloud'" in lines[0], _errors(r)
    assert not (logs / "v").exists()


def test_random_weights_of_a_local_architecture_are_checked_like_the_directory(
    tmp_path: Path,
) -> None:
    model = _cfg(f"model.name_or_path=random:{tmp_path}/m").model
    [line] = preflight.check_model(model, False)
    assert "no such directory" in line
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text("{}")
    assert preflight.check_model(model, False) == []


def _gemma2_dir(tmp_path: Path) -> Path:
    """A small Gemma 2-like config directory (no weights: ``random:DIR`` builds them); a
    family the native engine does not implement (docs/models.md)."""
    d = tmp_path / "gemma2"
    d.mkdir()
    cfg = {
        "model_type": "gemma2", "architectures": ["Gemma2ForCausalLM"], "hidden_size": 64,
        "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 2, "head_dim": 16, "vocab_size": 256, "hidden_act": "silu",
        "tie_word_embeddings": True,
    }  # fmt: skip
    (d / "config.json").write_text(json.dumps(cfg))
    return d


def test_cli_dry_run_names_the_rollout_engine(tmp_path: Path) -> None:
    from grpo_hpc.config.rollout_engine import HF_SLOWDOWN

    env = {"GRPO_HPC_LOGS": str(tmp_path / "logs")}
    model = f"model.name_or_path=random:{_gemma2_dir(tmp_path)}"
    said = {}
    for profile, extra in (("local", []), ("h100x2", []), ("h100x2", [model]), ("local", [model])):
        result = _grpo_submit(
            "--profile", profile, "--config", "tiny", "--dry-run", *extra, env=env
        )
        assert result.returncode == ExitCode.OK, result.stderr
        [line] = [x for x in result.stdout.splitlines() if x.startswith("rollout: ")]
        said[profile, bool(extra)] = line
    assert said["h100x2", False] == "rollout: native (llama)"  # the tiny model is a Llama
    assert said["local", False] == (
        "rollout: HF generate (rollout.engine=auto on a CPU: the native engine pays on a GPU only)"
    )
    assert said["h100x2", True] == (
        "rollout: HF generate, model_type gemma2 has no native implementation: "
        f"rollouts about {HF_SLOWDOWN} slower"
    )
    assert "model_type gemma2 has no native implementation" in said["local", True]
    assert not (tmp_path / "logs").exists()


@pytest.mark.parametrize("dry_run", [False, True])
def test_cli_refuses_native_for_an_unsupported_model_before_anything_queues(
    tmp_path: Path, dry_run: bool
) -> None:
    logs = tmp_path / "logs"
    args = ["--profile", "local", "--config", "tiny", "--name", "q3", "rollout.engine=native"]
    args += [f"model.name_or_path=random:{_gemma2_dir(tmp_path)}"]
    result = _grpo_submit(
        *args, *(["--dry-run"] if dry_run else []), env={"GRPO_HPC_LOGS": str(logs)}
    )
    assert result.returncode == ExitCode.CONFIG_ERROR, result.stderr
    [line] = _errors(result)
    assert line == (
        "grpo-submit: error: rollout.engine=native cannot decode model_type 'gemma2': use "
        "rollout.engine=hf or auto (HF generate: rollouts about 7-14x slower on a GPU); the "
        "native engine decodes model_types llama, qwen2, mistral, qwen3, olmo2, smollm3, "
        "ministral, phi3, gemma3_text"
    )
    assert not logs.exists(), "a run directory was left behind"


def test_rollout_choice_of_the_built_in_and_unreadable_models() -> None:
    gpu = load_profile("h100x2")
    assert preflight.rollout_choice(_cfg(), gpu).line == "rollout: native (llama)"
    smollm2 = _cfg("model.name_or_path=smollm2-135m")  # a Llama, shipped as a GGUF
    assert preflight.rollout_choice(smollm2, gpu).line == "rollout: native (llama)"
    hub = preflight.rollout_choice(_cfg("model.name_or_path=Org/not-cached-anywhere"), gpu)
    assert hub.line == (
        "rollout: decided at step 0 (config.json not readable here: 'Org/not-cached-anywhere' "
        "is not in this machine's Hugging Face cache)"
    )
    assert hub.refusal is None  # not refused on a guess, even with rollout.engine=native
    native = _cfg("model.name_or_path=Org/not-cached-anywhere", "rollout.engine=native")
    assert preflight.rollout_choice(native, gpu).refusal is None


# ------------------------------------------------------------------ select_metric


@pytest.mark.parametrize(
    ("select", "code", "refused"),
    [
        ("auto", True, False),
        ("auto", False, False),
        ("pass@1", True, False),
        ("accuracy", True, True),
        ("accuracy_strict", True, True),
        ("pass@1", False, True),
        ("accuracy", False, False),
        ("accuracy_strict", False, False),
        ("pass@1", None, False),  # not known here (hf:): the trainer decides
    ],
)
def test_select_metric_must_be_one_the_task_reports(
    select: str, code: bool | None, refused: bool
) -> None:
    from grpo_hpc.tasks.problems import Splits
    from grpo_hpc.train.evaluation.held_out import select_metric

    problems = preflight.check_select_metric(select, code)
    assert bool(problems) == refused, problems
    if code is None:
        return
    # the trainer's own rule, which the submission check makes before the queue wait
    row = {"question": "q", "gold": "", "tests": ["assert True"]} if code else GOOD_ROW
    splits = Splits([], [row], [])
    if refused:
        with pytest.raises(ConfigError) as e:
            select_metric(select, splits)
        assert problems == [str(e.value).replace("pass@k", "pass@1")]
    else:
        select_metric(select, splits)


def test_source_kind_from_its_name_or_first_rows(tmp_path: Path) -> None:
    assert preflight.source_is_code(DataConfig(source="gsm8k")) is False
    assert preflight.source_is_code(DataConfig(source="arithmetic")) is False
    assert preflight.source_is_code(DataConfig(source="humaneval")) is True
    assert preflight.source_is_code(DataConfig(source="hf:openai/gsm8k")) is None
    mbpp = tmp_path / "mbpp.jsonl"
    mbpp.write_text(json.dumps({"text": "Add.", "test_list": ["assert add(1, 2) == 3"]}) + "\n")
    assert preflight.source_is_code(DataConfig(source=str(mbpp))) is True
    math = tmp_path / "math.jsonl"
    math.write_text(json.dumps(GOOD_ROW) + "\n")
    assert preflight.source_is_code(DataConfig(source=str(math))) is False
    cfg = _cfg(f"data.source={mbpp}", "training.select_metric=accuracy")
    problems = preflight.check_all(cfg, load_profile("local"))
    assert problems == [
        "training.select_metric=accuracy: this run's code problems report pass@1; use auto "
        "(the default)"
    ]


def test_cli_refuses_a_quoted_gpu_capability(tmp_path: Path) -> None:
    profile = tmp_path / "quoted.yaml"
    text = (REPO / "templates" / "h100x2.yaml").read_text()
    assert "gpu_capability: 9.0" in text
    profile.write_text(text.replace("gpu_capability: 9.0", 'gpu_capability: "9.0"'))
    logs = tmp_path / "logs"
    args = ["--profile", str(profile), "--config", "tiny", "--dry-run"]
    result = _grpo_submit(*args, env={"GRPO_HPC_LOGS": str(logs)})
    assert result.returncode == ExitCode.CONFIG_ERROR, result.stderr
    [line] = _errors(result)
    assert "gpu_capability must be a number, written unquoted (gpu_capability: 7.0)" in line
    assert not logs.exists()


def test_cli_dry_run_places_an_asynchronous_run_ddp_or_fsdp(tmp_path: Path) -> None:
    """algo.max_staleness: ``--dry-run`` says where generation runs; on h100x2's two GPUs
    DDP and FSDP2 are accepted (each FSDP2 rank generates from a full copy, gathered from
    the shards after each update)."""
    env = {"GRPO_HPC_LOGS": str(tmp_path / "logs")}
    args = ("--config", "tiny", "--dry-run", "algo.max_staleness=1")
    result = _grpo_submit("--profile", "local", *args, env=env)
    assert result.returncode == ExitCode.OK, result.stderr
    [line] = [x for x in result.stdout.splitlines() if x.startswith("placement: ")]
    assert "a generator thread on a copy of the weights" in line and "1 update(s)" in line
    ddp = _grpo_submit("--profile", "h100x2", *args, "dist.strategy=ddp", env=env)
    assert ddp.returncode == ExitCode.OK, ddp.stderr
    assert "placement: each of 2 DDP processes: the trainer, and a generator thread" in ddp.stdout
    fsdp = _grpo_submit("--profile", "h100x2", *args, "dist.strategy=fsdp", env=env)
    assert fsdp.returncode == ExitCode.OK, fsdp.stderr
    said = "placement: each of 2 FSDP2 processes: the trainer, and a generator thread on a full"
    assert said in fsdp.stdout
    sync = _grpo_submit("--profile", "local", "--config", "tiny", "--dry-run", env=env)
    assert "placement: " not in sync.stdout
    assert not (tmp_path / "logs").exists()


def test_cli_dry_run_says_partial_rollouts_and_refuses_them_in_one_line(tmp_path: Path) -> None:
    """rollout.partial_pool: ``--dry-run`` says the pool on the placement line; a pool the
    bound cannot hold is refused before anything is written, exit 2, one line."""
    env = {"GRPO_HPC_LOGS": str(tmp_path / "logs")}
    args = ("--profile", "local", "--config", "tiny", "--dry-run", "rollout.partial_pool=2")
    ok = _grpo_submit(*args, "algo.max_staleness=2", env=env)
    assert ok.returncode == ExitCode.OK, ok.stderr
    [line] = [x for x in ok.stdout.splitlines() if x.startswith("placement: ")]
    assert "the prompts of 2 steps in flight, answers continued" in line and "2 update(s)" in line
    bad = _grpo_submit(*args, "algo.max_staleness=1", env=env)
    assert bad.returncode == ExitCode.CONFIG_ERROR
    said = [x for x in bad.stderr.splitlines() if x.strip()]
    assert len(said) == 1 and "set algo.max_staleness=2 or more" in said[0], bad.stderr
    assert not (tmp_path / "logs").exists()


def test_cli_dry_run_says_a_split_runs_partial_pool_and_its_generator_memory(
    tmp_path: Path,
) -> None:
    """A split run with partial rollouts: the placement line says each trainer's pool, and
    the generator's estimate counts the pool's rows (P steps', each with room for a
    continued answer), more than the same run's without a pool."""
    env = {"GRPO_HPC_LOGS": str(tmp_path / "logs")}
    args = ("--profile", "h100x2", "--config", "tiny", "--dry-run", "rollout.placement=split")
    engines = {}
    for pool in (0, 2):
        pool_args = (
            "algo.max_staleness=2",
            f"rollout.partial_pool={pool}",
            "rollout.max_new_tokens=4096",
        )
        out = _grpo_submit(*args, *pool_args, env=env)
        assert out.returncode == ExitCode.OK, out.stderr
        [line] = [x for x in out.stdout.splitlines() if x.startswith("placement: split: ")]
        said = "each trainer's prompts of 2 steps in flight, answers continued"
        assert (said in line) == bool(pool), line
        engines[pool] = float(line.split("generator rank 1 (engine ")[1].split(" GiB")[0])
    assert engines[2] > engines[0], engines
    assert not (tmp_path / "logs").exists()


def test_cli_dry_run_names_each_role_of_a_split_run(tmp_path: Path) -> None:
    """rollout.placement=split: ``--dry-run`` prints one line with each role's ranks and
    memory estimate (trainers first, the generators last; with several, which serves which
    trainer); one process, more generators than trainers, or a synchronous run, is refused
    before anything queues, exit 2, by the config's own rule."""
    env = {"GRPO_HPC_LOGS": str(tmp_path / "logs")}
    args = ("--config", "tiny", "--dry-run", "rollout.placement=split")
    two = _grpo_submit("--profile", "h100x2", *args, "algo.max_staleness=1", env=env)
    assert two.returncode == ExitCode.OK, two.stderr
    [line] = [x for x in two.stdout.splitlines() if x.startswith("placement: ")]
    assert line.startswith("placement: split: trainer rank 0 (update "), line
    assert " GiB), generator rank 1 (engine " in line and "at most 1 update(s) stale" in line
    # two nodes of one process: ranks are numbered node by node, each role's node named
    nodes = _grpo_submit("--profile", "slurm-local-2node", *args, "algo.max_staleness=1", env=env)
    assert nodes.returncode == ExitCode.OK, nodes.stderr
    [line] = [x for x in nodes.stdout.splitlines() if x.startswith("placement: ")]
    assert line.startswith(
        "placement: split: trainer rank 0 on node 0, generator rank 1 on node 1;"
    )
    assert "trainer r's" not in line
    four = tmp_path / "h100x4.yaml"  # one node of 4 GPUs: 2 trainers, 2 generators
    four.write_text(
        (REPO / "templates" / "h100x2.yaml")
        .read_text()
        .replace("gpus_per_node: 2", "gpus_per_node: 4")
    )
    split4 = (*args, "algo.max_staleness=1", "rollout.generators=2")
    two_two = _grpo_submit("--profile", str(four), *split4, env=env)
    assert two_two.returncode == ExitCode.OK, two_two.stderr
    [line] = [x for x in two_two.stdout.splitlines() if x.startswith("placement: ")]
    assert line.startswith("placement: split: trainer ranks 0-1 (update "), line
    assert " GiB), generator ranks 2-3 (engine " in line, line
    assert " GiB) (trainer r's: rank 2 + r % 2); batches at most 1" in line, line
    one = _grpo_submit("--profile", "local", *args, "algo.max_staleness=1", env=env)
    assert one.returncode == ExitCode.CONFIG_ERROR
    said = "rollout.placement=split runs 1 generator and at least 1 trainer process, not 1"
    assert said in one.stderr and "placement: " not in one.stdout
    sync = _grpo_submit("--profile", "h100x2", *args, env=env)
    assert sync.returncode == ExitCode.CONFIG_ERROR
    assert "rollout.placement=split generates ahead of the trainer" in sync.stderr
    assert not (tmp_path / "logs").exists()


def test_cli_refuses_fsdp2_split_trainers_evaluating_on_hf_generate(tmp_path: Path) -> None:
    """Two FSDP2 trainers and a generator evaluating with HF generate (the engine a CPU
    job chooses) would wait for ever in HF's all-reduce, which the generator never joins:
    the trainer refused it at setup, after the queue wait; grpo-submit refuses it first,
    from the engine choice the trainer makes. The native engine passes."""
    three = tmp_path / "local3.yaml"
    three.write_text(
        (REPO / "templates" / "local.yaml")
        .read_text()
        .replace("nproc_per_node: 1", "nproc_per_node: 3")
    )
    env = {"GRPO_HPC_LOGS": str(tmp_path / "logs")}
    args = ("--profile", str(three), "--config", "tiny", "--dry-run", "training.eval_every=2")
    args += ("rollout.placement=split", "algo.max_staleness=1", "dist.strategy=fsdp")
    args += ("rollout.prompts_per_step=2",)
    hf = _grpo_submit(*args, env=env)
    assert hf.returncode == ExitCode.CONFIG_ERROR, hf.stdout
    (line,) = [x for x in _errors(hf) if "FSDP2 trainers" in x]
    assert "2 FSDP2 trainers evaluates with the native engine only" in line
    native = _grpo_submit(*args, "rollout.engine=native", env=env)
    assert native.returncode == ExitCode.OK, native.stderr
    assert not (tmp_path / "logs").exists()
