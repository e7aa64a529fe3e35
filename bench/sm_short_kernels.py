"""SM share of short kernels as GPU time, on the simulated GPU, through libvgpu.so.

bench/gpu/driver_probe.py `busy` (the probe `make gpu-check` runs on a real GPU) keeps the
device busy with kernels of 10, 20 and 50 us launched from Python (and 5 ms ones, whose first
second shows the bucket's burst), under `force` 30 and 60 %;
busy % is the kernels' own time in the window over the window (the simulator's timeline,
tests/simgpu/cu_stream.c: a launch's CPU time and dispatch are not kernel time). Then two
containers at 30 and 70 % run the same fixed-work kernel (50 us, and 1 ms in 8 s windows as
tests/gpu runs it, with NVML's slowest periods, 1 s) in the same window under `default` and
`force`, and the 30 % one's part of the kernels both completed is reported.

With --baseline PATH (another build of libvgpu.so, e.g. the previous commit's), every row
runs under it too, one after the other in the same run, so both see the same machine.

    .venv/bin/python bench/sm_short_kernels.py [--seconds 5] [--baseline /path/to/libvgpu.so]
"""
import argparse
import os
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "libvgpu"))
import sim_probe  # noqa: E402

KERNELS_US = [10, 20, 50, 5000]
LEVELS = [30, 60]
PAIR_RUNS = [(50, None, 0), (1000, 8, 1000)]   # kernel us, window s (None: --seconds), NVML's period ms (0: the simulator's)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=int, default=5)
    parser.add_argument("--baseline", type=Path, help="another libvgpu.so to measure beside this one")
    args = parser.parse_args()
    builds = [("this build", sim_probe.LIBVGPU)] + ([("baseline", args.baseline)] if args.baseline else [])
    print(f"window {args.seconds} s, {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f} at the start\n")
    print("| libvgpu | kernel us | `force` limit % | GPU busy % | error (points) | first second % | jitter (points) |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for kernel_us in KERNELS_US:
        for level in LEVELS:
            for name, lib in builds:
                with tempfile.TemporaryDirectory(prefix="hami-short-") as tmp:
                    got = sim_probe.alone(Path(tmp), level, kernel_us, args.seconds, lib)
                jitter = max(abs(p - level) for p in got["per_second_pct"])
                print(f"| {name} | {kernel_us} | {level} | {got['busy_pct']:.1f} | {got['busy_pct'] - level:+.1f} | "
                      f"{got['per_second_pct'][0]:.1f} | {jitter:.1f} |", flush=True)
    print("\n| libvgpu | two containers | kernel us | window s | NVML's period | 30 % one's part of the work % |")
    print("| --- | --- | --- | --- | --- | --- |")
    for kernel_us, seconds, period_ms in PAIR_RUNS:
        for policy in ("default", "force"):
            for name, lib in builds:
                with tempfile.TemporaryDirectory(prefix="hami-short-") as tmp:
                    split = sim_probe.pair_split(Path(tmp), policy, kernel_us, seconds or args.seconds, libvgpu=lib,
                                                 nvml_period_ms=period_ms)
                print(f"| {name} | 30 + 70, `{policy}` | {kernel_us} | {seconds or args.seconds} | "
                      f"{f'{period_ms} ms' if period_ms else 'the simulator default'} | {split:.1f} |", flush=True)
    print(f"\nload average {os.getloadavg()[0]:.2f} at the end")
    return 0


if __name__ == "__main__":
    sys.exit(main())
