"""slurm/up.sh --real-gpus: the node's GRES from nvidia-smi.

The configuration is rendered by ``up.sh --print-config`` (no root, no daemons, nothing
written); the only stand-in is nvidia-smi, a script that prints recorded ``nvidia-smi -q``
output in the driver's format.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
UP = ROOT / "slurm" / "up.sh"

pytestmark = pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")

GPU = """GPU 00000000:{bus}.0
    Product Name                          : NVIDIA H100 80GB HBM3
    Product Brand                         : NVIDIA
    Display Mode                          : Disabled
    Persistence Mode                      : Enabled
    Addressing Mode                       : None
    MIG Mode
        Current                           : Disabled
        Pending                           : Disabled
    Accounting Mode                       : Disabled
    Driver Model
        Current                           : N/A
        Pending                           : N/A
    Serial Number                         : 165242302{bus2}
    GPU UUID                              : GPU-5c3b0b3e-0c8e-2f63-2d1b-a6c3a0f1{bus2}
    Minor Number                          : {minor}
    VBIOS Version                         : 96.00.89.00.01
    MultiGPU Board                        : No
"""


def smi_q(minors: list[str]) -> str:
    """``nvidia-smi -q`` output for GPUs with the given minor numbers (abridged per GPU)."""
    head = (
        "\n==============NVSMI LOG==============\n\n"
        "Timestamp                                 : Wed Nov 26 07:00:00 2026\n"
        "Driver Version                            : 580.159.04\n"
        "CUDA Version                              : 13.0\n\n"
        f"Attached GPUs                             : {len(minors)}\n"
    )
    gpus = [
        GPU.format(bus=f"00:{5 + i:02d}", bus2=f"{i:04d}", minor=m) for i, m in enumerate(minors)
    ]
    return head + "".join(gpus)


def print_config(
    tmp_path: Path, *args: str, smi: str | None = None, real_env: bool = False
) -> subprocess.CompletedProcess:
    env = {**os.environ, "GRPO_SLURM_MEM": "1000", "GRPO_SLURM_STATE": str(tmp_path / "state")}
    env.pop("GRPO_SLURM_REAL_GPUS", None)
    env.pop("GRPO_SLURM_GPUS", None)
    if real_env:
        env["GRPO_SLURM_REAL_GPUS"] = "1"
    if smi is not None:
        fake = tmp_path / "bin"
        fake.mkdir(exist_ok=True)
        (fake / "smi.txt").write_text(smi)
        script = fake / "nvidia-smi"
        script.write_text(f'#!/bin/sh\ncat "{fake / "smi.txt"}"\n')
        script.chmod(0o755)
        env["PATH"] = f"{fake}:{env['PATH']}"
    return subprocess.run(
        ["bash", str(UP), *args, "--print-config"], env=env, capture_output=True, text=True
    )


def files(out: str) -> dict[str, str]:
    """``==> /etc/slurm/NAME <==`` sections of --print-config's output."""
    parts: dict[str, str] = {}
    name = None
    for line in out.splitlines():
        if line.startswith("==> ") and line.endswith(" <=="):
            name = Path(line[4:-4]).name
            parts[name] = ""
        elif name:
            parts[name] += line + "\n"
    return parts


def node_line(slurm_conf: str) -> str:
    return next(x for x in slurm_conf.splitlines() if x.startswith("NodeName=localhost "))


def gres_lines(gres_conf: str) -> list[str]:
    return [x for x in gres_conf.splitlines() if x and not x.startswith("#")]


def test_real_gpus_one_gres_line_per_gpu(tmp_path: Path) -> None:
    proc = print_config(tmp_path, "--real-gpus", smi=smi_q(["0", "1"]))
    assert proc.returncode == 0, proc.stderr
    conf = files(proc.stdout)
    assert gres_lines(conf["gres.conf"]) == [
        "NodeName=localhost Name=gpu File=/dev/nvidia0",
        "NodeName=localhost Name=gpu File=/dev/nvidia1",
    ]
    assert "Gres=gpu:2 " in node_line(conf["slurm.conf"])
    assert "GresTypes=gpu" in conf["slurm.conf"].splitlines()
    assert "fakegpu" not in proc.stdout


def test_real_gpus_use_minor_numbers_not_positions(tmp_path: Path) -> None:
    # /dev/nvidiaN is named by the minor number, which need not follow nvidia-smi's order
    proc = print_config(tmp_path, "--real-gpus", smi=smi_q(["3", "1", "N/A"]))
    assert proc.returncode == 0, proc.stderr
    conf = files(proc.stdout)
    assert [x.split("File=")[1] for x in gres_lines(conf["gres.conf"])] == [
        "/dev/nvidia3",
        "/dev/nvidia1",
        "/dev/nvidia2",  # no minor number: its position
    ]
    assert "Gres=gpu:3 " in node_line(conf["slurm.conf"])


def test_env_switch_equals_flag(tmp_path: Path) -> None:
    smi = smi_q(["0", "1"])
    flag = print_config(tmp_path, "--real-gpus", smi=smi)
    env_on = print_config(tmp_path, smi=smi, real_env=True)
    assert env_on.returncode == 0, env_on.stderr
    assert env_on.stdout == flag.stdout


def test_no_gpu_in_nvidia_smi_fails(tmp_path: Path) -> None:
    proc = print_config(tmp_path, "--real-gpus", smi=smi_q([]))
    assert proc.returncode != 0
    assert "lists no GPU" in proc.stderr


def test_cpu_mode_keeps_the_fake_gpus(tmp_path: Path) -> None:
    # without --real-gpus nothing changes: 2 fake GPUs, whatever nvidia-smi says
    proc = print_config(tmp_path, smi=smi_q(["0", "1", "2", "3"]))
    assert proc.returncode == 0, proc.stderr
    conf = files(proc.stdout)
    assert gres_lines(conf["gres.conf"]) == ["NodeName=localhost Name=gpu File=/dev/fakegpu[0-1]"]
    assert "Gres=gpu:2 " in node_line(conf["slurm.conf"])
    template = (ROOT / "slurm" / "gres.conf.in").read_text()
    assert conf["gres.conf"] == template.replace("@GPU_FILES@", "/dev/fakegpu[0-1]")


def test_recorded_h200x2_output(tmp_path: Path) -> None:
    # nvidia-smi -q as the lent 2x H200 machine printed it (both GPUs' headers, trimmed)
    recorded = (ROOT / "tests" / "golden" / "nvidia-smi-q-h200x2.txt").read_text()
    proc = print_config(tmp_path, "--real-gpus", smi=recorded)
    assert proc.returncode == 0, proc.stderr
    conf = files(proc.stdout)
    assert gres_lines(conf["gres.conf"]) == [
        "NodeName=localhost Name=gpu File=/dev/nvidia0",
        "NodeName=localhost Name=gpu File=/dev/nvidia1",
    ]
    assert "Gres=gpu:2 " in node_line(conf["slurm.conf"])
