"""SM share accuracy on the simulated GPU, through libvgpu.so.

For each limit (10/30/60/100 %, policy `force`) one process keeps a simulated
device busy with fixed kernels for 10 s while an unlimited process does the
same on a second simulated device (so both see the same CPU load); the ratio
of their throughputs is the achieved share, and jitter is the largest distance
of one second's share from the limit. Then two `force` containers (separate
regions) at 30 and 70 % run on one device at once (window opening after 2 s)
and their split is reported.

Policy `default` (work-conserving): a 30 % container alone (share of the
unlimited rate), two busy containers at 30 and 60 % (each one's share), and
switching: a 30 % container runs alone, a 60 % neighbour container works from
3 s to 6 s of the window; from the 30 % container's completions per 100 ms,
how long after the neighbour's first launch it was held (the next three
tenths average at most share + 10 points) and how long after the neighbour's
last launch it ran free again (three tenths averaging at least 90 %). Each
time is counted to the end of the first such tenth: a bound, to 100 ms.

    .venv/bin/python bench/sm_accuracy.py [--seconds 10] [--kernel-us 10000]
"""
import argparse
import os
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "libvgpu"))
import sm_load  # noqa: E402
from sm_load import Load  # noqa: E402

LEVELS = [10, 30, 60, 100]
SWITCH_RUNS = 3
NEIGHBOUR_AT, NEIGHBOUR_FOR, SWITCH_WINDOW = 3.0, 3.0, 9.0
HELD_MARGIN, FREE_LEVEL, SETTLE = 10.0, 90.0, 3


def switching(work: Path, kernel_us: int, share: int = 30, neighbour: int = 60) -> tuple[float, float]:
    """Seconds from the neighbour's first launch until held, and from its last until free."""
    tag = uuid.uuid4().hex
    ours = Load(region=work / f"sw-{tag}.region", sm_limit=share, policy="default")
    other = Load(region=work / f"swn-{tag}.region", sm_limit=neighbour, policy="default")
    ref = Load(region=work / f"swr-{tag}.region")
    start_at = time.monotonic_ns() + int(sm_load.WARMUP_S * 1e9)
    ref_proc = sm_load.start(ref, work / f"swr-{tag}.state", SWITCH_WINDOW, start_at, kernel_us)
    proc = sm_load.start(ours, work / f"sw-{tag}.state", SWITCH_WINDOW, start_at, kernel_us)
    other_at = start_at + int(NEIGHBOUR_AT * 1e9)
    time.sleep(max(0.0, (other_at - time.monotonic_ns()) / 1e9 - 0.3))
    other_proc = sm_load.start(other, work / f"sw-{tag}.state", NEIGHBOUR_FOR, other_at, kernel_us)
    result, reference = sm_load.finish(proc, SWITCH_WINDOW), sm_load.finish(ref_proc, SWITCH_WINDOW)
    neighbour = sm_load.finish(other_proc, NEIGHBOUR_FOR)
    tenths = [100.0 * n / max(r, 1) for n, r in zip(result["per_tenth"], reference["per_tenth"])]
    began = NEIGHBOUR_AT + max(neighbour["ready_s"], -NEIGHBOUR_AT)  # launching began (window time)
    ended = NEIGHBOUR_AT + NEIGHBOUR_FOR                                # its last launch

    def first(after: float, ok) -> float:
        for k in range(int(after * 10), len(tenths) - SETTLE + 1):
            if ok(sum(tenths[k:k + SETTLE]) / SETTLE):
                return (k + 1) / 10 - after
        return float("nan")

    return (first(began, lambda p: p <= share + HELD_MARGIN), first(ended, lambda p: p >= FREE_LEVEL))


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

        load = os.getloadavg()[0]
        print(f"kernel {args.kernel_us} us, window {args.seconds} s, {os.cpu_count()} CPUs, "
              f"load average {load:.2f} at the start\n")
        print("| `force` limit % | achieved % | error (points) | jitter (points) | per-second % |")
        print("| --- | --- | --- | --- | --- |")
        for level in LEVELS:
            m = measure([Load(region=work / f"l{level}.region", sm_limit=level, policy="force")])
            series = " ".join(f"{p:.1f}" for p in m.per_second())
            print(f"| {level} | {m.share():.1f} | {m.share() - level:+.1f} | {m.jitter(level):.1f} | "
                  f"{series} |")

        # the window opens after 2 s: the occupancy correction starts after one
        m = measure([Load(region=work / "c30.region", sm_limit=30, policy="force"),
                     Load(region=work / "c70.region", sm_limit=70, policy="force")], warmup_s=2.0)
        print("\n| two `force` containers | share of unlimited % | share of the pair % |")
        print("| --- | --- | --- |")
        print(f"| limit 30 | {m.share(0):.1f} | {m.split(0):.1f} |")
        print(f"| limit 70 | {m.share(1):.1f} | {m.split(1):.1f} |")

        alone = measure([Load(region=work / "d30.region", sm_limit=30, policy="default")])
        pair = measure([Load(region=work / "p30.region", sm_limit=30, policy="default"),
                        Load(region=work / "p60.region", sm_limit=60, policy="default")], warmup_s=2.0)
        print("\n| `default` | target % | share of unlimited % | error (points) | jitter (points) "
              "| per-second % |")
        print("| --- | --- | --- | --- | --- | --- |")
        for name, m, i, target in (("limit 30, alone", alone, 0, 100),
                                    ("limit 30, beside a busy 60", pair, 0, 30),
                                    ("limit 60, beside a busy 30", pair, 1, 60)):
            series = " ".join(f"{p:.1f}" for p in m.per_second(i))
            print(f"| {name} | {target} | {m.share(i):.1f} | {m.share(i) - target:+.1f} | "
                  f"{m.jitter(target, i):.1f} | {series} |")

        runs = [switching(work, args.kernel_us) for _ in range(SWITCH_RUNS)]
        print("\n| `default` 30 %, a 60 % neighbour comes and goes | held after (ms) | free after (ms) |")
        print("| --- | --- | --- |")
        for i, (held, free) in enumerate(runs, 1):
            print(f"| run {i} | {held * 1000:.0f} | {free * 1000:.0f} |")
        print(f"\nload average {os.getloadavg()[0]:.2f} at the end")
    return 0


if __name__ == "__main__":
    sys.exit(main())
