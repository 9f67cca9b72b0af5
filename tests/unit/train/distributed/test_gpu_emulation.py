"""``GRPO_HPC_EMULATE_GPU`` (another GPU's decisions on this one): a bad value is one clear
line, and under the switch every decision the trainer and the native engine make from the
device (auto compile and packing, the bf16 refusal, micro_batch_tokens=auto, the decode
attention) is the emulated GPU's, while the allocator is capped at its memory. CPU only:
torch.cuda's answers are stood in by monkeypatch (an H200: capability 9.0, 140 GiB)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from grpo_hpc.config import speed as auto_speed
from grpo_hpc.config.load import build_config
from grpo_hpc.config.schema import FaultsConfig
from grpo_hpc.core.errors import ConfigError
from grpo_hpc.memory import plan as memory_plan
from grpo_hpc.train.distributed import gpu
from grpo_hpc.train.distributed.dist import DistInfo

CUDA = torch.device("cuda", 0)
REAL_GIB = 140.0


@pytest.fixture
def h200(monkeypatch: pytest.MonkeyPatch) -> list[tuple[float, object]]:
    """torch.cuda answering as one H200 would; the memory fractions set are recorded."""
    fractions: list[tuple[float, object]] = []
    monkeypatch.delenv(gpu.EMULATE_ENV, raising=False)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    props = SimpleNamespace(total_memory=int(REAL_GIB * gpu.GIB))
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device=None: props)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA H200")
    monkeypatch.setattr(
        torch.cuda, "set_per_process_memory_fraction", lambda f, d=None: fractions.append((f, d))
    )
    return fractions


@pytest.mark.parametrize(
    ("text", "want"),
    [
        ("7.0:32", gpu.Emulated((7, 0), 32.0)),
        (" 8.6:40.5 ", gpu.Emulated((8, 6), 40.5)),
        (None, None),
        ("", None),
    ],
)
def test_values_parse(text: str | None, want: gpu.Emulated | None) -> None:
    assert gpu.parse_emulation(text) == want


@pytest.mark.parametrize("text", ["7.0", "7:32", "V100", "7.0:0", "7.0:-1", "7.10:32", "7.0:32GB"])
def test_a_bad_value_is_one_line_naming_the_variable_and_the_form(text: str) -> None:
    with pytest.raises(ConfigError) as e:
        gpu.parse_emulation(text)
    line = str(e.value)
    assert "\n" not in line
    assert line.startswith(f"GRPO_HPC_EMULATE_GPU={text!r}: expected CAPABILITY:GIB")
    assert "e.g. 7.0:32" in line


def test_only_an_older_smaller_gpu_can_be_emulated() -> None:
    v100 = gpu.Emulated((7, 0), 32.0)
    assert gpu.emulation_problem(v100, (9, 0), REAL_GIB, "NVIDIA H200") is None
    newer = gpu.emulation_problem(gpu.Emulated((9, 0), 32.0), (8, 0), 80.0, "NVIDIA A100")
    assert newer and "older than the emulated one" in newer
    bigger = gpu.emulation_problem(gpu.Emulated((7, 0), 200.0), (9, 0), REAL_GIB, "NVIDIA H200")
    assert bigger and "less than the emulated memory" in bigger


def test_without_the_switch_the_device_answers(h200: list) -> None:
    assert gpu.capability(CUDA) == (9, 0)
    assert gpu.total_gib(CUDA) == pytest.approx(REAL_GIB)
    assert gpu.emulate(CUDA) is None
    assert h200 == []  # nothing capped


def test_under_the_switch_the_emulated_gpu_answers(
    h200: list, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(gpu.EMULATE_ENV, "7.0:32")
    assert gpu.capability(CUDA) == (7, 0)
    assert gpu.total_gib(CUDA) == 32.0
    line = gpu.emulate(CUDA)
    assert line == (
        "[Device] GRPO_HPC_EMULATE_GPU=7.0:32: every decision is made for compute capability "
        "7.0 on the real NVIDIA H200 (compute capability 9.0, 140.0 GiB), its allocator capped "
        "at 32 GiB; the kernels are the real GPU's"
    )
    assert h200 == [(pytest.approx(32 / REAL_GIB), CUDA)]


def test_emulating_a_newer_gpu_is_refused_at_setup(
    h200: list, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(gpu.EMULATE_ENV, "10.0:32")
    with pytest.raises(ConfigError, match="only an older GPU can be emulated"):
        gpu.emulate(CUDA)
    assert h200 == []


def test_on_a_cpu_the_switch_is_said_to_be_ignored(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(gpu.EMULATE_ENV, "7.0:32")
    assert "ignored: this process has no GPU" in gpu.emulate(torch.device("cpu"))


def _gsm8k_fp16(precision: str = "fp16"):  # noqa: ANN202
    """bench/gpu/real.sh's supercloud stage's run (configs/gsm8k.yaml, SmolLM2)."""
    return build_config(
        "gsm8k",
        [
            "model.name_or_path=smollm2-135m",
            "model.gradient_checkpointing=false",
            f"dist.precision={precision}",
            "rollout.prompts_per_step=16",
        ],
    )


def test_every_auto_decision_is_a_v100s_under_the_switch(
    h200: list, monkeypatch: pytest.MonkeyPatch
) -> None:
    from grpo_hpc.train.setup import autos

    cfg, info = _gsm8k_fp16(), DistInfo(device=CUDA)
    monkeypatch.setattr(autos.packing, "varlen_kernel", lambda: object())  # CUDA torch has it
    real = autos.resolve(cfg, info)
    assert (real.dist.compile, real.algo.packing) == (True, True)
    assert real.algo.micro_batch_tokens == memory_plan.auto_tokens(cfg, REAL_GIB, 1, (9, 0))

    monkeypatch.setenv(gpu.EMULATE_ENV, "7.0:32")
    v100 = autos.resolve(cfg, info)
    assert (v100.dist.compile, v100.algo.packing) == (False, False)
    # what grpo-submit plans for the supercloud profile (gpu_mem_gb 32, gpu_capability 7.0)
    assert v100.algo.micro_batch_tokens == memory_plan.auto_tokens(cfg, 32.0, 1, (7, 0))
    assert v100.algo.micro_batch_tokens != real.algo.micro_batch_tokens
    with pytest.raises(ConfigError, match="compute capability 7.0. has no bf16"):
        autos.resolve(_gsm8k_fp16("bf16"), info)
    assert autos.device_gib(CUDA) == 32.0


def test_the_decode_attention_is_a_v100s_under_the_switch(
    h200: list, monkeypatch: pytest.MonkeyPatch
) -> None:
    from grpo_hpc.train.rollout.native import attention

    monkeypatch.setattr(attention, "triton", object())  # as on a CUDA build of torch
    assert attention.fused_available(CUDA, torch.float16, 64)
    monkeypatch.setenv(gpu.EMULATE_ENV, "7.0:32")
    assert not attention.fused_available(CUDA, torch.float16, 64)


def test_an_injected_oom_never_lifts_the_emulated_cap(
    h200: list, monkeypatch: pytest.MonkeyPatch
) -> None:
    from grpo_hpc.train.supervision import faults

    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    monkeypatch.setenv(gpu.EMULATE_ENV, "7.0:32")
    faults.before_update(FaultsConfig(enabled=True, oom_at_step=3, oom_gpu_gb=40.0), 3, CUDA)
    faults.before_update(FaultsConfig(enabled=True, oom_at_step=4, oom_gpu_gb=16.0), 4, CUDA)
    assert [f for f, _ in h200] == [pytest.approx(32 / REAL_GIB), pytest.approx(16 / REAL_GIB)]


def test_the_kernels_line_says_what_speed_does_not() -> None:
    from grpo_hpc.train.rollout.native.engine import decode_path
    from grpo_hpc.train.setup.autos import kernels_line

    v100 = decode_path(compiled=True, graphed=True, fused=False)
    assert v100 == "native decode: compiled layers, CUDA graphs, matrix-product attention"
    assert kernels_line("fp16", True, "sdpa", v100, (7, 0)) == (
        "[Kernels] dist.precision=fp16 with the grad scaler; update attention sdpa; "
        "native decode: compiled layers, CUDA graphs, matrix-product attention "
        "(compute capability 7.0)"
    )
    cpu = kernels_line("fp32", False, "sdpa", decode_path(False, False, False), None)
    assert cpu.endswith("; native decode: eager layers, matrix-product attention")


def test_submission_and_training_decide_alike_for_the_profile() -> None:
    """The emulated trainer's Where is the one grpo-submit builds for gpu_capability 7.0."""
    cfg = _gsm8k_fp16()
    submitted = auto_speed.where_submitted(cfg, (7, 0))
    assert not auto_speed.compile_on("auto", submitted)
    assert not auto_speed.packing_on("auto", submitted)
