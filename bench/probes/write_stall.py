"""Does a small file write stall while the same filesystem writes and syncs large files?

The question behind a real run's slow steps on rank 0: the trainer's rank 0 rewrites
``progress.json`` (temp file + rename) several times a step and appends to
``metrics.jsonl``, while checkpoints of ~1.6 GB are written, fsynced and deleted every few
steps. This probe does both in one process: a background thread writes ``--files`` files
of ``--mb`` MiB (each fsynced, the previous one deleted, ``--pause`` s apart) while the
main thread times one progress-style write (``atomic_write_json``, synced or not) plus one
JSONL append every 50 ms, and prints every one slower than 20 ms.

    python -m bench.probes.write_stall --dir /tmp/stall [--sync] [--mb 800 --files 3]
"""

from __future__ import annotations

import argparse
import os
import threading
import time
from pathlib import Path

from grpo_hpc.core.fsutil import append_jsonl, atomic_write_json


def big_writes(folder: Path, mb: int, files: int, pause: float) -> None:
    for k in range(files):
        with open(folder / f"big{k}.bin", "wb") as f:
            for _ in range(mb):
                f.write(os.urandom(1 << 20))
            f.flush()
            os.fsync(f.fileno())
        if k:
            (folder / f"big{k - 1}.bin").unlink()
        time.sleep(pause)
    (folder / f"big{files - 1}.bin").unlink()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dir", type=Path, required=True, help="a folder on the filesystem to try")
    p.add_argument("--mb", type=int, default=800, help="size of each large file (MiB)")
    p.add_argument("--files", type=int, default=3, help="large files, one after the other")
    p.add_argument("--pause", type=float, default=4.0, help="seconds between large files")
    p.add_argument("--sync", action="store_true", help="fsync the small write too")
    p.add_argument("--seconds", type=float, default=40.0, help="how long to time small writes")
    a = p.parse_args()
    a.dir.mkdir(parents=True, exist_ok=True)
    th = threading.Thread(target=big_writes, args=(a.dir, a.mb, a.files, a.pause))
    th.start()
    start, n, worst = time.monotonic(), 0, 0.0
    while th.is_alive() or time.monotonic() - start < a.seconds:
        t = time.monotonic()
        atomic_write_json(a.dir / "progress.json", {"n": n}, sync=a.sync)
        append_jsonl(a.dir / "metrics.jsonl", {"n": n})
        took = time.monotonic() - t
        n, worst = n + 1, max(worst, took)
        if took > 0.02:
            print(f"t={t - start:5.1f} s  small write {took * 1000:4.0f} ms", flush=True)
        time.sleep(0.05)
    print(f"{n} small writes, slowest {worst * 1000:.0f} ms (sync={a.sync})")


if __name__ == "__main__":
    main()
