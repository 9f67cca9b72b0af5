"""bench/probes/suite_timeline.py: the plugin records each test as one span on its worker
(through a real pytest run in a subprocess, two xdist workers), and the report says each
worker's first start, last end and busy seconds and the modules by their seconds."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from bench.probes import suite_timeline as st

from ..slowdown import guard

REPO = Path(__file__).resolve().parents[2]


def test_workers_and_modules_are_read_from_the_spans() -> None:
    spans = [
        st.Span("gw0", "tests/a.py::t1", 100.0, 103.0),
        st.Span("gw0", "tests/a.py::t2@grp", 103.0, 104.0),
        st.Span("gw1", "tests/b.py::t1", 101.0, 110.0),
    ]
    assert st.workers(spans) == [
        st.WorkerLine("gw0", 2, 0.0, 4.0, 4.0),
        st.WorkerLine("gw1", 1, 1.0, 10.0, 9.0),
    ]
    assert st.modules(spans) == [("tests/b.py", 1, 9.0), ("tests/a.py", 2, 4.0)]
    text = st.report(spans, most=1)
    assert text.splitlines()[0] == "3 tests, 13 test-seconds on 2 workers"
    assert "69.2%  tests/b.py (1)" in text and "tests/a.py" not in text.split("module")[1]


def test_modules_by_cpu_sum_the_machines_cpu_and_say_when_workers_shared_it() -> None:
    one = [
        st.Span("main", "tests/a.py::t1", 0.0, 5.0, cpu=4.0),
        st.Span("main", "tests/a.py::t2", 5.0, 6.0, cpu=1.5),
        st.Span("main", "tests/b.py::t1", 6.0, 16.0, cpu=0.5),  # it waited
    ]
    assert st.modules_by_cpu(one) == [("tests/a.py", 2, 5.5), ("tests/b.py", 1, 0.5)]
    text = st.report(one)
    assert "module machine CPU seconds, 6 in all\n" in text + "\n"
    assert " 91.7%  91.7%  tests/a.py (2)" in text
    two = [*one[:2], st.Span("gw1", "tests/b.py::t1", 6.0, 16.0, cpu=0.5)]
    assert "shared by workers, not each test's own" in st.report(two)
    old = [st.Span("gw0", "tests/a.py::t1", 0.0, 1.0)]  # recorded before the CPU column
    assert st.modules_by_cpu(old) == [] and "CPU" not in st.report(old)


def test_the_machines_cpu_seconds_are_read_from_proc_stat(tmp_path: Path) -> None:
    stat = tmp_path / "stat"
    stat.write_text("cpu  100 20 30 5000 70 1 2 3 0 0\ncpu0 50 10 15 2500 35 0 1 1 0 0\n")
    hz = st.os.sysconf("SC_CLK_TCK")
    assert st.machine_cpu_seconds(stat) == pytest.approx((100 + 20 + 30 + 1 + 2 + 3) / hz)
    assert st.machine_cpu_seconds(tmp_path / "none") is None
    before = st.machine_cpu_seconds()  # the real file: a busy second moves it
    if before is None:
        pytest.skip("no /proc/stat on this machine")
    end = st.time.process_time() + 0.3
    while st.time.process_time() < end:
        pass
    after = st.machine_cpu_seconds()
    assert after is not None and after - before >= 0.25


def test_the_plugin_records_every_test_of_a_real_run(tmp_path: Path) -> None:
    tests = tmp_path / "suite"
    tests.mkdir()
    (tests / "test_x.py").write_text(
        "import time\n\n"
        "def test_a():\n    time.sleep(0.2)\n\n"
        "def test_b():\n    pass\n\n"
        "def test_c():\n    pass\n"
    )
    out = tmp_path / "tl" / "new"  # not made yet: the plugin makes it
    env = {"GRPO_HPC_TIMELINE": str(out), "PYTHONPATH": str(REPO)}
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "2",
           "-p", "bench.probes.suite_timeline", str(tests)]  # fmt: skip
    proc = subprocess.run(
        cmd, capture_output=True, text=True, env=env, cwd=tmp_path, timeout=guard(120)
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    spans = st.read(out)
    assert sorted(s.test.split("::")[1] for s in spans) == ["test_a", "test_b", "test_c"]
    assert {s.worker for s in spans} <= {"gw0", "gw1"}
    (a,) = [s for s in spans if s.test.endswith("test_a")]
    assert a.seconds >= 0.2
    assert all(s.cpu is not None and s.cpu >= 0 for s in spans)


def test_an_empty_folder_says_to_record_first(tmp_path: Path) -> None:
    with pytest.raises(SystemExit, match="no timeline in .*record one first"):
        st.main([str(tmp_path)])
