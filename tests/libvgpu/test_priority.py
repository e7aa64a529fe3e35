"""Priority on the simulated GPU, through the real libvgpu.so, bare (the test
plays the host: it makes the boards and the stamps in a tmp dir, as
hami_runtime/lifecycle/node_state/boards.py does).

A low-priority spin loop runs alone at the full rate, nearly stops while a
high-priority process works on the same GPU, and resumes once that one has been
idle past the idle time, having lost no launch; a high-priority kernel longer
than the idle time keeps it paused while the high one waits for it. Two
high-priority processes do not pause each other. A stamp the board does not link (a low-priority
container writing its own stamp) pauses nobody.

Timed on a shared machine: direction and generous bounds only; the figures
come from bench/sm_accuracy.py."""
import mmap
import os
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import sm_load  # noqa: E402
from sm_load import Load  # noqa: E402

from hami_runtime.node import region  # noqa: E402

UUID = sm_load.CARD_UUID
STAMP_BYTES = sm_load.STAMP_BYTES
IDLE_MS = 200


class Board:
    """The host's side: the priority board, a dir per GPU (sm_load makes each
    container's stamp and activity board entry)."""

    def __init__(self, root: Path):
        self.root = root
        (root / "board" / UUID).mkdir(parents=True)

    def container(self, name: str, high: bool) -> Load:
        load = Load(region=self.root / f"{name}.region", env=(
            ("CUDA_PRIORITY_BOARD", str(self.root / "board")),
            ("CUDA_PRIORITY_IDLE_MS", str(IDLE_MS))))
        stamp = sm_load.container_stamp(load.region)
        if high:
            os.link(stamp, self.root / "board" / UUID / name)
        return load


@pytest.fixture
def board(tmp_path):
    sm_load.build()
    return Board(tmp_path)


def rate(tenths: list[int], begin: float, end: float) -> float:
    """Completions per 100 ms over [begin, end) s of the window."""
    part = tenths[int(begin * 10):int(end * 10)]
    return sum(part) / max(len(part), 1)


def run_together(board, loads, seconds, late=None):
    """Loads (and a reference on its own device) over one window; `late`:
    (load, at_s, for_s), a process whose window opens at_s into the others'."""
    start_at = time.monotonic_ns() + int(sm_load.WARMUP_S * 1e9)
    state = board.root / "device.state"
    ref = sm_load.start(Load(region=board.root / "ref.region"), board.root / "ref.state", seconds, start_at)
    procs = [sm_load.start(load, state, seconds, start_at) for load in loads]
    late_proc = None
    if late:
        load, at_s, for_s = late
        opens = start_at + int(at_s * 1e9)
        time.sleep(max(0.0, (opens - time.monotonic_ns()) / 1e9 - 0.3))
        late_proc = sm_load.start(load, state, for_s, opens)
    results = [sm_load.finish(p, seconds) for p in procs]
    late_result = sm_load.finish(late_proc, late[2]) if late else None
    return results, sm_load.finish(ref, seconds), late_result


@pytest.mark.timeout(120)
def test_low_waits_while_high_works_and_resumes_after(board):
    low = board.container("low", high=False)
    high = board.container("high", high=True)
    (result,), ref, high_result = run_together(board, [low], 6.0, late=(high, 2.0, 1.5))
    tenths = result["per_tenth"]
    alone = rate(tenths, 0.3, 1.7)
    during = rate(tenths, 2.6, 3.5)            # the high one has had the GPU for a while
    after = rate(tenths, 3.5 + IDLE_MS / 1000 + 0.8, 6.0)
    series = " ".join(map(str, tenths))
    assert alone >= 5, f"the low one alone should run near 10/tenth: {series}"
    assert during <= 0.25 * alone, f"not paused while the high one works: {series}"
    assert after >= 0.6 * alone, f"did not resume after the high one went idle: {series}"
    # every launch it made was waited for and completed (sm_load exits 2 on any failure)
    assert result["launched"] >= result["completed"] > 0
    high_share = 100.0 * high_result["completed"] / max(rate(ref["per_tenth"], 2.0, 3.5) * 15, 1)
    assert high_share >= 70, f"the high one got {high_share:.0f}% next to the low one"
    with region.open(low.region) as r:
        paused_s = r._struct().sm[0].paused_ns / 1e9
    assert 0.5 <= paused_s <= 5.0, f"paused_ns says {paused_s:.2f} s"


@pytest.mark.timeout(120)
def test_two_high_priority_processes_share_as_usual(board):
    a, b = board.container("a", high=True), board.container("b", high=True)
    (ra, rb), ref, _ = run_together(board, [a, b], 3.0)
    share_a = 100.0 * ra["completed"] / ref["completed"]
    share_b = 100.0 * rb["completed"] / ref["completed"]
    assert share_a >= 25 and share_b >= 25, f"{share_a:.0f}% and {share_b:.0f}%: one paused the other"


@pytest.mark.timeout(120)
def test_an_unlinked_stamp_pauses_nobody(board):
    """A low-priority container that keeps its own stamp fresh (it may: the stamp
    is its own) does not pause a neighbour: the board does not name it."""
    forger, victim = board.container("forger", high=False), board.container("victim", high=False)
    stop = threading.Event()

    def forge():
        with open(board.root / "stamps-forger" / UUID, "r+b") as handle:
            mapped = mmap.mmap(handle.fileno(), STAMP_BYTES)
            while not stop.is_set():
                struct.pack_into("q", mapped, 0, time.monotonic_ns())
                struct.pack_into("q", mapped, 8, time.monotonic_ns())   # a wait slot, too
                time.sleep(0.005)
            mapped.close()

    thread = threading.Thread(target=forge)
    thread.start()
    try:
        (rf, rv), ref, _ = run_together(board, [forger, victim], 3.0)
    finally:
        stop.set()
        thread.join()
    share_v = 100.0 * rv["completed"] / ref["completed"]
    assert share_v >= 25, f"the neighbour got {share_v:.0f}%: an unlinked stamp paused it"
    with region.open(victim.region) as r:
        assert r._struct().sm[0].paused_ns == 0


@pytest.mark.timeout(120)
def test_a_kernel_longer_than_the_idle_time_keeps_low_work_out(board):
    """The high one launches one 1.5 s kernel and waits for it (cuEventSynchronize);
    with an idle time of 200 ms the low one stays paused for the whole kernel, not
    just its first 200 ms (its paused time says so), then goes on."""
    low = board.container("low", high=False)
    high = board.container("high", high=True)
    start_at = time.monotonic_ns() + int(sm_load.WARMUP_S * 1e9)
    state = board.root / "device.state"
    low_proc = sm_load.start(low, state, 4.0, start_at)
    opens = start_at + int(1e9)
    time.sleep(max(0.0, (opens - time.monotonic_ns()) / 1e9 - 0.3))
    # one kernel: it is launched when the process is ready, and waited for past the window
    high_proc = subprocess.Popen(
        [str(sm_load.SM_LOAD), "-u", "1500000", "-t", "0.1", "-q", "1", "-s", str(opens)],
        env=sm_load.load_env(high, state), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    result, high_result = sm_load.finish(low_proc, 4.0), sm_load.finish(high_proc, 0.1)
    assert high_result["launched"] == 1, high_result
    with region.open(low.region) as r:
        paused_s = r._struct().sm[0].paused_ns / 1e9
    series = " ".join(map(str, result["per_tenth"]))
    assert 1.0 <= paused_s <= 3.0, f"paused {paused_s:.2f} s through a 1.5 s kernel: {series}"
    assert rate(result["per_tenth"], 3.3, 4.0) >= 5, f"did not go on after it: {series}"
