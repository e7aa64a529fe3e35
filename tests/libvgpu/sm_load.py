"""Runs sm_load (sm_load.c) on the simulated GPU with libvgpu preloaded, and
turns its completion counts into shares of the unlimited rate.

The unlimited reference runs at the same time, on a second simulated GPU (its
own state file): a simulated kernel ends when the driver's stream thread wakes
up, so on a loaded machine throughput moves with the CPU load, and only a
reference measured in the same seconds keeps the ratio honest.

Each Load's region stands for a container: as the runtime does, every container
gets an activity stamp and an entry on its machine's activity board (the `default`
policy asks the board whether another container works; activity.h).

Shared by tests/libvgpu/test_sm_limit.py and bench/sm_accuracy.py. Every state
file, region and board lives in the caller's directory, so nothing is shared with
other runs.
"""
from __future__ import annotations

import json
import os
import subprocess
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BUILD = ROOT / "build"
SIM_LIB = BUILD / "sim" / "lib"
LIBVGPU = BUILD / "libvgpu.so"
SM_LOAD = BUILD / "tests" / "sm" / "sm_load"

KERNEL_US = 10000         # 10 ms kernels: launch gaps and scheduling noise stay small against them
WARMUP_S = 1.0
CARD_UUID = "GPU-453c5d90-9eaf-43fa-be71-c8ae8fc44d65"   # the simulator's card 0, where loads run
STAMP_BYTES = 64          # libvgpu_src/activity.h


def build() -> None:
    """Builds libvgpu, the simulated driver and sm_load (make keeps it incremental)."""
    subprocess.run(["make", "-s", "-C", str(ROOT), "build", "sim", "sm-tests"],
                   check=True, timeout=300, stdout=subprocess.DEVNULL)


@dataclass(frozen=True)
class Load:
    """One process: the region file (container) it belongs to, always a private one,
    and the limits the first process writes into it."""
    region: Path
    sm_limit: int | None = None
    policy: str | None = None
    mode: str = "kernel"
    streams: int = 1
    threads: int = 1
    env: tuple[tuple[str, str], ...] = ()   # more variables (e.g. the priority board's)


def container_stamp(region: Path) -> Path:
    """The activity stamp on card 0 of the container whose region this is (made zeroed once)."""
    stamp = region.parent / f"stamps-{region.stem}" / CARD_UUID
    stamp.parent.mkdir(exist_ok=True)
    if not stamp.exists():
        stamp.write_bytes(bytes(STAMP_BYTES))
    return stamp


def container_boards(region: Path, sim_state: Path) -> tuple[tuple[str, str], ...]:
    """The container's stamp, linked on the activity board of its machine (one board
    per state file: the reference's machine has a card 0 of its own), as
    hami_runtime/lifecycle/node_state/boards.py does; the env that points libvgpu at them."""
    board = region.parent / f"activity-{sim_state.stem}" / CARD_UUID
    board.mkdir(parents=True, exist_ok=True)
    stamp = container_stamp(region)
    if not (board / region.stem).exists():
        os.link(stamp, board / region.stem)
    return (("CUDA_ACTIVITY_BOARD", str(board.parent)), ("CUDA_ACTIVITY_STAMP_DIR", str(stamp.parent)))


def load_env(load: Load, sim_state: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("CUDA_", "GPU_CORE", "HAMI_", "LD_PRELOAD"))}
    env["LD_LIBRARY_PATH"] = str(SIM_LIB)
    env["HAMI_SIM_STATE"] = str(sim_state)
    env["LD_PRELOAD"] = str(LIBVGPU)
    env["CUDA_DEVICE_MEMORY_SHARED_CACHE"] = str(load.region)
    if load.sm_limit is not None:
        env["CUDA_DEVICE_SM_LIMIT"] = str(load.sm_limit)
    if load.policy is not None:
        env["GPU_CORE_UTILIZATION_POLICY"] = load.policy
    env.update(container_boards(load.region, sim_state))
    env.update(load.env)
    return env


def start(load: Load, sim_state: Path, seconds: float, start_at: int,
          kernel_us: int = KERNEL_US) -> subprocess.Popen:
    """One sm_load process whose window opens at `start_at` (CLOCK_MONOTONIC ns)."""
    return subprocess.Popen(
        [str(SM_LOAD), "-u", str(kernel_us), "-t", str(seconds), "-m", load.mode,
         "-n", str(load.streams), "-p", str(load.threads), "-s", str(start_at)],
        env=load_env(load, sim_state), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def finish(proc: subprocess.Popen, seconds: float) -> dict:
    out, err = proc.communicate(timeout=seconds + 90)
    if proc.returncode != 0:
        raise RuntimeError(f"sm_load exited {proc.returncode}: {err.strip()}")
    return json.loads(out)


@dataclass(frozen=True)
class Measurement:
    results: list[dict]       # one per load, in order
    reference: dict           # an unlimited process on its own device, same window

    def share(self, i: int = 0) -> float:
        """Throughput of load i in percent of the unlimited rate."""
        return 100.0 * self.results[i]["completed"] / self.reference["completed"]

    def per_second(self, i: int = 0) -> list[float]:
        return [100.0 * n / max(ref, 1)
                for n, ref in zip(self.results[i]["per_second"], self.reference["per_second"])]

    def jitter(self, target: float, i: int = 0) -> float:
        """Largest distance of one second's share from the target."""
        return max(abs(p - target) for p in self.per_second(i))

    def describe(self, i: int = 0) -> str:
        """For failure messages: the series and when each process got going."""
        series = " ".join(f"{p:.1f}" for p in self.per_second(i))
        return (f"per second [{series}], started {self.results[i]['ready_s']:+.2f} s "
                f"(reference {self.reference['ready_s']:+.2f} s) from the window")

    def split(self, i: int = 0) -> float:
        """Load i's part of everything the loads completed, percent."""
        return 100.0 * self.results[i]["completed"] / sum(r["completed"] for r in self.results)


def measure(loads: list[Load], workdir: Path, seconds: float, kernel_us: int = KERNEL_US,
            warmup_s: float = WARMUP_S) -> Measurement:
    """Runs the loads on one simulated device and an unlimited reference on another,
    all in the same window (opening `warmup_s` after they start)."""
    reference = Load(region=workdir / f"reference-{uuid.uuid4().hex}.region")
    start_at = time.monotonic_ns() + int(warmup_s * 1e9)
    ref_proc = start(reference, workdir / "reference.state", seconds, start_at, kernel_us)
    procs = [start(load, workdir / "device.state", seconds, start_at, kernel_us) for load in loads]
    results = [finish(proc, seconds) for proc in procs]
    return Measurement(results, finish(ref_proc, seconds))
