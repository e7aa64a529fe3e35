"""SM share accuracy on the simulated GPU, through libvgpu.so.

For each limit (10/30/60/100 %, policy `force`) one process keeps a simulated
device busy with fixed kernels for 10 s while an unlimited process does the
same on a second simulated device (so both see the same CPU load); the ratio
of their throughputs is the achieved share, and jitter is the largest distance
of one second's share from the limit. The same for graph replays at 30 and 60 %:
a graph of one kernel node, and a graph captured from a stream (four kernels of a
quarter each), every replay keeping the device busy as long as one kernel. Then two `force` containers (separate
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

Priority (a board in the work dir, as the runtime makes it; idle time 200 ms):
a high-priority process alone, then next to a busy low-priority one (both
start together), each against its own unlimited reference: the ratio of the
two shares is what the neighbour costs the high one. Then a low-priority
process runs alone while a high-priority one works from 3 s to 6 s of the
window: how long after the high one's first launch the low one was paused
(three tenths averaging at most 10 %), and how long after its last launch the
low one ran again (three tenths averaging at least 90 %); the high one's queue
(16 launches) drains after its last launch, then the idle time runs. Every
launch of the low one completed (sm_load waits for each; launched = retired).
In the pair, the low one keeps the GPU busy from 2 s before the high one starts.

Containers (--only containers): the same kernel loop in containers made by
hami-runtime with real runc on one simulated card (each in its own pid
namespace, as workloads run), an unlimited container on the node's other card
as the reference in the same seconds: two busy containers at 30+30 and 20+80 %
under `default` and under `force`, three at 20+30+40 % under `default`, one
alone under `default`, in kernels per second and in % of the reference (as root:
runc). Its window and kernel are --container-seconds (8) and --container-kernel-us
(1000: the figures the `default` policy was first measured with between containers).

    .venv/bin/python bench/sm_accuracy.py [--seconds 10] [--kernel-us 10000] [--only priority|containers|graphs]
"""
import argparse
import json
import os
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "tests" / "libvgpu"), str(ROOT)]
import sm_load  # noqa: E402
from sm_load import Load  # noqa: E402

LEVELS = [10, 30, 60, 100]
GRAPH_LEVELS = [30, 60]
SWITCH_RUNS = 3
NEIGHBOUR_AT, NEIGHBOUR_FOR, SWITCH_WINDOW = 3.0, 3.0, 9.0
HELD_MARGIN, FREE_LEVEL, SETTLE = 10.0, 90.0, 3
PRIORITY_IDLE_MS = 200
PAUSED_LEVEL = 10.0


def first_tenth(tenths: list[float], after: float, ok) -> float:
    """Seconds from `after` to the end of the first tenth from which SETTLE tenths average ok."""
    for k in range(int(after * 10), len(tenths) - SETTLE + 1):
        if ok(sum(tenths[k:k + SETTLE]) / SETTLE):
            return (k + 1) / 10 - after
    return float("nan")


def priority_load(work: Path, name: str, high: bool) -> Load:
    """A container on the priority board (as hami_runtime/lifecycle/node_state/boards.py makes it)."""
    board = work / "board" / sm_load.CARD_UUID
    board.mkdir(parents=True, exist_ok=True)
    load = Load(region=work / f"{name}.region", env=(
        ("CUDA_PRIORITY_BOARD", str(work / "board")), ("CUDA_PRIORITY_IDLE_MS", str(PRIORITY_IDLE_MS))))
    stamp = sm_load.container_stamp(load.region)
    if high:
        os.link(stamp, board / name)
    return load


def neighbour_run(work: Path, ours: Load, other: Load, tag: str, kernel_us: int):
    """`ours` runs a switching window beside an unlimited reference (its own GPU);
    `other` joins ours on the same GPU NEIGHBOUR_AT seconds in, for NEIGHBOUR_FOR.
    (ours' rate per tenth in % of the reference, window time of the neighbour's
    first launch, of its last launch, ours' result, the neighbour's result)."""
    ref = Load(region=work / f"ref-{tag}.region")
    start_at = time.monotonic_ns() + int(sm_load.WARMUP_S * 1e9)
    ref_proc = sm_load.start(ref, work / f"ref-{tag}.state", SWITCH_WINDOW, start_at, kernel_us)
    proc = sm_load.start(ours, work / f"{tag}.state", SWITCH_WINDOW, start_at, kernel_us)
    other_at = start_at + int(NEIGHBOUR_AT * 1e9)
    time.sleep(max(0.0, (other_at - time.monotonic_ns()) / 1e9 - 0.3))
    other_proc = sm_load.start(other, work / f"{tag}.state", NEIGHBOUR_FOR, other_at, kernel_us)
    result, reference = sm_load.finish(proc, SWITCH_WINDOW), sm_load.finish(ref_proc, SWITCH_WINDOW)
    neighbour = sm_load.finish(other_proc, NEIGHBOUR_FOR)
    tenths = [100.0 * n / max(r, 1) for n, r in zip(result["per_tenth"], reference["per_tenth"])]
    began = NEIGHBOUR_AT + max(neighbour["ready_s"], -NEIGHBOUR_AT)  # launching began (window time)
    ended = NEIGHBOUR_AT + NEIGHBOUR_FOR                                # its last launch
    return tenths, began, ended, result, neighbour


def priority_switch(work: Path, kernel_us: int) -> tuple[float, float, float, dict]:
    """Seconds from a high-priority neighbour's first launch until the low one is
    paused, from its last launch until the low one runs again, from its last launch
    until its last kernel ended; the low one's result."""
    tag = uuid.uuid4().hex[:8]
    low, high = priority_load(work, f"sl-{tag}", False), priority_load(work, f"sh-{tag}", True)
    tenths, began, ended, result, neighbour = neighbour_run(work, low, high, f"s-{tag}", kernel_us)
    return (first_tenth(tenths, began, lambda p: p <= PAUSED_LEVEL),
            first_tenth(tenths, ended, lambda p: p >= FREE_LEVEL), neighbour["last_s"] - NEIGHBOUR_FOR, result)


def priority_beside(work: Path, seconds: int, kernel_us: int, low: bool) -> sm_load.Measurement:
    """A high-priority process over a window; with `low`, a low-priority one keeps
    the same GPU busy from 2 s before the high one starts, and on through the window."""
    tag = uuid.uuid4().hex[:8]
    high_load = priority_load(work, f"ph-{tag}", True)
    state = work / f"p-{tag}.state"
    start_at = time.monotonic_ns() + int((sm_load.WARMUP_S + (2.0 if low else 0.0)) * 1e9)
    ref_proc = sm_load.start(Load(region=work / f"pr-{tag}.region"), work / f"pr-{tag}.state", seconds,
                             start_at, kernel_us)
    low_proc = sm_load.start(priority_load(work, f"pl-{tag}", False), state, seconds, start_at,
                             kernel_us) if low else None
    time.sleep(max(0.0, (start_at - time.monotonic_ns()) / 1e9 - sm_load.WARMUP_S))
    high_proc = sm_load.start(high_load, state, seconds, start_at, kernel_us)
    results = [sm_load.finish(high_proc, seconds)] + ([sm_load.finish(low_proc, seconds)] if low else [])
    return sm_load.Measurement(results, sm_load.finish(ref_proc, seconds))


def priority_section(work: Path, seconds: int, kernel_us: int) -> None:
    alone = priority_beside(work, seconds, kernel_us, low=False)
    beside = priority_beside(work, seconds, kernel_us, low=True)
    print(f"\n| priority (idle {PRIORITY_IDLE_MS} ms) | share of unlimited % | per-second % |")
    print("| --- | --- | --- |")
    for name, m, i in (("high alone", alone, 0), ("high beside a busy low", beside, 0),
                       ("the busy low beside it", beside, 1)):
        series = " ".join(f"{p:.1f}" for p in m.per_second(i))
        print(f"| {name} | {m.share(i):.1f} | {series} |")
    low = beside.results[1]
    print(f"\nhigh beside a busy low / high alone: {100.0 * beside.share(0) / alone.share(0):.1f} %; "
          f"the low one launched {low['launched']}, all completed (sm_load waits for each)")
    runs = [priority_switch(work, kernel_us) for _ in range(SWITCH_RUNS)]
    print("\n| low, a high-priority neighbour works 3 s | paused after its first launch (ms) "
          "| resumed after its last launch (ms) | ... after its last kernel ended (ms) "
          "| low launched (all completed) |")
    print("| --- | --- | --- | --- | --- |")
    for i, (paused, resumed, drained, result) in enumerate(runs, 1):
        print(f"| run {i} | {paused * 1000:.0f} | {resumed * 1000:.0f} | {(resumed - drained) * 1000:.0f} "
              f"| {result['launched']} |")


CONTAINER_SPLITS = [("30 + 30", [30, 30], ("default", "force")), ("20 + 80", [20, 80], ("default", "force")),
                    ("20 + 30 + 40", [20, 30, 40], ("default",)), ("30 alone", [30], ("default",))]


def containers_together(node, cores, policy, seconds, kernel_us) -> tuple[list[dict], dict]:
    """Containers with these SM shares busy on card 0 and the reference on card 1,
    one window: their reports and the reference's."""
    cards = [g["uuid"] for g in json.loads(node.hamictl("gpus", "--json").stdout)]
    start_at = time.monotonic_ns() + int(2.0 * 1e9)    # containers start and make contexts first
    tag = uuid.uuid4().hex[:8]
    procs = [(f"c{i}-{tag}", node.start_load(f"c{i}-{tag}", {
        "hami.io/gpumem": "1000", "hami.io/gpu-uuid": cards[0], "hami.io/gpucores": str(share),
        "hami.io/core-policy": policy}, seconds, start_at, kernel_us)) for i, share in enumerate(cores)]
    ref = node.start_load(f"ref-{tag}", {"hami.io/gpumem": "1000", "hami.io/gpu-uuid": cards[1]},
                          seconds, start_at, kernel_us)
    results = [node.load_result(cid, proc) for cid, proc in procs]
    return results, node.load_result(f"ref-{tag}", ref)


def containers_section(work: Path, seconds: int, kernel_us: int) -> None:
    from tests.runtime.node import Node, copy_sim, make_rootfs, sim_missing, spec_template
    if sim_missing():
        raise SystemExit(f"run `make build sim` first: {sim_missing()} is missing")
    for sub in ("root", "rootfs", "spec", "node"):
        (work / sub).mkdir()
    node = Node(work / "node", make_rootfs(work / "rootfs"), spec_template(work / "spec"), copy_sim(work / "root"))
    try:
        print(f"\ncontainers through hami-runtime + runc on one simulated card: kernel {kernel_us} us, "
              f"window {seconds} s; kernels per second (% of the unlimited reference container on the "
              "other card, same seconds)\n")
        print("| busy containers, SM shares % | `default` | `force` |")
        print("| --- | --- | --- |")
        for label, cores, policies in CONTAINER_SPLITS:
            cells = []
            for policy in ("default", "force"):
                if policy not in policies:
                    cells.append("-")
                    continue
                results, ref = containers_together(node, cores, policy, seconds, kernel_us)
                cells.append(" + ".join(f"{r['completed'] / seconds:.0f} ({100.0 * r['completed'] / ref['completed']:.1f} %)"
                                        for r in results))
            print(f"| {label} | {cells[0]} | {cells[1]} |")
        print(f"\nthe reference alone on its card: {ref['completed'] / seconds:.0f} kernels per second")
    finally:
        node.cleanup()


def switching(work: Path, kernel_us: int, share: int = 30, neighbour: int = 60) -> tuple[float, float]:
    """Seconds from the neighbour's first launch until held, and from its last until free."""
    tag = uuid.uuid4().hex
    ours = Load(region=work / f"sw-{tag}.region", sm_limit=share, policy="default")
    other = Load(region=work / f"swn-{tag}.region", sm_limit=neighbour, policy="default")
    tenths, began, ended, _, _ = neighbour_run(work, ours, other, f"sw-{tag}", kernel_us)
    return (first_tenth(tenths, began, lambda p: p <= share + HELD_MARGIN),
            first_tenth(tenths, ended, lambda p: p >= FREE_LEVEL))


def graph_section(work: Path, measure) -> None:
    print("\n| graph replays, `force` | limit % | achieved % | error (points) | jitter (points) |")
    print("| --- | --- | --- | --- | --- |")
    for mode, name in (("graph", "one kernel node"), ("captured", "captured from a stream, 4 kernels")):
        for level in GRAPH_LEVELS:
            m = measure([Load(region=work / f"g{mode}{level}.region", sm_limit=level, policy="force",
                              mode=mode)])
            print(f"| {name} | {level} | {m.share():.1f} | {m.share() - level:+.1f} | {m.jitter(level):.1f} |")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=int, default=10)
    parser.add_argument("--kernel-us", type=int, default=sm_load.KERNEL_US)
    parser.add_argument("--container-seconds", type=int, default=8)
    parser.add_argument("--container-kernel-us", type=int, default=1000)
    parser.add_argument("--only", choices=["priority", "containers", "graphs"], help="run only this part")
    args = parser.parse_args()
    sm_load.build()
    with tempfile.TemporaryDirectory(prefix="hami-sm-bench-") as tmp:
        work = Path(tmp)

        def measure(loads, warmup_s=sm_load.WARMUP_S):
            return sm_load.measure(loads, work, args.seconds, args.kernel_us, warmup_s)

        load = os.getloadavg()[0]
        print(f"kernel {args.kernel_us} us, window {args.seconds} s, {os.cpu_count()} CPUs, "
              f"load average {load:.2f} at the start\n")
        if args.only:
            section = {"priority": lambda: priority_section(work, args.seconds, args.kernel_us),
                       "graphs": lambda: graph_section(work, measure),
                       "containers": lambda: containers_section(work, args.container_seconds,
                                                                args.container_kernel_us)}[args.only]
            section()
            print(f"\nload average {os.getloadavg()[0]:.2f} at the end")
            return 0
        print("| `force` limit % | achieved % | error (points) | jitter (points) | per-second % |")
        print("| --- | --- | --- | --- | --- |")
        for level in LEVELS:
            m = measure([Load(region=work / f"l{level}.region", sm_limit=level, policy="force")])
            series = " ".join(f"{p:.1f}" for p in m.per_second())
            print(f"| {level} | {m.share():.1f} | {m.share() - level:+.1f} | {m.jitter(level):.1f} | "
                  f"{series} |")

        graph_section(work, measure)

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
        priority_section(work, args.seconds, args.kernel_us)
        containers_section(work, args.container_seconds, args.container_kernel_us)
        print(f"\nload average {os.getloadavg()[0]:.2f} at the end")
    return 0


if __name__ == "__main__":
    sys.exit(main())
