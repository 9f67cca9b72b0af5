"""Peak VmRSS and RssAnon of a command, polled from /proc every 5 ms.

Usage: python -m bench.probes.peak_rss CMD...   (bench/results/archive/export_memory.md)
"""

from __future__ import annotations

import subprocess
import sys
import time


def status_kib(pid: int) -> dict[str, int]:
    """VmRSS and RssAnon (KiB) of a process; {} once it is gone."""
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as f:
            lines = f.read().splitlines()
    except OSError:
        return {}
    keys = ("VmRSS", "RssAnon")
    return {ln.split(":")[0]: int(ln.split()[1]) for ln in lines if ln.startswith(keys)}


def main(cmd: list[str]) -> int:
    proc = subprocess.Popen(cmd)
    peak = {"VmRSS": 0, "RssAnon": 0}
    while proc.poll() is None:
        for key, value in status_kib(proc.pid).items():
            peak[key] = max(peak[key], value)
        time.sleep(0.005)
    vm, anon = peak["VmRSS"] / 1024, peak["RssAnon"] / 1024
    print(f"rc={proc.returncode} peak VmRSS {vm:.0f} MiB, peak RssAnon {anon:.0f} MiB")
    return proc.returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
