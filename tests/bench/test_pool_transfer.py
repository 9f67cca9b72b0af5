"""bench/speed/pool_transfer.py on a small pool: both formats hand the pool over whole (the
benchmark asserts it), and the results name their command and sizes."""

from __future__ import annotations

import json
from pathlib import Path

from bench.speed import pool_transfer


def test_a_small_pool_is_handed_over_whole_in_both_formats(tmp_path: Path) -> None:
    out = tmp_path / "pool.json"
    assert (
        pool_transfer.main(["--rows", "16", "--tokens", "64", "--repeats", "1", "--out", str(out)])
        == 0
    )
    result = json.loads(out.read_text())
    assert result["command"].endswith("--rows 16 --tokens 64 --repeats 1")
    for name in ("packed", "lists"):
        assert result[name]["megabytes"] > 0 and result[name]["total_s"] > 0
    # int64 tokens and float64 log-probs: 16 bytes a token, 16 x 64 tokens
    assert result["packed"]["megabytes"] >= 16 * 64 * 16 / 1e6
