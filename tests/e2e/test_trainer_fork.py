"""The forked runs' agent does for its ranks what torchrun's does on one node
(tests/e2e/trainer_fork.py): when one rank fails or the agent is told to stop, the others
are stopped too (SIGTERM, then SIGKILL after the grace period), and the group's code says
so. Stand-in ranks here (a few lines of Python each), the agent's own watch."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

from tests.slowdown import guard

ROOT = Path(__file__).resolve().parents[2]

# An agent (this script) forks one child per behaviour, then watches them with
# trainer_fork.supervise and prints what it saw as JSON. "wait" children block until a
# signal ends them; "stubborn" ones ignore SIGTERM; the agent tells itself to stop once
# every child has started when asked to ("term-agent").
AGENT = """
import json, os, signal, sys, time
from tests.e2e import trainer_fork

trainer_fork.SHUTDOWN_GRACE_S = 0.5
ready_r, ready_w = os.pipe()
pids = []
for how in sys.argv[1].split(","):
    pid = os.fork()
    if pid == 0:
        if how == "stubborn":
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
        os.write(ready_w, b".")
        if how.startswith("exit"):
            os._exit(int(how[4:]))
        signal.pause()
        os._exit(0)
    pids.append(pid)
for _ in pids:
    os.read(ready_r, 1)  # every child has set its signals up
if sys.argv[2] == "term-agent":  # pending until supervise has installed its handler
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
    os.kill(os.getpid(), signal.SIGTERM)
codes, signalled = trainer_fork.supervise(pids)
print(json.dumps([codes, signalled, trainer_fork.group_exit_code(codes, signalled)]))
"""


def _agent(behaviours: str, mode: str = "") -> list:
    out = subprocess.run(
        [sys.executable, "-c", AGENT, behaviours, mode],
        capture_output=True, text=True, cwd=ROOT, timeout=guard(120),
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout)


def test_a_failed_rank_stops_the_others_and_fails_the_group() -> None:
    assert _agent("exit3,wait") == [[3, -signal.SIGTERM], False, 1]


def test_a_rank_that_ignores_sigterm_is_killed_after_the_grace_period() -> None:
    assert _agent("exit3,stubborn") == [[3, -signal.SIGKILL], False, 1]


def test_ranks_that_all_end_well_end_the_group_well() -> None:
    assert _agent("exit0,exit0") == [[0, 0], False, 0]


def test_a_signal_to_the_agent_is_passed_on_to_every_rank() -> None:
    assert _agent("wait,wait", "term-agent") == [[-signal.SIGTERM, -signal.SIGTERM], True, 1]
