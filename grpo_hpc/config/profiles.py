"""Cluster profiles: what a cluster needs (resources, setup lines, precision).

A profile is a YAML file ``<name>.yaml`` in ``templates/`` (built in), in a user
directory (``$GRPO_HPC_PROFILES``, ``~/.config/grpo_hpc/profiles``) or given by
path. Its ``template`` names a Jinja2 file (next to the profile) that renders the
job's setup block: module loads, NCCL environment, anything before the job runs.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jinja2

from grpo_hpc.config.load import _data_dir, load_yaml_mapping
from grpo_hpc.core.errors import ConfigError
from grpo_hpc.core.paths import RunPaths


@dataclass
class Profile:
    name: str
    """Profile name (file stem)."""
    description: str = ""
    """One line shown by ``grpo-submit --list-profiles``."""
    executor: str = "slurm"
    """slurm (sbatch through submitit) or local (submitit's LocalExecutor, no Slurm)."""
    partition: str | None = None
    """Slurm partition (None: the cluster's default)."""
    account: str | None = None
    """Slurm account to charge."""
    qos: str | None = None
    """Slurm quality of service."""
    nodes: int = 1
    """Nodes per job; one task per node launches torchrun for that node."""
    link_gbps: float | None = None
    """Network bandwidth of each node to the others, Gb/s (None: not known). A multi-node
    ``--dry-run`` prints the scaling model's step and communication share on it
    (docs/scaling.md; 100 Gb/s assumed where it is not given)."""
    nodes_wait_s: float | None = None
    """Multi-node runs: how long grpo-monitor waits for a lost node to return before it
    resubmits the run on the nodes that are left (global batch kept, more accumulation per
    rank), and back on all ``nodes`` once they are up again (grpo_hpc/monitor/nodes.py).
    None (the default): a run always waits in the queue for its full allocation."""
    gpus_per_node: int = 0
    """GPUs per node (0 on CPU profiles)."""
    gpu_mem_gb: float | None = None
    """Memory of one GPU in GiB (None on CPU profiles): grpo-submit refuses a run whose
    estimated peak per GPU exceeds it (grpo_hpc.memory.estimate)."""
    gpu_capability: float | None = None
    """CUDA compute capability of the profile's GPUs (7.0 for a V100, 8.0 for an A100, 9.0
    for an H100; None: not known): grpo-submit refuses ``dist.precision=bf16`` below 8.0
    before anything queues (a V100 has no bf16 arithmetic), and its memory estimate counts
    compiled layers from 8.0 up, where ``dist.compile=auto`` compiles them."""
    allow_cpu_offload: bool = False
    """grpo-submit may turn on FSDP2 optimizer CPU offload to fit a run (needs ~16 bytes of
    host memory per parameter on the node, and costs a CPU optimizer step)."""
    gres: str | None = None
    """Explicit --gres (e.g. gpu:volta:2); default gpu:<gpus_per_node> when GPUs are asked."""
    nproc_per_node: int = 0
    """torchrun processes per node; 0 = gpus_per_node (or 1 without GPUs)."""
    cpus_per_task: int = 2
    """CPUs for the node's task (all torchrun workers share them)."""
    mem_gb: float | None = None
    """Memory per node in GB (None: the cluster's default)."""
    time_min: int = 60
    """Time limit in minutes."""
    signal_lead_s: int = 120
    """Seconds before the time limit at which the warning signal asks the trainer to
    checkpoint (slurmctld may deliver it up to 30 s earlier)."""
    precision: str = "fp32"
    """fp32, bf16 or fp16 (V100 has no bf16)."""
    strategy: str = "ddp"
    """ddp or fsdp."""
    attn_implementation: str = "sdpa"
    """sdpa, eager or flash_attention_2 (falls back to sdpa when flash-attn is missing)."""
    compile: bool = False
    """torch.compile the model."""
    template: str = "setup.sh.j2"
    """Jinja2 template (next to the profile) rendering the job's setup lines."""
    modules: list[str] = field(default_factory=list)
    """Environment modules to load (``module load``), used by the template."""
    env: dict[str, str] = field(default_factory=dict)
    """Environment variables exported before launch."""
    sbatch_extra: dict[str, str] = field(default_factory=dict)
    """Extra sbatch options (name without dashes -> value)."""
    torch_check: str = "submit"
    """Where the torch's kernels for the GPUs (``gpu_capability``) are checked: ``submit``,
    grpo-submit checks the torch it runs with, which the job runs too; ``job``, the
    profile's ``modules:`` or setup lines load another torch in the job: grpo-submit
    does not check its own, and the job checks the torch it imports before training
    (exit 2, never resubmitted, when it has no kernels for its GPUs). docs/profiles.md."""
    path: str = ""
    """Where the profile was read from."""

    @property
    def procs_per_node(self) -> int:
        return self.nproc_per_node or max(1, self.gpus_per_node)

    @property
    def gpus_requested(self) -> int:
        """GPUs per node the job asks for: ``gpus_per_node``, else the count its ``gres``
        names (``gpu:2``, ``gpu:volta:2``; a bare ``gpu`` or ``gpu:volta``: 1)."""
        if self.gpus_per_node or not self.gres:
            return self.gpus_per_node
        return sum(_gres_gpus(item) for item in str(self.gres).split(","))

    @property
    def capability(self) -> tuple[int, int] | None:
        """``gpu_capability`` as (major, minor), e.g. 7.0 -> (7, 0); None where the profile
        asks for no GPUs (by ``gpus_per_node`` or ``gres``) or does not say."""
        if self.gpu_capability is None or not self.gpus_requested:
            return None
        return divmod(round(self.gpu_capability * 10), 10)

    @property
    def gres_value(self) -> str | None:
        if self.gres:
            return self.gres
        return f"gpu:{self.gpus_per_node}" if self.gpus_per_node else None


def _gres_gpus(item: str) -> int:
    """GPUs in one ``--gres`` item (Slurm's ``name[:type][:count]``): 0 for other
    resources."""
    parts = item.strip().split("(")[0].split(":")
    if parts[0] != "gpu":
        return 0
    return int(parts[-1]) if len(parts) > 1 and parts[-1].isdigit() else 1


TORCH_CHECKS = ("submit", "job")
"""Where a profile's torch is checked (``torch_check``)."""


def profile_dirs() -> list[Path]:
    """Search order: $GRPO_HPC_PROFILES (colon-separated), user dir, built-in templates/."""
    dirs = [Path(p) for p in os.environ.get("GRPO_HPC_PROFILES", "").split(":") if p]
    dirs.append(Path.home() / ".config" / "grpo_hpc" / "profiles")
    dirs.append(_data_dir("templates"))
    return dirs


def known_profiles() -> list[str]:
    names: set[str] = set()
    for d in profile_dirs():
        if d.is_dir():
            names.update(p.stem for p in d.glob("*.yaml"))
    return sorted(names)


def find_profile(name_or_path: str) -> Path:
    if name_or_path.endswith((".yaml", ".yml")) or "/" in name_or_path:
        path = Path(name_or_path).expanduser()
        if not path.is_file():
            raise ConfigError(f"profile file {str(path)!r} does not exist: check the path")
        return path
    for d in profile_dirs():
        candidate = d / f"{name_or_path}.yaml"
        if candidate.is_file():
            return candidate
    raise ConfigError(
        f"unknown profile {name_or_path!r}: known profiles are {', '.join(known_profiles())}; "
        "or pass --profile path/to/profile.yaml"
    )


def load_profile(name_or_path: str) -> Profile:
    path = find_profile(name_or_path)
    data = load_yaml_mapping(path, what="profile")
    return profile_from_dict(data, name=path.stem, path=path)


def profile_from_dict(data: dict[str, Any], name: str, path: Path | None = None) -> Profile:
    fields = {f.name for f in dataclasses.fields(Profile)}
    unknown = sorted(set(data) - fields)
    if unknown:
        raise ConfigError(
            f"profile {name!r} has unknown key(s) {', '.join(unknown)}: "
            f"allowed keys are {', '.join(sorted(fields - {'name', 'path'}))}"
        )
    try:
        prof = Profile(**{**data, "name": name, "path": str(path or "")})
    except TypeError as e:
        raise ConfigError(f"profile {name!r} is malformed: {e}") from None
    _validate(prof)
    return prof


NUMBER_KEYS = {"gpu_mem_gb": "80", "gpu_capability": "7.0", "mem_gb": "64", "nodes_wait_s": "900",
               "link_gbps": "200"}  # fmt: skip
"""Profile keys that hold a number (or are left out), each with an example value."""


def _number_problem(p: Profile) -> str | None:
    """A number key whose YAML value is not a number (``gpu_capability: "7.0"``, quoted,
    reads as a string): refused rather than parsed, as the comparisons and the rounding of
    :attr:`Profile.capability` need a number."""
    for key, example in NUMBER_KEYS.items():
        value = getattr(p, key)
        if value is None or (isinstance(value, (int, float)) and not isinstance(value, bool)):
            continue
        return f"{key} must be a number, written unquoted ({key}: {example}), not {value!r}"
    return None


def _validate(p: Profile) -> None:
    number = _number_problem(p)
    if number:  # before the checks below, which compare these keys with numbers
        raise ConfigError(f"profile {p.name!r}: {number} (in {p.path or 'profile'})")
    checks = [
        (p.executor in ("slurm", "local"), "executor must be slurm or local"),
        (p.precision in ("fp32", "bf16", "fp16"), "precision must be fp32, bf16 or fp16"),
        (p.strategy in ("ddp", "fsdp"), "strategy must be ddp or fsdp"),
        (
            p.attn_implementation in ("sdpa", "eager", "flash_attention_2"),
            "attn_implementation must be sdpa, eager or flash_attention_2",
        ),
        (isinstance(p.nodes, int) and p.nodes >= 1, "nodes must be an integer >= 1"),
        (p.link_gbps is None or p.link_gbps > 0, "link_gbps must be > 0 (or left out)"),
        (
            p.nodes_wait_s is None or p.nodes_wait_s >= 0,
            "nodes_wait_s must be a number of seconds >= 0 (or left out: off)",
        ),
        (p.gpu_mem_gb is None or p.gpu_mem_gb > 0, "gpu_mem_gb must be > 0 (or left out)"),
        (
            p.gpu_capability is None or p.gpu_capability > 0,
            "gpu_capability must be > 0, e.g. 7.0 for a V100 (or left out)",
        ),
        (isinstance(p.time_min, int) and p.time_min >= 1, "time_min must be an integer >= 1"),
        (0 <= p.signal_lead_s < p.time_min * 60, "signal_lead_s must be below the time limit"),
        (p.executor == "slurm" or p.nodes == 1, "the local executor runs one node only"),
        (p.torch_check in TORCH_CHECKS, "torch_check must be submit or job"),
    ]
    for ok, msg in checks:
        if not ok:
            raise ConfigError(f"profile {p.name!r}: {msg} (in {p.path or 'profile'})")


def render_setup(profile: Profile, context: dict[str, Any]) -> list[str]:
    """Render the profile's Jinja2 setup template into shell lines.

    Undefined variables are errors (StrictUndefined): a typo in a template fails at
    submission, not as an empty string on the compute node.
    """
    search = [str(d) for d in _template_dirs(profile)]
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(search),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=False,
        autoescape=False,
    )
    try:
        template = env.get_template(profile.template)
        text = template.render(profile=profile, **context)
    except jinja2.TemplateNotFound:
        raise ConfigError(
            f"profile {profile.name!r}: template {profile.template!r} not found in "
            f"{', '.join(search)}: create it or fix the profile's 'template' key"
        ) from None
    except jinja2.TemplateError as e:
        raise ConfigError(f"profile {profile.name!r}: template {profile.template!r}: {e}") from None
    return [line for line in text.splitlines() if line.strip()]


def _template_dirs(profile: Profile) -> list[Path]:
    """Where a profile's template is looked up: next to the profile (for a run's stored
    profile: the run directory), then the built-in templates/."""
    base = Path(profile.path).parent if profile.path else _data_dir("templates")
    return [base, _data_dir("templates")]


def template_file(profile: Profile) -> Path | None:
    """The file the profile's template is read from (None when there is none)."""
    return next((d / profile.template for d in _template_dirs(profile)
                 if (d / profile.template).is_file()), None)  # fmt: skip


def profile_to_dict(profile: Profile) -> dict[str, Any]:
    """What a run directory's ``profile.yaml`` holds (the profile, less where it came from)."""
    return {k: v for k, v in dataclasses.asdict(profile).items() if k != "path"}


def load_run_profile(paths: RunPaths) -> Profile:
    """The profile stored in the run directory (what every resubmission uses); its template
    is the copy kept beside it (runs made before that copy: the built-in templates/)."""
    data = load_yaml_mapping(paths.profile, what="run profile")
    return profile_from_dict(data, name=str(data.pop("name", "run")), path=str(paths.profile))
