"""bench/learning/pool.py: paired differences pooled over result files (the 20-seed sets of
one comparison run on different days), on real files written here."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.learning import pool


def _run(seed: int, accuracy: float) -> dict:
    return {"seed": seed, "evals": [{"step": 40, "s": 1.0, "accuracy": accuracy}], "steps": []}


def _file(path: Path, systems: dict[str, list[tuple[int, float]]]) -> Path:
    data = {"systems": {k: [_run(s, a) for s, a in v] for k, v in systems.items()}}
    path.write_text(json.dumps(data))
    return path


def test_pairs_across_files_and_per_file(tmp_path: Path) -> None:
    # day 1: both systems on seeds 1-2; day 2: the base on 3-4, the other in a third file
    one = _file(tmp_path / "one.json", {"a": [(1, 0.5), (2, 0.5)], "b": [(1, 0.7), (2, 0.9)]})
    two = _file(tmp_path / "two.json", {"a": [(3, 0.6), (4, 0.6)]})
    three = _file(tmp_path / "three.json", {"b": [(3, 0.5), (4, 0.3)], "c": [(9, 0.1)]})
    runs = pool.gather([one, two, three])
    lines = pool.pair_lines(runs, "a", "b")
    # differences +0.2, +0.4, -0.1, -0.3: mean +0.05 over 4 seeds
    assert lines[0].startswith("b - a: +0.050 ± ")
    assert "over 4 paired seeds (2 higher, 2 lower)" in lines[0]
    assert lines[1].startswith("  seeds 1-2: +0.300 ± 0.100 (2 higher, 0 lower) one")
    assert lines[2].startswith("  seeds 3-4: -0.200 ± 0.100 (0 higher, 2 lower) three")
    assert pool.pair_lines(runs, "a", "c") == ["c - a: no seed run by both"]
    assert pool.pair_lines(runs, "a", "z") == ["z - a: no runs of z"]


def test_a_seed_run_twice_by_one_system_is_refused(tmp_path: Path, capsys) -> None:
    one = _file(tmp_path / "one.json", {"a": [(1, 0.5)], "b": [(1, 0.6)]})
    again = _file(tmp_path / "again.json", {"a": [(1, 0.9)]})
    with pytest.raises(ValueError, match="a ran seed 1 twice"):
        pool.gather([one, again])
    with pytest.raises(SystemExit) as e:
        pool.main(["--pair", "a", "b", str(one), str(again)])
    assert e.value.code == 2 and "twice" in capsys.readouterr().err
    assert pool.main(["--pair", "a", "b", str(one)]) == 0
    assert capsys.readouterr().out.startswith("b - a: +0.100 ± 0.000 over 1 paired seeds")
