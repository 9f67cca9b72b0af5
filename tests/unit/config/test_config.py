"""Config loading, dotted overrides in both spellings, and one-line errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from grpo_hpc.config.load import build_config, builtin_configs, load_resolved, to_yaml
from grpo_hpc.config.validate import async_ranks_problem
from grpo_hpc.core.errors import ConfigError, ExitCode


def test_builtin_configs_load() -> None:
    assert {"tiny", "demo", "gsm8k"} <= set(builtin_configs())
    for name in builtin_configs():
        build_config(name)


def test_overrides_both_forms() -> None:
    cfg = build_config("tiny", ["--training.max_steps=7", "rollout.temperature=0.5"])
    assert cfg.training.max_steps == 7
    assert cfg.rollout.temperature == 0.5


def test_resolved_round_trip(tmp_path: Path) -> None:
    cfg = build_config("tiny", ["optim.lr=0.01", "reward.custom={'m:f': 0.5}"])
    path = tmp_path / "config.yaml"
    path.write_text(to_yaml(cfg))
    assert load_resolved(path) == cfg


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["training.max_step=3"], "did you mean 'training.max_steps'"),
        (["training.max_steps=abc"], "wrong value type for 'training.max_steps'"),
        (["algo.advantage=best"], "algo.advantage='best' is not one of"),
        (["nonsense"], "write it as section.key=value"),
        (["faults.zero_reward=true"], "faults.enabled=true"),
        (["rollout.num_generations=1"], "rollout.num_generations=1 must be at least 2"),
        (["rollout.num_generations=0"], "rollout.num_generations=0 must be at least 2"),
        (["data.num_val=-1"], "data.num_val=-1 must be >= 0"),
        (["data.num_eval=-3"], "data.num_eval=-3 must be >= 0"),
        (["data.num_train=-1"], "data.num_train=-1 must be >= 0"),
        (["algo.tis_cap=0.5"], "algo.tis_cap must be 0"),
        (["algo.tis_cap=-1"], "algo.tis_cap must be 0"),
        (["algo.offpolicy_mask=-0.1"], "algo.offpolicy_mask=-0.1 must be >= 0"),
        (["algo.max_staleness=-1"], "algo.max_staleness=-1 must be >= 0"),
        (
            ["algo.max_staleness=2", "dist.nproc_per_node=2", "rollout.dynamic_sampling=true"],
            "algo.max_staleness=2 with rollout.dynamic_sampling runs in one process",
        ),
        (["training.cut_off_patience=-1"], "training.cut_off_patience must be >= 0"),
        (["rollout.progress_timeout_s=5"], "rollout.progress_timeout_s=5 must be 0"),
        (["rollout.progress_timeout_s=-1"], "rollout.progress_timeout_s=-1 must be 0"),
        (["faults.stuck_generation_at_step=3"], "faults.enabled=true"),
        (["rollout.partial_pool=1"], "rollout.partial_pool=1 must be 0 (off"),
        (
            ["rollout.partial_pool=2", "algo.max_staleness=1"],
            "rollout.partial_pool=2 cannot run with algo.max_staleness=1",
        ),
    ],
)
def test_bad_overrides(overrides: list[str], message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(".", r"\.")) as e:
        build_config("tiny", overrides)
    assert e.value.exit_code == ExitCode.CONFIG_ERROR
    assert "\n" not in str(e.value)


def test_an_asynchronous_run_over_fsdp2_ranks_is_accepted() -> None:
    """Each FSDP2 rank generates from a full copy gathered after each update; dynamic
    sampling over several ranks stays refused (its rounds are agreed between ranks)."""
    cfg = build_config(
        "tiny", ["algo.max_staleness=1", "dist.nproc_per_node=2", "dist.strategy=fsdp"]
    )
    assert async_ranks_problem(cfg, 2) is None
    cfg.rollout.dynamic_sampling = True
    assert "rollout.dynamic_sampling" in (async_ranks_problem(cfg, 2) or "")


def test_unknown_config_name_lists_known() -> None:
    with pytest.raises(ConfigError, match="built-in configs are .*tiny"):
        build_config("tinny")


def test_unreadable_yaml(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("training: [1, 2\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        build_config(str(bad))


def test_shell_metacharacters_stay_data() -> None:
    cfg = build_config("tiny", ["model.name_or_path=$(touch /tmp/pwned); rm -rf ~"])
    assert cfg.model.name_or_path == "$(touch /tmp/pwned); rm -rf ~"


def test_a_run_config_read_again_is_a_fresh_copy_of_what_the_file_says_now(tmp_path: Path) -> None:
    """load_resolved merges a text once per process: each caller still gets its own copy,
    and a file written again (same size, within one clock tick) is read again."""
    path = tmp_path / "config.yaml"
    path.write_text(to_yaml(build_config("tiny", ["training.max_steps=11"])))
    first = load_resolved(path)
    first.training.max_steps = 99  # a caller's change stays its own
    assert load_resolved(path).training.max_steps == 11
    path.write_text(path.read_text().replace("max_steps: 11", "max_steps: 12"))
    assert load_resolved(path).training.max_steps == 12
    path.write_text("training: [\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_resolved(path)
