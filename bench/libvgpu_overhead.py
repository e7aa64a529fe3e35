"""libvgpu's cost on the simulated driver, with and without it, in one run.

Per-call ns of cuMemAlloc/cuMemFree, cuLaunchKernel (zero-length kernel) and
cuMemGetInfo (median of interleaved runs), CUDA init time (cuInit .. first
allocation, in process), and 100 processes starting at once (p50/p99 of each
process's init, and of spawn-to-exit wall time). Prints markdown tables.

Setups, interleaved: the driver alone; libvgpu in bare use (limits from the env,
a shared region file, no boards); libvgpu as in a runtime-made container (its
limits file read-only at the runtime's path, its activity stamps and both boards
as the runtime makes them, a neighbour's entry on the activity board,
scripts/runtime-made.sh: needs root); and, with --baseline, another build of
libvgpu in bare use (e.g. the tree before a change).

With --slow-nvml the simulated NVML is as slow to start as an H200 node's
(sim_runtime.SLOW_NVML), for every setup: libvgpu's NVML calls at a process's
first context then cost what they cost there. With --devices N as well, the
simulated machine has N GPUs and every process works on the last of them, as
the last rank of a multi-GPU job does.

    python bench/libvgpu_overhead.py [--calls N] [--repeats R] [--procs P] [--baseline LIBVGPU]
                                     [--slow-nvml [--devices N]]
"""
import argparse
import contextlib
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from sim_runtime import SLOW_NVML, slow_nvml_env
from stats import percentile

ROOT = Path(__file__).resolve().parent.parent
BUILD = ROOT / "build"
HELPER = BUILD / "bench" / "libvgpu_bench"
LIBVGPU = BUILD / "libvgpu.so"
SIM_LIB = BUILD / "sim" / "lib"


RUNTIME_MADE = ROOT / "scripts" / "runtime-made.sh"
MOUNT_POINT = "/.hami"  # runtime-made.sh makes it on the host's disk where it is missing
MIB = 1 << 20
STAMP_BYTES = 64  # libvgpu_src/activity.h


class Setup:
    """How the helper runs: its env and the argv in front of it."""

    def __init__(self, label, tmp: Path, libvgpu=None, runtime_made=False, slow_nvml=False, devices=0):
        self.label = label
        work = tmp / label.replace(" ", "-").replace(",", "")
        work.mkdir()
        self.env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LD_LIBRARY_PATH": str(SIM_LIB),
                    "HAMI_SIM_STATE": str(work / "sim.state")}
        if slow_nvml:
            self.env.update(slow_nvml_env(work, **({"devices": devices} if devices else {})))
        if devices:
            self.env["BENCH_DEVICE"] = str(devices - 1)
        self.prefix = []
        if libvgpu:
            self.env["LD_PRELOAD"] = str(libvgpu)
        if libvgpu and runtime_made:
            sys.path.insert(0, str(ROOT))
            from hami_runtime.node import region
            uuids = subprocess.run([str(HELPER), "uuids"], env=self.env, capture_output=True, text=True,
                                   timeout=60, check=True).stdout.split()
            region.create_limits(work / "limits", [region.DeviceLimit(u, 8192 * MIB, 0) for u in uuids])
            region.create_region(work / "vgpu.region")
            boards = work / "boards"
            for uuid in uuids:   # a low-priority container with one neighbour on each GPU
                for name in ("activity", "neighbour"):
                    (work / name).mkdir(exist_ok=True)
                    (work / name / uuid).write_bytes(bytes(STAMP_BYTES))
                for board in ("activity", "priority"):
                    (boards / board / uuid).mkdir(parents=True)
                os.link(work / "activity" / uuid, boards / "activity" / uuid / "ours")
                os.link(work / "neighbour" / uuid, boards / "activity" / uuid / "neighbour")
            self.prefix = [str(RUNTIME_MADE), str(work / "limits"), str(work), str(boards), "ro"]
        elif libvgpu:
            self.env.update(CUDA_DEVICE_MEMORY_LIMIT="8g", CUDA_DEVICE_MEMORY_SHARED_CACHE=str(work / "vgpu.region"))

    def argv(self, *args):
        return self.prefix + [str(HELPER), *args]


def fields(text: str) -> dict:
    return {k: float(v) for k, v in (t.split("=") for t in text.split() if "=" in t)}


def run(setup: Setup, *args) -> dict:
    out = subprocess.run(setup.argv(*args), env=setup.env, capture_output=True, text=True,
                         timeout=120, check=True).stdout
    return fields(out)


def burst(setup: Setup, procs):
    """`procs` processes started at once: their in-process init and wall times (ms)."""
    started = []
    for _ in range(procs):
        started.append((time.monotonic(), subprocess.Popen(setup.argv("init"), env=setup.env,
                                                            stdout=subprocess.PIPE, text=True)))
    inits, walls = [], []
    for t0, proc in started:
        out, _ = proc.communicate(timeout=120)
        walls.append((time.monotonic() - t0) * 1e3)
        if proc.returncode != 0:
            raise SystemExit(f"libvgpu_bench init exited {proc.returncode}")
        inits.append(fields(out)["init_ns"] / 1e6)
    return inits, walls


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=20000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--procs", type=int, default=100)
    parser.add_argument("--baseline", type=Path, help="another libvgpu.so, measured in bare use beside this one")
    parser.add_argument("--slow-nvml", action="store_true", help="the simulated NVML as slow as an H200 node's")
    parser.add_argument("--devices", type=int, default=0, choices=range(1, 9), metavar="N",
                        help="with --slow-nvml: N simulated GPUs, every process on the last")
    args = parser.parse_args()
    if args.devices and not args.slow_nvml:
        parser.error("--devices goes with --slow-nvml")
    subprocess.run(["make", "-s", "-C", str(ROOT), "build", "sim", "libvgpu-bench"], check=True,
                   timeout=600)
    metrics = ["alloc_ns", "free_ns", "launch_ns", "getinfo_ns"]
    made_mount_point = not os.path.lexists(MOUNT_POINT)
    try:
        with tempfile.TemporaryDirectory(prefix="hami-bench-") as tmp_name:
            tmp = Path(tmp_name)
            sim = {"slow_nvml": args.slow_nvml, "devices": args.devices}
            setups = [Setup("driver alone", tmp, **sim)]
            if args.baseline:
                setups.append(Setup("baseline libvgpu, bare", tmp, args.baseline, **sim))
            setups += [Setup("libvgpu, bare", tmp, LIBVGPU, **sim),
                       Setup("libvgpu, runtime-made", tmp, LIBVGPU, True, **sim)]
            samples = {s.label: {m: [] for m in metrics + ["init_ns"]} for s in setups}
            for _ in range(args.repeats):
                for setup in setups:
                    for key, value in run(setup, "calls", str(args.calls)).items():
                        samples[setup.label][key].append(value)
                    samples[setup.label]["init_ns"].append(run(setup, "init")["init_ns"])
            # the runtime-made setup's wrapper makes a mount namespace per process, which a
            # container's processes do not pay: it has no burst row
            bursts = {setup.label: burst(setup, args.procs) for setup in setups if not setup.prefix}
    finally:
        if made_mount_point:  # left empty: everything went under the tmpfs
            with contextlib.suppress(OSError):
                os.rmdir(MOUNT_POINT)

    names = {"alloc_ns": "cuMemAlloc_v2 (4 KiB)", "free_ns": "cuMemFree_v2",
             "launch_ns": "cuLaunchKernel (zero-length)", "getinfo_ns": "cuMemGetInfo_v2"}
    labels = [s.label for s in setups]
    print(f"Simulated driver{f' (its NVML as slow to start as an H200 node: {SLOW_NVML})' if args.slow_nvml else ''}"
          f"{f', {args.devices} GPUs, every process on the last' if args.devices else ''}, "
          f"{args.calls} calls x {args.repeats} interleaved runs, median; in brackets, added to the driver alone.\n")
    print("| call (ns) | " + " | ".join(labels) + " |")
    print("| --- |" + " ---: |" * len(labels))
    median = {label: {m: statistics.median(v) for m, v in samples[label].items()} for label in labels}
    alone = median[labels[0]]
    for m in metrics + ["init_ns"]:
        scale, name = (1e6, "CUDA init (cuInit .. first alloc, ms)") if m == "init_ns" else (1, names[m])
        cells = [f"{alone[m] / scale:.2f}" if scale > 1 else f"{alone[m]:.0f}"]
        for label in labels[1:]:
            value, added = median[label][m] / scale, (median[label][m] - alone[m]) / scale
            cells.append(f"{value:.2f} ({added:+.2f})" if scale > 1 else f"{value:.0f} ({added:+.0f})")
        print(f"| {name} | " + " | ".join(cells) + " |")
    print(f"\n{args.procs} processes started at once (ms):\n")
    print("| | init p50 | init p99 | spawn-to-exit p50 | spawn-to-exit p99 |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for label in bursts:
        inits, walls = bursts[label]
        print(f"| {label} | {percentile(inits, 50):.2f} | {percentile(inits, 99):.2f} | "
              f"{percentile(walls, 50):.1f} | {percentile(walls, 99):.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
