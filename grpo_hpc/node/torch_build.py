"""Whether the installed torch carries kernels for a profile's GPUs, asked on the login node.

A torch without kernels for the GPU fails at its first CUDA op with ``no kernel image is
available for execution on the device``: on a cluster that is after the queue wait, at
step 0. ``torch.cuda.get_arch_list()`` names the architectures a build was compiled for;
it answers without a GPU only since pytorch/pytorch#180356 (2026-04, ``_is_compiled()``
instead of ``is_available()``): older releases, 2.11 among them, return ``[]`` on a
GPU-less login node, so the shell below falls back to the call underneath it,
``torch._C._cuda_getArchFlags()`` (there since 1.6, pytorch/pytorch#41173).

The rule (:func:`runs_on`) is pure; :func:`installed_build` is the thin shell that reads
torch, and imports it only when torch/version.py says it is a CUDA build (a CPU build, as
on this project's CI, answers from that file alone), so a login-node command loads no
torch it does not need.
"""

from __future__ import annotations

import ast
import importlib.metadata
import importlib.util
import os
import re
from dataclasses import dataclass
from pathlib import Path

ARCH_LIST_ENV = "GRPO_HPC_TORCH_ARCH_LIST"
"""Test/diagnostic override: the arch list as ``sm_80 sm_90`` (space or comma separated),
read instead of torch's; its CUDA version is ``GRPO_HPC_TORCH_CUDA`` (default ``12.8``; set
empty for a CPU build). Meant for tests (CI has a CPU torch) and for asking "would this
build's list do?"; it replaces the check's input, so every check made with it says so
(:func:`note`): a leftover one never passes silently. A job whose torch is not the login
node's says so in its profile (``torch_check: job``), not with this."""
CUDA_ENV = "GRPO_HPC_TORCH_CUDA"

# PyTorch's CUDA support matrix (RELEASE.md): for 2.11 the CUDA 12.8 builds dropped Volta
# (7.0) and the CUDA 13 builds never had it; the CUDA 12.6 builds keep Maxwell (5.0)
# through Hopper (9.0), Volta included. Sources: RFC pytorch/pytorch#172352, PR #175253
# (2.11 matrix), PR #182849 (2.12: 12.6.3 still lists Volta; 12.8 gone), PR #197555 (2.12,
# 2.13 and 2.14 share that matrix). 2.14 is the last release with CUDA 12.6 wheels (RFC
# #190385; dev-discuss "Notice: CUDA 12.6 wheels will no longer be published from PyTorch
# 2.15"), hence the pin below: without it a later upgrade from PyPI lands on a build with
# no Volta. Every CUDA build of 2.11 on (12.8, 13.0, 13.2) starts at Turing (7.5), so a
# GPU of 7.5 or newer is served by the default index. The index URL form is pytorch.org's
# "previous versions" page.
PRE_TURING_CUDA = "12.6"
"""The CUDA version of the last torch builds with kernels for GPUs older than Turing."""
PRE_TURING_INDEX = "https://download.pytorch.org/whl/cu126"
"""Where those builds are published."""
PRE_TURING_PIN = "torch<2.15"
"""The last release line with CUDA 12.6 wheels is 2.14 (RFC pytorch/pytorch#190385)."""
PRE_TURING_MIN_CAPABILITY = (5, 0)
"""The oldest GPU generation the CUDA 12.6 builds carry (Maxwell)."""
DEFAULT_MIN_CAPABILITY = (7, 5)
"""From here up (Turing on), the default index's CUDA build has kernels (2.11 on)."""

_ARCH = re.compile(r"^(sm|compute)_(\d+)([a-z]?)$")


@dataclass(frozen=True)
class TorchBuild:
    """What the installed torch was compiled for."""

    version: str
    """``torch.__version__``, e.g. ``2.11.0+cu128``."""
    cuda: str | None
    """``torch.version.cuda`` (None: a CPU build)."""
    arch_list: tuple[str, ...]
    """``torch.cuda.get_arch_list()``, e.g. ``('sm_75', 'sm_80', 'compute_120')``."""
    hip: str | None = None
    """``torch.version.hip`` (a ROCm build: AMD GPUs, no CUDA kernels); None otherwise."""
    overridden: bool = False
    """Read from ``$GRPO_HPC_TORCH_ARCH_LIST``, not from the installed torch."""


def _parse(entry: str) -> tuple[str, int, int, str] | None:
    """``sm_86`` -> ('sm', 8, 6, ''); ``sm_90a`` -> ('sm', 9, 0, 'a'); None if unreadable."""
    m = _ARCH.match(entry.strip().lower())
    if m is None or len(m.group(2)) < 2:
        return None
    digits = m.group(2)
    return m.group(1), int(digits[:-1]), int(digits[-1]), m.group(3)


def runs_on(arch_list: list[str] | tuple[str, ...], capability: tuple[int, int]) -> bool:
    """Whether a build compiled for ``arch_list`` has code a GPU of ``capability`` runs.

    A GPU of compute capability (M, m) runs a cubin ``sm_Mn`` with n <= m (binary
    compatibility holds within one major version only: a 7.0 cubin runs on 7.5, never a
    7.5 cubin on 7.0, nor an 8.0 one on 9.0) and PTX ``compute_XY`` with XY <= Mm (the
    driver compiles PTX just in time for any newer GPU). Source: NVIDIA's CUDA C++
    Programming Guide, "Binary Compatibility" ("a cubin generated for compute capability
    X.y will only execute on devices of compute capability X.z where z >= y") and "PTX
    Compatibility"/"Just-in-Time Compilation". An arch-specific ``sm_90a`` runs on exactly
    9.0 (the guide's "Feature Availability"); a family-specific ``f`` entry is treated as a
    plain cubin of its version.
    """
    major, minor = capability
    for entry in arch_list:
        parsed = _parse(entry)
        if parsed is None:
            continue
        kind, a_major, a_minor, suffix = parsed
        if kind == "compute":
            if (a_major, a_minor) <= (major, minor):
                return True
        elif suffix == "a":
            if (a_major, a_minor) == (major, minor):
                return True
        elif a_major == major and a_minor <= minor:
            return True
    return False


def fix_for(capability: tuple[int, int]) -> str:
    """What to install instead, for a GPU of ``capability`` (one clause, with the command)."""
    if capability >= DEFAULT_MIN_CAPABILITY:
        return "install PyPI's CUDA build of torch (Turing, 7.5, and newer): pip install torch"
    if capability >= PRE_TURING_MIN_CAPABILITY:
        return (
            f"install a CUDA {PRE_TURING_CUDA} build of torch, the only one with kernels for "
            f"{capability[0]}.{capability[1]}: "
            f'pip install "{PRE_TURING_PIN}" --index-url {PRE_TURING_INDEX}'
        )
    return "no published torch build has kernels for this GPU: build torch from source"


def arch_problem(build: TorchBuild, capability: tuple[int, int], profile: str) -> str | None:
    """The one-line refusal when ``build`` has no code for the profile's GPUs, else None.

    A CPU build is refused too: the job runs the very interpreter ``grpo-submit`` runs in
    (``sys.executable``), so a CPU torch here is the torch on the GPU nodes. A CUDA build
    with an empty arch list (an unusual install) is not refused, only noted (:func:`note`).
    """
    cap = f"{capability[0]}.{capability[1]}"
    if build.cuda is None:
        kind = f"a ROCm (HIP {build.hip}) build" if build.hip else "a CPU-only build"
        return (
            f"profile {profile!r}: the installed torch {build.version} is {kind} and "
            f"the job runs this same Python on GPUs of compute capability {cap}: "
            f"{fix_for(capability)}"
        )
    if not build.arch_list or runs_on(build.arch_list, capability):
        return None
    return (
        f"profile {profile!r}: its GPUs (compute capability {cap}) cannot run the installed "
        f"torch {build.version} (CUDA {build.cuda}, built for {' '.join(build.arch_list)}); "
        f"the job would fail at its first kernel: {fix_for(capability)}"
    )


def note(build: TorchBuild | None) -> str | None:
    """The informational line where nothing could be checked (no torch found, a CUDA
    torch that lists no architectures) or where the check read ``$GRPO_HPC_TORCH_ARCH_LIST``
    instead of the installed torch, else None (a CPU build is refused instead)."""
    if build is not None and build.overridden:
        return (
            f"torch: checked against ${ARCH_LIST_ENV}={' '.join(build.arch_list) or '(empty)'} "
            f"(CUDA {build.cuda or 'none'}), not the installed torch: unset it to check that one"
        )
    if build is None:
        return "torch: not installed here: the compute nodes' torch is not checked"
    if build.cuda is not None and not build.arch_list:
        return (
            f"torch: {build.version} lists no CUDA architectures without a GPU: the "
            "compute nodes' torch is not checked"
        )
    return None


def split_arch_list(text: str) -> tuple[str, ...]:
    """``"sm_80 sm_90"`` or ``"sm_80,sm_90"`` -> ('sm_80', 'sm_90')."""
    return tuple(e for e in re.split(r"[\s,;]+", text) if e)


def _version_file_cuda(version_py: Path) -> tuple[str | None, str | None, str | None]:
    """(``__version__``, ``cuda``, ``hip``) read from torch/version.py without importing
    torch."""
    found: dict[str, str | None] = {}
    for node in ast.parse(version_py.read_text(encoding="utf-8")).body:
        target = node.target if isinstance(node, ast.AnnAssign) else None
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target = node.targets[0]
        if isinstance(target, ast.Name) and isinstance(node.value, ast.Constant):
            found[target.id] = node.value.value
    return found.get("__version__"), found.get("cuda"), found.get("hip")


def installed_build() -> TorchBuild | None:
    """The installed torch's build (None: no torch here). ``GRPO_HPC_TORCH_ARCH_LIST``
    overrides it (tests, and a user asking "would this arch list do?")."""
    override = os.environ.get(ARCH_LIST_ENV)
    if override is not None:
        cuda = os.environ.get(CUDA_ENV, "12.8")
        arch = split_arch_list(override)
        return TorchBuild(f"from ${ARCH_LIST_ENV}", cuda or None, arch, overridden=True)
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        return None
    version_py = Path(next(iter(spec.submodule_search_locations))) / "version.py"
    try:
        version, cuda, hip = _version_file_cuda(version_py)
    except (OSError, SyntaxError):  # an unusual install: ask torch itself
        version, cuda, hip = None, "unknown", None
    if cuda is None:  # a CPU or ROCm build: nothing to import torch for
        return TorchBuild(version or importlib.metadata.version("torch"), None, (), hip=hip)
    import torch  # a CUDA build: only torch itself knows its arch list

    arch_list = torch.cuda.get_arch_list()
    if not arch_list and torch.version.cuda:  # a torch before #180356, on a GPU-less node
        try:
            arch_list = (torch._C._cuda_getArchFlags() or "").split()
        except (AttributeError, RuntimeError):
            arch_list = []  # not checked: note() says so
    return TorchBuild(torch.__version__, torch.version.cuda, tuple(arch_list))
