"""libvgpu's cost on the simulated driver, with and without it, in one run.

Per-call ns of cuMemAlloc/cuMemFree, cuLaunchKernel (zero-length kernel) and
cuMemGetInfo (median of interleaved runs), CUDA init time (cuInit .. first
allocation, in process), and 100 processes starting at once (p50/p99 of each
process's init, and of spawn-to-exit wall time). Prints markdown tables.

    python bench/libvgpu_overhead.py [--calls N] [--repeats R] [--procs P]
"""
import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from stats import percentile

ROOT = Path(__file__).resolve().parent.parent
BUILD = ROOT / "build"
HELPER = BUILD / "bench" / "libvgpu_bench"
LIBVGPU = BUILD / "libvgpu.so"
SIM_LIB = BUILD / "sim" / "lib"


def env_for(tmp: Path, hooked: bool) -> dict:
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LD_LIBRARY_PATH": str(SIM_LIB),
           "HAMI_SIM_STATE": str(tmp / ("hooked.state" if hooked else "plain.state"))}
    if hooked:
        env.update(LD_PRELOAD=str(LIBVGPU), CUDA_DEVICE_MEMORY_LIMIT="8g",
                   CUDA_DEVICE_MEMORY_SHARED_CACHE=str(tmp / "vgpu.region"))
    return env


def fields(text: str) -> dict:
    return {k: float(v) for k, v in (t.split("=") for t in text.split() if "=" in t)}


def run(args, env) -> dict:
    out = subprocess.run([str(HELPER), *args], env=env, capture_output=True, text=True,
                         timeout=120, check=True).stdout
    return fields(out)


def burst(env, procs):
    """`procs` processes started at once: their in-process init and wall times (ms)."""
    started = []
    for _ in range(procs):
        started.append((time.monotonic(), subprocess.Popen([str(HELPER), "init"], env=env,
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
    args = parser.parse_args()
    subprocess.run(["make", "-s", "-C", str(ROOT), "build", "sim", "libvgpu-bench"], check=True,
                   timeout=600)
    metrics = ["alloc_ns", "free_ns", "launch_ns", "getinfo_ns"]
    with tempfile.TemporaryDirectory(prefix="hami-bench-") as tmp_name:
        tmp = Path(tmp_name)
        plain_env, hooked_env = env_for(tmp, False), env_for(tmp, True)
        samples = {True: {m: [] for m in metrics + ["init_ns"]},
                   False: {m: [] for m in metrics + ["init_ns"]}}
        for _ in range(args.repeats):
            for hooked in (False, True):
                env = hooked_env if hooked else plain_env
                for key, value in run(["calls", str(args.calls)], env).items():
                    samples[hooked][key].append(value)
                samples[hooked]["init_ns"].append(run(["init"], env)["init_ns"])
        bursts = {hooked: burst(hooked_env if hooked else plain_env, args.procs)
                  for hooked in (False, True)}

    names = {"alloc_ns": "cuMemAlloc_v2 (4 KiB)", "free_ns": "cuMemFree_v2",
             "launch_ns": "cuLaunchKernel (zero-length)", "getinfo_ns": "cuMemGetInfo_v2"}
    print(f"Simulated driver, {args.calls} calls x {args.repeats} interleaved runs, median.\n")
    print("| call | driver alone (ns) | with libvgpu (ns) | added (ns) | ratio |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for m in metrics:
        a, b = statistics.median(samples[False][m]), statistics.median(samples[True][m])
        print(f"| {names[m]} | {a:.0f} | {b:.0f} | {b - a:+.0f} | {b / a:.2f} |")
    a = statistics.median(samples[False]["init_ns"]) / 1e6
    b = statistics.median(samples[True]["init_ns"]) / 1e6
    print(f"| CUDA init (cuInit .. first alloc, ms) | {a:.2f} | {b:.2f} | {b - a:+.2f} | {b / a:.2f} |")
    print(f"\n{args.procs} processes started at once (ms):\n")
    print("| | init p50 | init p99 | spawn-to-exit p50 | spawn-to-exit p99 |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for hooked in (False, True):
        inits, walls = bursts[hooked]
        label = "with libvgpu" if hooked else "driver alone"
        print(f"| {label} | {percentile(inits, 50):.2f} | {percentile(inits, 99):.2f} | "
              f"{percentile(walls, 50):.1f} | {percentile(walls, 99):.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
