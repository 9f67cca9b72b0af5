"""A slow model load is not a stall: the real trainer's progress.json heartbeat advances
while it is still LOADING (faults.slow_load), so neither grpo-status nor the monitor takes
a long load from a busy filesystem for a hang."""

from __future__ import annotations

import time
from pathlib import Path

from grpo_hpc.core.progress import TrainState, read_progress

from ..slowdown import guard
from .helpers import make_run, training

SLOW_LOAD_S = 3.0
BEAT_S = 0.25


def test_heartbeat_advances_during_a_slow_load(tmp_path: Path) -> None:
    paths = make_run(
        tmp_path,
        "slowload",
        "training.max_steps=1",
        "training.save_final=false",
        f"training.setup_heartbeat_s={BEAT_S}",
        "faults.enabled=true",
        f"faults.slow_load={SLOW_LOAD_S}",
    )
    beats: set[float] = set()  # heartbeats seen while the state was LOADING
    left_loading = False
    with training(paths, timeout=180) as result:
        deadline = time.monotonic() + guard(120)
        while time.monotonic() < deadline:
            rec = read_progress(paths.progress)
            if rec is not None and rec.state is TrainState.LOADING:
                beats.add(rec.heartbeat)
            elif rec is not None:
                left_loading = True
                break
            time.sleep(0.05)
        done = result()
    assert done.returncode == 0, done.stderr[-3000:]
    assert left_loading
    # a beat every 0.25 s through a 3 s load: without the loading beat, the one heartbeat of
    # the LOADING record (a fresh run resumes nothing, so writes nothing else meanwhile)
    assert len(beats) >= 5, sorted(beats)
    assert max(beats) - min(beats) >= SLOW_LOAD_S / 2, sorted(beats)
    assert read_progress(paths.progress).state is TrainState.FINISHED
