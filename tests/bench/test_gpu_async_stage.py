"""The `async` subject of bench/gpu.sh, assembled without a GPU: `python3` and `nvidia-smi`
are stubs on PATH that write down each call and its NVLink-multicast environment, so each
stage is checked for the runner it starts, the settings it gives it (model, cap, rows,
steps, imposed lengths or not, the staleness values) and multicast off in every process."""

from __future__ import annotations

import os
import shlex
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
NVLS = ("NCCL_NVLS_ENABLE=0", "TORCH_SYMM_MEM_DISABLE_MULTICAST=1", "NVSHMEM_DISABLE_NVLS=1")
STUB = """#!/bin/bash
{ printf '%s' "$(basename "$0")"; printf ' %q' "$@"; echo
  printf 'ENV'
  for v in NCCL_NVLS_ENABLE TORCH_SYMM_MEM_DISABLE_MULTICAST NVSHMEM_DISABLE_NVLS; do
    printf ' %s=%s' "$v" "${!v:-}"
  done
  echo
} >> "$CALLS"
"""


def _run(
    tmp_path: Path, stages: list[str], code: int = 0, **env: str
) -> tuple[list[list[str]], list[str], str]:
    """Run ``bench/gpu.sh async OUT STAGES`` in a checkout of bench/ alone (no .whl);
    return the python3 calls (argv), the environment line of each, and stdout."""
    repo, bin_ = tmp_path / "repo", tmp_path / "bin"
    repo.mkdir()
    bin_.mkdir()
    (repo / "bench").symlink_to(REPO / "bench")
    for name in ("python3", "nvidia-smi"):
        (bin_ / name).write_text(STUB)
        (bin_ / name).chmod(0o755)
    calls = tmp_path / "calls.txt"
    r = subprocess.run(
        ["bash", "bench/gpu.sh", "async", str(tmp_path / "out"), *stages],
        cwd=repo,
        capture_output=True,
        text=True,
        env={"PATH": f"{bin_}:/usr/bin:/bin", "CALLS": str(calls), **env},
    )
    assert r.returncode == code, r.stderr
    lines = calls.read_text().splitlines() if calls.exists() else []
    argvs = [shlex.split(x) for x in lines[0::2]]
    return [a for a in argvs if a[0] == "python3"], lines[1::2], r.stdout


def _after(argv: list[str], flag: str) -> str:
    return argv[argv.index(flag) + 1]


def test_random_weight_stages_impose_the_recorded_lengths(tmp_path: Path) -> None:
    calls, envs, _ = _run(tmp_path, ["qwen", "lora8b"])
    assert len(calls) == 2 and all(line == "ENV " + " ".join(NVLS) for line in envs)
    for argv in calls:
        assert argv[1:4] == ["-m", "bench.speed.longtail", "--out"]
        ours, theirs = argv[: argv.index("--")], argv[argv.index("--") + 1 :]
        assert ours[ours.index("--staleness") + 1 : ours.index("--run-timeout")] == ["0", "1"]
        assert _after(theirs, "--max-new") == "4096" and _after(theirs, "--precision") == "bf16"
        dist = _after(theirs, "--length-dist")
        assert (REPO / dist).is_file() and dist.startswith("bench/speed/lengths/")
    qwen, lora = calls
    assert _after(qwen, "--model-dir") == "random:bench/shapes/qwen2.5-1.5b"
    assert (_after(qwen, "--prompts"), _after(qwen, "--G"), _after(qwen, "--steps")) == (
        "8", "8", "5",
    )  # fmt: skip
    assert _after(lora, "--model-dir") == "random:bench/shapes/llama-3.1-8b"
    assert _after(lora, "--override") == "model.lora_rank=16" and _after(lora, "--steps") == "5"
    for argv in calls:  # the shapes exist
        assert (
            REPO / _after(argv, "--model-dir").removeprefix("random:") / "config.json"
        ).is_file()


def test_the_real_model_stages_record_real_lengths_at_both_caps(tmp_path: Path) -> None:
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    calls, envs, _ = _run(
        tmp_path, ["smollm2_1k", "smollm2_4k"], ASYNC_MODEL=str(model), ASYNC_K="1"
    )
    assert [_after(a, "--max-new") for a in calls] == ["1024", "4096"]
    for argv in calls:
        assert "--length-dist" not in argv  # the model's own EOS
        assert _after(argv, "--source") == "gsm8k" and _after(argv, "--model-dir") == str(model)
        assert _after(argv, "--staleness") == "1"  # ASYNC_K: one value a call when needed
    assert all(line == "ENV " + " ".join(NVLS) for line in envs)


def test_two_gpus_run_the_comparison_on_both_and_a_split_variant(tmp_path: Path) -> None:
    """ASYNC_NPROC=2: every run of the stage on 2 processes (the synchronous run as 2 DDP
    ranks, a split variant as a trainer and a generator: the same GPUs), multicast off;
    one process by default."""
    split = "split=algo.max_staleness=2 rollout.partial_pool=2 rollout.placement=split"
    calls, envs, _ = _run(tmp_path, ["qwen"], ASYNC_NPROC="2", ASYNC_VARIANTS=split, ASYNC_K="0")
    [argv] = calls
    assert _after(argv, "--nproc") == "2" and _after(argv, "--variant") == split
    assert all(line == "ENV " + " ".join(NVLS) for line in envs)
    (tmp_path / "one").mkdir()
    [one], _, _ = _run(tmp_path / "one", ["qwen"])
    assert _after(one, "--nproc") == "1"


def test_async_k_none_runs_the_variants_alone(tmp_path: Path) -> None:
    """ASYNC_K=none: ``--staleness`` with no value, then the variant (the second call of a
    comparison too long for one: the synchronous run came in an ``ASYNC_K=0`` call)."""
    m3 = "m3=algo.max_staleness=2 rollout.steps_per_generation=3"
    [argv], _, _ = _run(tmp_path, ["lora8b"], ASYNC_K="none", ASYNC_VARIANTS=m3)
    at = argv.index("--staleness")
    assert argv[at + 1 : at + 3] == ["--variant", m3]


def test_without_the_converted_model_the_real_stages_say_so(tmp_path: Path) -> None:
    calls, _, out = _run(tmp_path, ["smollm2_1k"], 1, ASYNC_MODEL=str(tmp_path / "none"))
    assert calls == [] and "no converted model" in out


@pytest.mark.parametrize("stage", ["nosuch"])
def test_an_unknown_async_stage_is_said_so(tmp_path: Path, stage: str) -> None:
    _, _, out = _run(tmp_path, [stage])
    assert f"unknown stage {stage}" in out


def test_the_stage_file_is_listed_by_the_driver() -> None:
    text = (REPO / "bench/gpu.sh").read_text()
    assert "| async |" in text and os.path.isfile(REPO / "bench/gpu/async.sh")


def test_the_profile_stage_profiles_both_priorities_with_the_qwen_settings(tmp_path: Path) -> None:
    """Two runs of bench/speed/profile_async.py (normal, then high priority), each with the
    qwen stage's model, cap, rows and imposed lengths; their arguments parse as the
    benchmark's own CLI, the caller's overrides after the priority's."""
    from bench.speed.profile_async import overrides, parse

    calls, envs, out = _run(tmp_path, ["profile"], PROFILE_ASYNC_OVERRIDES="a.b=1 c.d=2")
    assert len(calls) == 2 and all(line == "ENV " + " ".join(NVLS) for line in envs)
    for argv, priority in zip(calls, ("normal", "high"), strict=True):
        assert argv[1:3] == ["-m", "bench.speed.profile_async"]
        args = parse(argv[3:])
        assert (args.shape_name, args.max_new, args.prompts, args.G) == ("qwen2.5-1.5b", 4096, 8, 8)
        assert args.precision == "bf16" and (REPO / args.length_dist).is_file()
        assert args.tag == priority and args.out == tmp_path / "out/async_profile"
        assert args.override == [f"rollout.decode_priority={priority}", "a.b=1", "c.d=2"]
        assert overrides(args)[0] == "algo.max_staleness=1"
        assert f"-- profile_async {priority}: exit 0" in out


def test_the_profile_stage_takes_the_8b_lora_shape(tmp_path: Path) -> None:
    from bench.speed.profile_async import parse

    calls, _, _ = _run(
        tmp_path, ["profile"], PROFILE_ASYNC_SHAPE="lora8b", PROFILE_ASYNC_RUNS="high",
        PROFILE_ASYNC_WARMUP="1",
    )  # fmt: skip
    (argv,) = calls
    args = parse(argv[3:])
    assert (args.shape_name, args.prompts, args.warmup) == ("llama-3.1-8b", 4, 1)
    assert args.override == ["model.lora_rank=16", "rollout.decode_priority=high"]
    (tmp_path / "bad").mkdir()
    _, _, out = _run(tmp_path / "bad", ["profile"], PROFILE_ASYNC_SHAPE="nosuch")
    assert "unknown PROFILE_ASYNC_SHAPE nosuch" in out
