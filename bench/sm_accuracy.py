"""SM share accuracy on the simulated GPU, through libvgpu.so.

For each limit (10/30/60/100 %) one process keeps a simulated device busy with
fixed kernels for 10 s while an unlimited process does the same on a second
simulated device (so both see the same CPU load); the ratio of their
throughputs is the achieved share, and jitter is the largest distance of one
second's share from the limit. Then two containers (separate regions) at 30
and 70 % run on one device at once (window opening after 2 s) and their split
is reported.

    .venv/bin/python bench/sm_accuracy.py [--seconds 10] [--kernel-us 10000]
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
        work = Path(tmp)

        def measure(loads, warmup_s=sm_load.WARMUP_S):
            return sm_load.measure(loads, work, args.seconds, args.kernel_us, warmup_s)

        print(f"kernel {args.kernel_us} us, window {args.seconds} s\n")
        print("| limit % | achieved % | error (points) | jitter (points) | per-second % |")
        print("| --- | --- | --- | --- | --- |")
        for level in LEVELS:
            m = measure([Load(region=work / f"l{level}.region", sm_limit=level)])
            series = " ".join(f"{p:.1f}" for p in m.per_second())
            print(f"| {level} | {m.share():.1f} | {m.share() - level:+.1f} | {m.jitter(level):.1f} | "
                  f"{series} |")

        # the window opens after 2 s: the occupancy correction starts after one
        m = measure([Load(region=work / "c30.region", sm_limit=30),
                     Load(region=work / "c70.region", sm_limit=70)], warmup_s=2.0)
        print("\n| two containers | share of unlimited % | share of the pair % |")
        print("| --- | --- | --- |")
        print(f"| limit 30 | {m.share(0):.1f} | {m.split(0):.1f} |")
        print(f"| limit 70 | {m.share(1):.1f} | {m.split(1):.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
