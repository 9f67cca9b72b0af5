"""What each rank's GPU is, as every decision of the trainer sees it: its compute capability
and its memory, read here and nowhere else under ``train/``.

``GRPO_HPC_EMULATE_GPU=MAJOR.MINOR:GIB`` (e.g. ``7.0:32``, a V100 32 GB) makes an older,
smaller GPU of the real one: every decision that asks for the capability gets the emulated
one (``auto`` compile and packing, the bf16 refusal, ``algo.micro_batch_tokens=auto``, the
native engine's attention path), the memory decisions get ``GIB``, and :func:`emulate`
caps this process's caching allocator at ``GIB`` with
``torch.cuda.set_per_process_memory_fraction``. So the supercloud profile's V100
code path run on a lent H100/H200 (``bench/supercloud-emulated.yaml``). What it cannot
change is the kernels: they are the real GPU's (docs/profiles.md says what that leaves
unproven).

The parsing and the check against the real GPU are pure (:func:`parse_emulation`,
:func:`emulation_problem`); the rest is the thin shell that reads torch and the environment.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

import torch

from grpo_hpc.core.errors import ConfigError

EMULATE_ENV = "GRPO_HPC_EMULATE_GPU"
GIB = 2**30
_VALUE = re.compile(r"^(\d+)\.(\d):(\d+(?:\.\d+)?)$")


@dataclass(frozen=True)
class Emulated:
    """The GPU ``GRPO_HPC_EMULATE_GPU`` names."""

    capability: tuple[int, int]
    gib: float

    def said(self) -> str:
        """``7.0:32``, as the variable is written."""
        return f"{self.capability[0]}.{self.capability[1]}:{self.gib:g}"


def parse_emulation(text: str | None) -> Emulated | None:
    """``"7.0:32"`` -> Emulated((7, 0), 32.0); unset or empty -> None; anything else is a
    ConfigError of one line (a typo must not train silently on the real GPU's settings)."""
    if text is None or not text.strip():
        return None
    m = _VALUE.match(text.strip())
    if m is None or float(m.group(3)) <= 0:
        raise ConfigError(
            f"{EMULATE_ENV}={text!r}: expected CAPABILITY:GIB, a compute capability and a "
            "memory in GiB, e.g. 7.0:32 (a V100 32 GB); unset it to use the real GPU"
        )
    return Emulated((int(m.group(1)), int(m.group(2))), float(m.group(3)))


def emulation_problem(
    emulated: Emulated, real: tuple[int, int], real_gib: float, name: str
) -> str | None:
    """One line when the real GPU cannot stand in for ``emulated``, else None: a newer
    capability would pick kernels the real GPU may lack, and a cap cannot add memory."""
    if emulated.capability > real:
        return (
            f"{EMULATE_ENV}={emulated.said()}: {name} is compute capability "
            f"{real[0]}.{real[1]}, older than the emulated one: only an older GPU can be emulated"
        )
    if emulated.gib > real_gib:
        return (
            f"{EMULATE_ENV}={emulated.said()}: {name} has {real_gib:.1f} GiB, less than the "
            "emulated memory: only a smaller GPU can be emulated"
        )
    return None


def emulation() -> Emulated | None:
    """The GPU this process emulates (``GRPO_HPC_EMULATE_GPU``), or None."""
    return parse_emulation(os.environ.get(EMULATE_ENV))


def capability(device: torch.device) -> tuple[int, int]:
    """The compute capability every decision is made for (a CUDA ``device``): the
    emulated one where ``GRPO_HPC_EMULATE_GPU`` names one, else the device's."""
    emulated = emulation()
    return emulated.capability if emulated else torch.cuda.get_device_capability(device)


def _real_gib(device: torch.device) -> float:
    return torch.cuda.get_device_properties(device).total_memory / GIB


def total_gib(device: torch.device) -> float:
    """The GPU memory (GiB) every decision is made for (a CUDA ``device``): the emulated
    one where ``GRPO_HPC_EMULATE_GPU`` names one, else the device's."""
    emulated = emulation()
    real = _real_gib(device)
    return min(real, emulated.gib) if emulated else real


def cap_memory(device: torch.device, gib: float) -> None:
    """Let this process's caching allocator hold at most ``gib`` GiB of ``device`` (the
    fraction torch takes is of the real GPU's memory, whatever is emulated)."""
    torch.cuda.set_per_process_memory_fraction(min(1.0, gib / _real_gib(device)), device)


def emulate(device: torch.device) -> str | None:
    """Under ``GRPO_HPC_EMULATE_GPU``: check the real GPU can stand in (ConfigError if
    not), cap the allocator at the emulated memory and return the line the log says;
    None without the variable."""
    emulated = emulation()
    if emulated is None:
        return None
    if device.type != "cuda":
        return f"[Device] {EMULATE_ENV}={emulated.said()} ignored: this process has no GPU"
    real, real_gib = torch.cuda.get_device_capability(device), _real_gib(device)
    name = torch.cuda.get_device_name(device)
    if why := emulation_problem(emulated, real, real_gib, name):
        raise ConfigError(why)
    cap_memory(device, emulated.gib)
    major, minor = emulated.capability
    return (
        f"[Device] {EMULATE_ENV}={emulated.said()}: every decision is made for compute "
        f"capability {major}.{minor} on the real {name} (compute capability "
        f"{real[0]}.{real[1]}, {real_gib:.1f} GiB), its allocator capped at "
        f"{emulated.gib:g} GiB; the kernels are the real GPU's"
    )
