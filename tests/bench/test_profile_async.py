"""bench/speed/profile_async_analysis.py on synthetic intervals (every number worked out by
hand in the comments), bench/speed/profile_async_trace.py on synthetic profiler events, and
the benchmark's CLI end to end on a CPU (the tiny shape, asynchronous)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from bench.speed import profile_async_analysis as pa
from bench.speed.profile_async_trace import (
    Ev,
    _activity,
    activity_of,
    analyze,
    classify,
    pick_streams,
)
from tests.e2e.helpers import env

from ..slowdown import guard

REPO = Path(__file__).resolve().parents[2]


# ------------------------------------------------------------------ interval arithmetic
def test_union_merges_overlapping_nested_and_touching_spans_and_drops_empty_ones() -> None:
    # (0,4) and (2,3) nested, (3,6) overlaps -> (0,6); (6,7) touches -> (0,7); (9,9) empty
    assert pa.union([(3, 6), (0, 4), (2, 3), (6, 7), (9, 9), (10, 12)]) == [(0, 7), (10, 12)]
    assert pa.union([]) == []
    assert pa.length([(0, 4), (2, 3), (3, 6), (10, 12)]) == 8  # 6 + 2
    assert pa.length([]) == 0


def test_intersect_and_subtract() -> None:
    a, b = [(0, 10), (20, 30)], [(5, 25), (28, 40)]
    assert pa.intersect(a, b) == [(5, 10), (20, 25), (28, 30)]
    assert pa.subtract(a, b) == [(0, 5), (25, 28)]
    assert pa.subtract(b, a) == [(10, 20), (30, 40)]
    assert pa.intersect(a, []) == [] and pa.subtract(a, []) == a and pa.subtract([], a) == []
    # disjoint: nothing shared, nothing removed
    assert pa.intersect([(0, 1)], [(2, 3)]) == [] and pa.subtract([(0, 1)], [(2, 3)]) == [(0, 1)]
    # nested: a hole in the middle
    assert pa.subtract([(0, 10)], [(3, 4), (6, 7)]) == [(0, 3), (4, 6), (7, 10)]
    # one span of b across two of a; b's spans ending where a's begin take nothing
    assert pa.subtract([(0, 5), (6, 10), (12, 13)], [(-3, 0), (4, 7), (10, 12)]) == [
        (0, 4), (7, 10), (12, 13),
    ]  # fmt: skip
    assert pa.clip([(-5, 2), (8, 15)], (0, 10)) == [(0, 2), (8, 10)]


def test_stream_stats_cut_busy_time_to_the_window_and_count_kernels_started_in_it() -> None:
    # window (10, 20): (5,12) counts 2 us busy but started before; (11,13) nested in its
    # busy time adds 1 (12->13); (15,16) 1; (19,25) 1 busy, started inside; (30,31) outside
    kernels = [(5, 12), (11, 13), (15, 16), (19, 25), (30, 31)]
    got = pa.stream_stats(kernels, (10, 20))
    assert got["busy_us"] == 2 + 1 + 1 + 1
    assert got["kernels"] == 3  # (11,13), (15,16), (19,25)
    assert got["median_kernel_us"] == 2  # durations 2, 1, 6
    assert pa.stream_stats([], (0, 1)) == {"busy_us": 0, "kernels": 0, "median_kernel_us": None}


def test_overlap_is_the_shared_busy_time_over_the_update_streams_busy_time() -> None:
    decode = [(0, 3), (5, 8)]
    update = [(2, 6), (7, 12)]  # busy in window (0, 10): 4 + 3 = 7
    got = pa.overlap(decode, update, (0, 10))
    assert got["both_busy_us"] == 1 + 1 + 1  # (2,3), (5,6), (7,8)
    assert got["share_of_update_busy"] == pytest.approx(3 / 7)
    assert pa.overlap([(0, 1)], [(2, 3)], (0, 10))["both_busy_us"] == 0  # disjoint
    assert pa.overlap([(0, 5)], [(1, 2)], (0, 10))["share_of_update_busy"] == 1.0  # nested
    assert pa.overlap([(0, 1)], [], (0, 10))["share_of_update_busy"] is None  # no update


def test_pending_runs_from_each_launch_to_its_kernel() -> None:
    # launched at 1, started at 4: pending (1,4); launch returned at 6 after the kernel had
    # started at 5 (the GPU began before the call returned): nothing; unknown launch: nothing
    kernels = [(4, 5), (5, 7), (9, 10)]
    assert pa.pending(kernels, [1.0, 6.0, None]) == [(1.0, 4)]


def test_idle_split_is_disjoint_first_match_wins_and_sums_to_the_idle_time() -> None:
    window = (0, 100)
    kernels = [(0, 10), (50, 60)]  # busy 20, idle (10,50) and (60,100): 80
    queued = [(10, 20)]  # 10 queued
    sync = [(15, 30)]  # (15,20) already queued: 10 more, (20,30)
    cuda = [(25, 40), (95, 100)]  # (30,40) and (95,100): 15
    ops = [(35, 45), (60, 70)]
    got = pa.idle_split(kernels, window, queued, sync, cuda, ops)
    assert got["idle_us"] == 80
    assert got["gpu_queued_us"] == 10
    assert got["thread_sync_us"] == 10
    assert got["thread_cuda_us"] == 10 + 5
    assert got["thread_ops_us"] == 5 + 10  # (40,45), (60,70)
    assert got["thread_other_us"] == 80 - 10 - 10 - 15 - 15  # (45,50), (70,95): 5 + 25
    assert got["gpu_wait_us"] == 20 and got["host_wait_us"] == 60
    parts = sum(got[p + "_us"] for p in pa.IDLE_PARTS)
    assert parts == got["idle_us"]
    # a thread inside an op the whole time: the host part is all ops
    assert pa.idle_split(kernels, window, [], [], [], [(0, 100)])["thread_ops_us"] == 80
    # no kernel at all: the whole window idle, nothing known of the thread
    empty = pa.idle_split([], (0, 5), [], [], [], [])
    assert empty["idle_us"] == 5 and empty["thread_other_us"] == 5 and empty["gpu_wait_us"] == 0


def test_thread_stats_count_each_kind_once_and_the_time_outside_all() -> None:
    ops = [(0, 10), (5, 12)]  # 12
    cuda = [(8, 9), (20, 22)]  # 3
    sync = [(20, 21), (40, 60)]  # 1 + 10 in the window (0, 50)
    got = pa.thread_stats(ops, cuda, sync, (0, 50))
    assert got == {"cpu_op_us": 12, "cuda_call_us": 3, "sync_us": 11,
                   "outside_us": 50 - (12 + 2 + 10)}  # fmt: skip


def test_while_other_between_counts_host_waits_while_the_other_thread_ran_python() -> None:
    # decode waited for its host over (10,30); the main thread was inside ops over (0,15)
    # and (25,40): between them (15,25) it ran Python
    assert pa.while_other_between([(10, 30)], [(0, 15), (25, 40)], (0, 50)) == 10


def test_verdict_names_the_larger_wait() -> None:
    base = {"idle_us": 50.0}
    gpu = pa.verdict(base | {"gpu_wait_us": 45.0, "host_wait_us": 5.0}, 50.0, 100.0)
    assert "waits for the GPU" in gpu and "ran kernels 50 %" in gpu and "90 %" in gpu
    host = pa.verdict(base | {"gpu_wait_us": 5.0, "host_wait_us": 45.0}, 50.0, 100.0)
    assert "waits for its host thread" in host
    mixed = pa.verdict(base | {"gpu_wait_us": 25.0, "host_wait_us": 25.0}, 50.0, 100.0)
    assert "neither alone" in mixed
    busy = pa.verdict({"idle_us": 1.0, "gpu_wait_us": 1.0, "host_wait_us": 0.0}, 99.0, 100.0)
    assert "hardly waited" in busy
    assert "nothing to say" in pa.verdict(base | {"gpu_wait_us": 0, "host_wait_us": 0}, 0, 0)


# ------------------------------------------------------------------ events -> numbers
MAIN, DECODE, S_MAIN, S_DEC = 1, 2, 7, 20


def _step_events(decode_calls: bool = True) -> list[Ev]:
    """An asynchronous step in miniature (µs): the update's range (100, 200) on the main
    thread, the decode thread's (50, 300); two update kernels on stream 7, a replayed graph of
    two kernels, a host check and one more launch of the decode on stream 20, one decode
    kernel after the update."""
    ev = [
        Ev("profile_async:update", "range", 100, 200, MAIN),
        Ev("profile_async:decode_thread", "range", 50, 300, DECODE),
        Ev("aten::mm", "op", 100, 104, MAIN, 501),
        Ev("cudaLaunchKernel", "runtime", 100, 102, MAIN, 1),
        Ev("cudaLaunchKernel", "runtime", 103, 104, MAIN, 2),
        Ev("Optimizer.step", "op", 170, 185, MAIN, 502),
        Ev("cudaStreamSynchronize", "runtime", 190, 199, MAIN),
        Ev("gemm", "kernel", 105, 150, S_MAIN, 1),
        Ev("adam", "kernel", 160, 190, S_MAIN, 2),
        Ev("aten::add", "op", 131, 140, DECODE, 601),
        Ev("layer_a", "kernel", 100, 110, S_DEC, 10),
        Ev("layer_b", "kernel", 110, 120, S_DEC, 10),
        Ev("sample", "kernel", 150, 170, S_DEC, 11),
        Ev("later", "kernel", 210, 212, S_DEC, 12),
    ]
    if decode_calls:
        ev += [
            Ev("cudaGraphLaunch", "runtime", 95, 98, DECODE, 10),
            Ev("cudaStreamSynchronize", "runtime", 120, 130, DECODE),
            Ev("cudaLaunchKernel", "runtime", 140, 142, DECODE, 11),
            Ev("cudaLaunchKernel", "runtime", 205, 206, DECODE, 12),
        ]
    return ev


def test_activity_of_an_event_from_what_every_torch_reports() -> None:
    assert activity_of(True, False, "void gemm<...>") == "kernel"
    assert activity_of(True, False, "Memcpy DtoD (Device -> Device)") == "gpu_memcpy"
    assert activity_of(True, False, "Memset (Device)") == "gpu_memset"
    assert activity_of(True, True, "profile_async:update") == "gpu_user_annotation"
    assert activity_of(False, True, "profile_async:update") == "user_annotation"
    for call in ("cudaLaunchKernel", "cudaGraphLaunch", "cuLaunchKernel", "cudaStreamSynchronize"):
        assert activity_of(False, False, call) == "cuda_runtime"
    for op in ("aten::mm", "cublas_thing", "custom::op", "Optimizer.step"):
        assert activity_of(False, False, op) == "cpu_op"
    # an event of a torch without activity_type() goes through it
    old = SimpleNamespace(name=lambda: "cudaGraphLaunch", device_type=lambda: "DeviceType.CPU")
    assert _activity(old) == "cuda_runtime"
    new = SimpleNamespace(activity_type=lambda: "cpu_op", name=lambda: "cudaGraphLaunch")
    assert _activity(new) == "cpu_op"  # its own word first


def test_classify_links_kernels_to_their_launching_thread_and_launch_time() -> None:
    c = classify(_step_events())
    assert c.streams[S_DEC].kernels[:2] == [(100, 110), (110, 120)]
    assert c.streams[S_DEC].launched == [98, 98, 142, 206]  # the graph's kernels share a call
    assert dict(c.streams[S_DEC].by_thread) == {DECODE: 4}
    assert dict(c.streams[S_MAIN].by_thread) == {MAIN: 2}
    assert c.threads[DECODE].sync == [(120, 130)] and c.threads[MAIN].sync == [(190, 199)]
    assert pick_streams(c, MAIN, DECODE) == {
        "main": S_MAIN, "decode": S_DEC, "found_by": "launch calls of each thread"
    }  # fmt: skip
    # no launch call names the decode thread: the other busy stream, said so
    blind = pick_streams(classify(_step_events(decode_calls=False)), MAIN, DECODE)
    assert (blind["main"], blind["decode"]) == (S_MAIN, S_DEC)
    assert blind["found_by"].startswith("elimination")
    assert "no CUDA runtime call" in analyze(_step_events(False), MAIN, DECODE, 50)["warning"]
    # no launch call, but the kernel names the op it ran under (on the decode thread)
    linked = [*_step_events(decode_calls=False), Ev("k", "kernel", 180, 181, 30, 99, 601)]
    c = classify(linked)
    assert dict(c.streams[30].by_thread) == {DECODE: 1} and c.streams[30].launched == [None]
    assert pick_streams(c, MAIN, DECODE)["decode"] == 30


def test_analyze_a_miniature_step_by_hand() -> None:
    got = analyze(_step_events(), MAIN, DECODE, tail_us=50)
    assert got["window"]["update_ms"] == 0.1 and not got["window"]["decode_ended_before_update"]
    dec, upd = got["streams"][str(S_DEC)], got["streams"][str(S_MAIN)]
    assert (dec["role"], dec["launched_by"]) == ("decode", {"decode": 4})
    # decode in (100, 200): (100,110), (110,120), (150,170): busy 40, 3 kernels, median 10
    assert (dec["busy_us"], dec["kernels"], dec["median_kernel_us"]) == (40, 3, 10)
    assert (upd["busy_us"], upd["kernels"], upd["median_kernel_us"]) == (75, 2, 37.5)
    assert got["decode_alone_median_kernel_us"] == 2  # (210, 212) in the tail (200, 250)
    # both ran: (105,110) (110,120) (160,170) = 25 of the update's 75
    assert got["overlap"]["both_busy_us"] == 25
    assert got["overlap"]["share_of_update_busy"] == pytest.approx(1 / 3)
    # decode idle (120,150) (170,200) = 60: queued (142,150) 8; sync (120,130) 10; launch
    # call (140,142) 2; op (131,140) 9; the rest (130,131) (170,200) 31
    d = got["idle"]["decode"]
    assert [d[p + "_us"] for p in pa.IDLE_PARTS] == [8, 10, 2, 9, 31]
    assert (d["idle_us"], d["gpu_wait_us"], d["host_wait_us"]) == (60, 18, 42)
    # update idle (100,105) (150,160) (190,200) = 25: queued (102,105) (150,160) 13 (its
    # second kernel was launched at 104); sync (190,199) 9; launch (100,102) 2; other 1
    u = got["idle"]["update"]
    assert [u[p + "_us"] for p in pa.IDLE_PARTS] == [13, 9, 2, 0, 1]
    assert got["threads"]["main"] == {"cpu_op_us": 19, "cuda_call_us": 12, "sync_us": 9,
                                      "outside_us": 72, "cuda_calls": 3}  # fmt: skip
    assert got["threads"]["decode"] == {"cpu_op_us": 9, "cuda_call_us": 12, "sync_us": 10,
                                        "outside_us": 79, "cuda_calls": 4}  # fmt: skip
    assert "warning" not in got
    # the decode's host wait (130,142) (170,200) while the main thread was between its ops
    # and calls ((104,170) (185,190) (199,200)): 12 + 5 + 1
    assert got["decode_host_wait_while_main_between_ops_us"] == 18
    assert "waits for its host thread" in got["verdict"] and "70 %" in got["verdict"]


def test_gpu_records_cut_short_cut_the_window_and_say_so() -> None:
    """When CUPTI's buffers fill, kernels stop being recorded while the host goes on: the
    window ends at the last recorded kernel (here 170, the update's range ends at 200)."""
    from bench.speed.profile_async_tables import says

    cut = [e for e in _step_events() if not (e.kind == "kernel" and e.start >= 160)]
    cut.append(Ev("gemm2", "kernel", 160, 170, S_MAIN, 2))
    got = analyze(cut, MAIN, DECODE, tail_us=50, cut_tolerance_us=5)
    assert got["window"]["gpu_records_end_early_ms"] == 0.03
    assert got["window"]["analyzed_ms"] == 0.07 and got["window"]["tail_ms"] == 0
    assert got["streams"][str(S_DEC)]["busy_us"] == 20 + 20  # (100,120), (150,170)
    assert got["idle"]["decode"]["idle_us"] == 30  # (120,150): nothing after 170 counts
    assert "the GPU's records stop 0 ms before its end" in says(got, True)
    assert analyze(_step_events(), MAIN, DECODE, 50)["window"]["gpu_records_end_early_ms"] is None


def test_analyze_without_streams_says_so_and_still_splits_the_threads() -> None:
    cpu = [e for e in _step_events() if e.kind in ("range", "op")]
    got = analyze(cpu, MAIN, DECODE, tail_us=50)
    assert got["streams"] == {} and "no CUDA streams" in got["note"]
    assert "idle" not in got and "verdict" not in got
    assert got["threads"]["decode"]["cpu_op_us"] == 9
    assert "no update range" in analyze([], MAIN, DECODE, 50)["error"]


def test_the_report_of_a_gpu_step_has_both_tables_and_says_what_it_found() -> None:
    from bench.speed.profile_async_tables import markdown

    step = analyze(_step_events(), MAIN, DECODE, tail_us=50) | {"events": 18}
    result = {"tag": "x", "shape": "s", "env": {"device": "d"}, "command": "c", "on_gpu": True,
              "steps": [step]}  # fmt: skip
    md = markdown(result)
    assert "| decode (20) | 0.0 (40 %) | 3 | 10 | 0.1 |" in md  # 40 us busy of 100
    assert "| update (7) |" in md and "| main | 0.0 |" in md
    assert "both streams ran kernels at once 33 %" in md and "waits for its host thread" in md


@pytest.mark.slow
def test_the_cli_on_a_cpu_reports_the_threads_and_no_streams(tmp_path: Path) -> None:
    """The benchmark end to end on the tiny shape, asynchronous, lengths imposed: a CPU has
    no CUDA streams, which the report says, and the two threads' CPU time is still split."""
    cmd = [
        sys.executable, "-m", "bench.speed.profile_async", "--shape", "tiny", "--precision",
        "fp32", "--max-new", "16", "--prompts", "2", "--G", "4", "--warmup", "1",
        "--tail-s", "0.1", "--length-dist", "bench/speed/lengths/smollm2_gsm8k_cap1024.json",
        "--override", "rollout.decode_priority=high", "--tag", "cpu", "--out", str(tmp_path),
    ]  # fmt: skip
    proc = subprocess.run(
        cmd, cwd=REPO, capture_output=True, text=True, env=env(), timeout=guard(300)
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads((tmp_path / "profile_async_cpu.json").read_text())
    for key in ("env", "command", "config", "overrides", "steps", "unprofiled_metrics"):
        assert key in result, key
    assert result["on_gpu"] is False and result["decode_stream_priority"] is None
    assert "algo.max_staleness=1" in result["overrides"]
    assert "rollout.decode_priority=high" in result["overrides"]
    assert result["config"]["override"] == ["rollout.decode_priority=high"]
    assert result["lengths"].startswith("lengths imposed from")
    assert result["unprofiled_metrics"]["time/step"] > 0
    (step,) = result["steps"]
    assert step["streams"] == {} and "no CUDA streams" in step["note"]
    main, decode = step["threads"]["main"], step["threads"]["decode"]
    assert step["decode_tid"] not in (None, step["main_tid"])  # the decode thread was seen
    assert main["cpu_op_us"] > 0 and decode["cpu_op_us"] > 0  # both threads' ops recorded
    window = 1e3 * step["window"]["analyzed_ms"]
    for t in (main, decode):  # inside and outside the ops: the window, once
        assert t["cpu_op_us"] + t["outside_us"] == pytest.approx(window, abs=1.0)
    md = (tmp_path / "profile_async_cpu.md").read_text()
    assert "no CUDA streams" in md and "no GPU number" in md and "| decode |" in md
    assert "Decode stream priority None" in md and "unprofiled step: step " in md
