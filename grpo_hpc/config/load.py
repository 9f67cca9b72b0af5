"""Loading a run configuration: schema defaults <- a YAML file (a built-in name or a
path) <- dotted overrides, then :func:`grpo_hpc.config.validate.validate`.

Loading and merging use OmegaConf structured configs (what NeMo RL and torchtune
users know): the dataclasses of :mod:`grpo_hpc.config.schema` are the schema, OmegaConf gives
typed dotted overrides (``training.max_steps=100``) and rejects unknown keys and wrong
types. We only add what OmegaConf lacks: one-line errors with a "did you mean"
suggestion, the ``--a.b=v`` spelling, and config lookup by name.
"""

from __future__ import annotations

import copy
import difflib
import functools
import sys
from pathlib import Path
from typing import Any

import yaml
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from grpo_hpc.config.schema import Config
from grpo_hpc.config.validate import validate
from grpo_hpc.core.errors import ConfigError


def _data_dir(name: str) -> Path:
    """``templates/`` or ``configs/``: from the source tree, else the installed share dir."""
    repo = Path(__file__).resolve().parents[2] / name
    if repo.is_dir():
        return repo
    return Path(sys.prefix) / "share" / "grpo_hpc" / name


def configs_dir() -> Path:
    return _data_dir("configs")


def builtin_configs() -> list[str]:
    return sorted(p.stem for p in configs_dir().glob("*.yaml"))


def resolve_config_path(name_or_path: str) -> Path:
    """A built-in config name (``tiny``) or a path to a YAML file."""
    builtin = configs_dir() / f"{name_or_path}.yaml"
    if "/" not in name_or_path and not name_or_path.endswith((".yaml", ".yml")):
        if builtin.is_file():
            return builtin
        raise ConfigError(
            f"unknown config {name_or_path!r}: built-in configs are "
            f"{', '.join(builtin_configs())}; or pass a path to a YAML file"
        )
    path = Path(name_or_path).expanduser()
    if not path.is_file():
        raise ConfigError(f"config file {str(path)!r} does not exist: check the path")
    return path


def load_yaml_mapping(path: Path, what: str = "config") -> dict[str, Any]:
    """Read a YAML mapping with a one-line error for unreadable or non-mapping files."""
    return _yaml_mapping(_read_text(path, what), path, what)


def _read_text(path: Path, what: str) -> str:
    try:
        return Path(path).read_text(encoding="utf-8")
    except OSError as e:
        raise ConfigError(f"cannot read {what} {str(path)!r}: {e.strerror}") from None


def _yaml_mapping(text: str, path: Path, what: str) -> dict[str, Any]:
    """``text`` (read from ``path``) as a YAML mapping, or a one-line error."""
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark is not None else ""
        raise ConfigError(
            f"{what} {str(path)!r} is not valid YAML{where}: fix the syntax there"
        ) from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{what} {str(path)!r} must be a YAML mapping (key: value lines)")
    return data


def normalize_overrides(args: list[str]) -> list[str]:
    """Accept ``--a.b=v`` and ``a.b=v``; return ``a.b=v`` strings."""
    out = []
    for arg in args:
        item = arg[2:] if arg.startswith("--") else arg
        key, sep, _ = item.partition("=")
        if not sep or not key or not all(part.isidentifier() for part in key.split(".")):
            raise ConfigError(
                f"cannot read override {arg!r}: write it as section.key=value, "
                "e.g. training.max_steps=100"
            )
        out.append(item)
    return out


def _all_keys(node: Any, prefix: str = "") -> list[str]:
    keys: list[str] = []
    for k, v in node.items():
        full = f"{prefix}{k}"
        keys.append(full)
        if OmegaConf.is_dict(v):
            keys.extend(_all_keys(v, full + "."))
    return keys


def _explain(e: OmegaConfBaseException, schema: Any) -> str:
    key = getattr(e, "full_key", "") or ""
    msg = str(e).splitlines()[0]
    if type(e).__name__ == "ConfigKeyError" or "not in" in msg:
        bad = key or msg
        near = difflib.get_close_matches(bad, _all_keys(schema), n=1, cutoff=0.5)
        hint = f": did you mean {near[0]!r}?" if near else ": see `grpo-submit --help`"
        return f"unknown config key {bad!r}{hint}"
    if "Value '" in msg or "could not be converted" in msg or "Invalid type" in msg:
        return f"wrong value type for {key!r}: {msg}"
    return f"invalid config{f' at {key!r}' if key else ''}: {msg}"


def build_config(source: str | Path | None, overrides: list[str] | None = None) -> Config:
    """Schema defaults <- YAML file <- dotted overrides, then validation."""
    data = None
    if source is not None:
        path = source if isinstance(source, Path) else resolve_config_path(source)
        data = load_yaml_mapping(path)
    return _merged(data, overrides)


def _merged(data: dict[str, Any] | None, overrides: list[str] | None) -> Config:
    """Schema defaults <- ``data`` (a YAML file's mapping) <- dotted overrides, validated."""
    schema = OmegaConf.structured(Config)
    layers = [schema]
    if data is not None:
        layers.append(OmegaConf.create(data))
    try:
        if overrides:
            layers.append(OmegaConf.from_dotlist(normalize_overrides(overrides)))
        merged = OmegaConf.merge(*layers)
        cfg: Config = OmegaConf.to_object(merged)  # type: ignore[assignment]
    except OmegaConfBaseException as e:
        raise ConfigError(_explain(e, schema)) from None
    validate(cfg)
    return cfg


def load_resolved(path: Path) -> Config:
    """Read the resolved config of a run directory (written once by grpo-submit).

    Merged through OmegaConf once per text in a process (~0.1 s of CPU each time; a
    trainer reads its run's config at the start and twice more writing ``final/``), and
    handed out as a copy, which its caller may change."""
    path = Path(path)
    return copy.deepcopy(_resolved(_read_text(path, "config"), path))


@functools.lru_cache(maxsize=8)
def _resolved(text: str, path: Path) -> Config:
    """The config ``text`` (read from ``path``) holds; keyed by the text itself, so a file
    written again is merged again (an exception is not cached)."""
    return _merged(_yaml_mapping(text, path, "config"), None)


def to_yaml(cfg: Config) -> str:
    return OmegaConf.to_yaml(OmegaConf.structured(cfg))
