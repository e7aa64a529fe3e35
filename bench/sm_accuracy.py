"""SM share accuracy on the simulated GPU, through libvgpu.so.

For each limit (10/30/60/100 %) one process keeps the device busy with fixed
kernels for 10 s; its throughput against an unlimited run is the achieved
share, and jitter is the largest distance of one second's share from the
limit. Then two containers (separate regions) at 30 and 70 % run at once and
their split is reported.

    .venv/bin/python bench/sm_accuracy.py [--seconds 10] [--kernel-us 4000]
"""
import argparse
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "libvgpu"))
import sm_load  # noqa: E402
from sm_load import Load  # noqa: E402

LEVELS = [10, 30, 60, 100]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=int, default=10)
    parser.add_argument("--kernel-us", type=int, default=sm_load.KERNEL_US)
    args = parser.parse_args()
    sm_load.build()
    with tempfile.TemporaryDirectory(prefix="hami-sm-bench-") as tmp:
        base = Path(tmp)
        state = base / "sim.state"

        def measure(loads):
            return sm_load.run_together(loads, state, args.seconds, args.kernel_us)

        unlimited = sm_load.rate(measure([Load(region=base / "unlimited.region")])[0])
        print(f"kernel {args.kernel_us} us, window {args.seconds} s, "
              f"unlimited {unlimited:.1f} kernels/s\n")
        print("| limit % | achieved % | error (points) | jitter (points) | per-second % |")
        print("| --- | --- | --- | --- | --- |")
        for level in LEVELS:
            result = measure([Load(region=base / f"l{level}.region", sm_limit=level)])[0]
            achieved = sm_load.share_pct(result, unlimited)
            target = min(level, 100)
            series = " ".join(f"{p:.1f}" for p in sm_load.per_second_pct(result, unlimited))
            print(f"| {level} | {achieved:.1f} | {achieved - target:+.1f} | "
                  f"{sm_load.jitter_pct(result, unlimited, target):.1f} | {series} |")

        low, high = measure([Load(region=base / "c30.region", sm_limit=30),
                             Load(region=base / "c70.region", sm_limit=70)])
        split = 100.0 * low["completed"] / (low["completed"] + high["completed"])
        print("\n| two containers | share of unlimited % | share of the pair % |")
        print("| --- | --- | --- |")
        print(f"| limit 30 | {sm_load.share_pct(low, unlimited):.1f} | {split:.1f} |")
        print(f"| limit 70 | {sm_load.share_pct(high, unlimited):.1f} | {100 - split:.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
