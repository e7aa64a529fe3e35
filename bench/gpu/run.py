"""libvgpu on a real NVIDIA GPU: memory limit, SM share as GPU time, policies, CUDA graphs,
an LLM decode loop of CUDA graphs (bench/decode_probe.py), a torch.compile(mode="reduce-overhead")
model, overhead, init, spill cost.

Needs an NVIDIA driver, PyTorch (run it with the Python whose torch sees the GPU) and
`make build` (build/libvgpu.so). Runs bench/gpu/driver_probe.py and bench/gpu/torch_probe.py in
fresh processes, native and under libvgpu, side by side in one run, and prints markdown tables
plus the machine they were measured on. `--json FILE` also writes them as data (what
`make gpu-check`'s report is made from); `--budget S` skips the sections that no longer fit
in S seconds (named in the output).

    python3 bench/gpu/run.py [--seconds 5] [--budget 300] [--json out.json] [--only sm,graph]

SM rows are GPU time: the share of the window the kernels themselves took (driver_probe: a
kernel filling every SM, timed by its own clock; torch_probe --profile: the profiler's kernel
times), not throughput.
"""
import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import gpu_env  # noqa: E402
import report  # noqa: E402

LIMIT_MIB = 4096
SPILL_MIB = 4096
DECODE_PROBE = gpu_env.ROOT / "bench" / "decode_probe.py"
INIT_COSTS = gpu_env.ROOT / "bench" / "gpu" / "init_costs.py"
FORCE = {"GPU_CORE_UTILIZATION_POLICY": "force"}


def _run(argv, env_extra, timeout):
    out = subprocess.run(argv, env=gpu_env.clean_env(**env_extra), capture_output=True, text=True, timeout=timeout)
    if out.returncode != 0:
        raise RuntimeError(gpu_env.failure(argv, out))
    return json.loads(out.stdout.strip().splitlines()[-1])


def probe(args, env_extra=None, timeout=600):
    """torch_probe.py, with this interpreter (its torch)."""
    return _run([sys.executable, str(gpu_env.TORCH_PROBE), *map(str, args)], env_extra or {}, timeout)


def dprobe(args, env_extra=None, timeout=300):
    """driver_probe.py (no torch needed)."""
    return _run([sys.executable, str(gpu_env.DRIVER_PROBE), *map(str, args)], env_extra or {}, timeout)


def limited(**env):
    return {"LD_PRELOAD": str(gpu_env.LIBVGPU), **{k: str(v) for k, v in env.items()}}


def section(title, columns, rows, note=""):
    return {"title": title, "columns": columns, "rows": rows, "note": note}


def f1(x):
    return "-" if x is None else f"{x:.1f}"


class HostUsage:
    """Largest memory nvidia-smi (outside libvgpu) shows for any process while active."""

    def __init__(self):
        self.peak_mib = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)

    def _poll(self):
        while not self._stop.is_set():
            for row in gpu_env.smi_apps():
                self.peak_mib = max(self.peak_mib, row)
            time.sleep(0.1)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()


def memory_rows(_seconds):
    rows = []
    for label, extra in [("native allocator", {}),
                         ("cudaMallocAsync", {"PYTORCH_CUDA_ALLOC_CONF": "backend:cudaMallocAsync"})]:
        with HostUsage() as host:
            got = probe(["memory"], limited(CUDA_DEVICE_MEMORY_LIMIT_0=f"{LIMIT_MIB}m", **extra))
        rows.append((label, got, host.peak_mib))
    with tempfile.TemporaryDirectory() as tmp:
        env = limited(CUDA_DEVICE_MEMORY_LIMIT_0=f"{LIMIT_MIB}m", CUDA_DEVICE_MEMORY_SHARED_CACHE=f"{tmp}/vgpu.region")
        holder = subprocess.Popen(
            [sys.executable, "-c",
             "import torch,sys,time; x=torch.empty(1024<<20,dtype=torch.uint8,device='cuda');"
             "print('ready',flush=True); time.sleep(600)"],
            env=gpu_env.clean_env(**env), stdout=subprocess.PIPE, text=True)
        try:
            assert holder.stdout.readline().strip() == "ready"
            with HostUsage() as host:
                got = probe(["memory"], env)
            rows.append(("second process, 1 GiB held by another", got, host.peak_mib))
        finally:
            holder.kill()
            holder.wait()
    return section(
        f"Memory, CUDA_DEVICE_MEMORY_LIMIT_0={LIMIT_MIB}m",
        ["case", "mem_get_info total MiB", "free MiB", "allocator cache MiB", "free after empty_cache MiB",
         "largest torch.empty MiB", "first refused MiB", "host peak MiB"],
        [[label, f"{g['mem_get_info_total_mib']:.0f}", f"{g['mem_get_info_free_mib']:.0f}",
          f"{g['allocator_cached_mib']:.0f}", f"{g['free_after_empty_cache_mib']:.0f}", g["largest_ok_mib"],
          g["first_refused_mib"], peak] for label, g, peak in rows],
        "free + allocator cache = the largest tensor: the cache (cudaMallocAsync's pool granule) is "
        "taken from the card, so it is not free, to the driver or to libvgpu's view.")


def sm_time_rows(seconds, kernels=(50, 1000, 5000), levels=(10, 30, 60)):
    rows = []
    for us in kernels:
        base = dprobe(["busy", "--kernel-us", us, "--seconds", seconds], limited())
        row = [us, f1(base["kernel_us_median"]), f1(base["busy_pct"])]
        for pct in levels:
            got = dprobe(["busy", "--kernel-us", us, "--seconds", seconds],
                         limited(CUDA_DEVICE_SM_LIMIT=pct, **FORCE))
            jitter = max(abs(s - pct) for s in got["per_second_pct"])
            row.append(f"{got['busy_pct']:.1f} ({jitter:.1f})")
        rows.append(row)
    return section(
        f"SM share as GPU time, `force`, a kernel filling every SM, {seconds} s each",
        ["kernel µs", "measured µs", "libvgpu, no limit: busy %"] + [f"{p} %: busy % (jitter)" for p in levels],
        rows, "busy % = the kernels' own time (their %globaltimer) over the window; jitter = the largest "
              "per-second deviation from the limit, in points.")


def policy_rows(seconds):
    uuid = gpu_env.device0()["uuid"]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        env = gpu_env.container_env(work, "alone", uuid, board=work / "board-alone")
        got = dprobe(["busy", "--kernel-us", 1000, "--seconds", seconds],
                     limited(CUDA_DEVICE_SM_LIMIT=30, GPU_CORE_UTILIZATION_POLICY="default", **env))
        rows.append(["30 %, `default`, alone on its board", f1(got["busy_pct"]), "-"])
        for policy in ("default", "force"):
            board = work / f"board-{policy}"
            start_at = time.clock_gettime_ns(time.CLOCK_MONOTONIC) + 4_000_000_000
            procs = []
            for pct in (30, 70):
                env = gpu_env.container_env(work, f"{policy}{pct}", uuid, board=board)
                procs.append(subprocess.Popen(
                    [sys.executable, str(gpu_env.DRIVER_PROBE), "busy", "--kernel-us", "1000", "--seconds",
                     str(seconds), "--mode", "work", "--start-at", str(start_at)],
                    env=gpu_env.clean_env(**limited(CUDA_DEVICE_SM_LIMIT=pct, GPU_CORE_UTILIZATION_POLICY=policy,
                                                    **env)),
                    stdout=subprocess.PIPE, text=True))
            got = [json.loads(p.communicate(timeout=300)[0].strip().splitlines()[-1]) for p in procs]
            work_done = [g["kernels_in_window"] for g in got]
            split = 100 * work_done[0] / sum(work_done)
            rows.append([f"two containers, 30 % and 70 %, `{policy}`", f"{split:.1f} : {100 - split:.1f}",
                         f"{work_done[0]:.0f} : {work_done[1]:.0f}"])
    return section(f"SM policies, a kernel filling every SM, {seconds} s",
                   ["case", "busy % / split of the GPU's time", "kernels completed"], rows,
                   "Each container has its own region and its activity stamp on one board, as the runtime "
                   "makes them. The pairs run the same fixed-work kernel in the same window: the kernels each "
                   "completes split the GPU's time.")


def matmul_rows(seconds):
    native = probe(["sm", "--seconds", seconds])
    base = probe(["sm", "--seconds", seconds], limited())
    rows = [["native (no libvgpu)", f1(native["mean"]), "-", "-"],
            ["libvgpu, no limit", f1(base["mean"]), f"{100 * base['mean'] / native['mean']:.1f} % of native", "-"]]
    for pct in (30, 60):
        got = probe(["sm", "--seconds", seconds, "--profile"], limited(CUDA_DEVICE_SM_LIMIT=pct, **FORCE))
        rows.append([f"{pct} %, `force`", f1(got["mean"]), f"{100 * got['mean'] / base['mean']:.1f} % of unlimited",
                     f"{f1(got['busy_pct'])} (kernel {f1(got['kernel_us_median'])} µs)"])
    return section(f"fp16 4096² matmul (PyTorch), {seconds} s each",
                   ["case", "matmul/s", "rate", "GPU time % (profiler)"], rows,
                   "The rate is throughput; the share libvgpu holds is the GPU-time column.")


def graph_rows(seconds):
    uuid = gpu_env.device0()["uuid"]
    base = ["graph", "--seconds", seconds, "--matmuls", 8, "--profile"]
    mem = {"CUDA_DEVICE_MEMORY_LIMIT_0": f"{LIMIT_MIB}m"}
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        cases = [("memory limit alone", limited(**mem), ["--oversize-mib", 2 * LIMIT_MIB]),
                 ("memory limit + 30 %, `force`", limited(**mem, CUDA_DEVICE_SM_LIMIT=30, **FORCE), []),
                 ("memory limit + 30 %, `default`, alone on its board",
                  limited(**mem, CUDA_DEVICE_SM_LIMIT=30, GPU_CORE_UTILIZATION_POLICY="default",
                          **gpu_env.container_env(Path(tmp), "alone", uuid, board=Path(tmp) / "board")), [])]
        for label, env, extra in cases:
            got = probe(base + extra, env)
            refusal = got.get("oversize_refusal")
            rows.append([label, "yes" if got["capture_ok"] else f"no: {got.get('error')}",
                         f1(got.get("replays_mean")), f1(got.get("busy_pct")),
                         "-" if not extra else (refusal["error"] if refusal else "not refused")])
    return section(f"CUDA graphs: torch.cuda.graph of 8 fp16 4096² matmuls, replayed {seconds} s",
                   ["case", "capture", "replays/s", "GPU time % (profiler)",
                    f"captured {2 * LIMIT_MIB} MiB allocation"], rows)


def decode_rows(seconds):
    """bench/decode_probe.py (a decoder captured as CUDA graphs for four batch sizes, its KV cache
    sized from mem_get_info as vLLM does, each replay checked against eager) bare, in a slice
    with no SM limit and in the slice at 30 % `force`."""
    mem = {"CUDA_DEVICE_MEMORY_LIMIT_0": f"{LIMIT_MIB}m"}
    cases = [("bare (no libvgpu)", {}), (f"{LIMIT_MIB} MiB slice, no SM limit", limited(**mem)),
             (f"{LIMIT_MIB} MiB slice, 30 %, `force`", limited(**mem, CUDA_DEVICE_SM_LIMIT=30, **FORCE))]
    rows, bare = [], None
    for label, env in cases:
        got = _run([sys.executable, str(DECODE_PROBE), "--seconds", str(seconds)], env, 180)
        bare = bare or got["replays_per_s"]
        check = got["eager_check"]
        diff = max(check["max_abs_diff"].values()) if "max_abs_diff" in check else None
        rows.append([label, f"{got['total_mib']:.0f}", f"{got['kv_cache_mib']:.0f}", f"{got['capture_s']:.2f}",
                     f"{got['replay_gpu_ms']:.3f}", f1(got["replays_per_s"]), f1(got["busy_percent"]),
                     f"{100 * got['replays_per_s'] / bare:.1f} %",
                     check["status"] + ("" if diff is None else f" (max abs diff {diff:.2g})")])
    return section(f"LLM decode loop (bench/decode_probe.py): 4 batch sizes captured as CUDA graphs, float16, "
                   f"{seconds} s of replays",
                   ["case", "card seen MiB", "KV cache MiB", "capture s", "replay GPU ms", "replays/s", "GPU busy %",
                    "rate vs bare", "replay vs eager"], rows,
                   "GPU busy % = replays x one replay's GPU time (CUDA events, alone) over the wall time. Each "
                   "graph is replayed on fresh inputs and compared with the step run eagerly (torch.allclose); "
                   "a mismatch fails the section.")


def _checked(got) -> str:
    return got["eager_check"] + (f" (max abs diff {got['max_abs_diff']:.2g})" if "max_abs_diff" in got else "")


def compiled_rows(seconds):
    """torch.compile(mode="reduce-overhead") of 6 fp16 Linear+GELU 4096 layers, batch 64: native, and
    at 30 % `force` with the kernels' GPU time by the profiler (the share)."""
    base = ["compiled", "--seconds", seconds]
    native = probe(base, timeout=300)
    held = probe(base + ["--profile"], limited(CUDA_DEVICE_SM_LIMIT=30, **FORCE), timeout=300)
    rows = [["native (no libvgpu)", f1(native["compile_s"]), f1(native["calls_mean"]), "-", "-", _checked(native)],
            ["30 %, `force`", f1(held["compile_s"]), f1(held["calls_mean"]),
             f"{100 * held['calls_mean'] / native['calls_mean']:.1f} % of native",
             f"{f1(held['busy_pct'])} (kernel {f1(held['kernel_us_median'])} µs)", _checked(held)]]
    return section(f'torch.compile(mode="reduce-overhead"): 6 fp16 Linear+GELU 4096 layers, batch 64, {seconds} s',
                   ["case", "compile s (first 3 calls)", "calls/s", "rate", "GPU time % (profiler)",
                    "output vs eager"], rows,
                   "Inductor's kernels replayed as CUDA graph trees; the share libvgpu holds is the GPU-time "
                   "column. An output off eager (torch.allclose, 1 % of the output's scale) fails the probe.")


def init_rows(_seconds):
    driver, steps = {"native": [], "libvgpu": []}, {"native": [], "libvgpu": []}
    for _ in range(9):
        for label, env in (("native", {}), ("libvgpu", limited())):
            got = dprobe(["init"], env)
            driver[label].append(got["driver_init_ms"])
            steps[label].append(got)
    torch_init = {"native": [], "libvgpu": []}
    for _ in range(3):
        torch_init["native"].append(probe(["init"])["cuda_init_ms"])
        torch_init["libvgpu"].append(probe(["init"], limited())["cuda_init_ms"])
    added = {step: statistics.median(g[step] for g in steps["libvgpu"])
             - statistics.median(g[step] for g in steps["native"])
             for step in ("cuinit_ms", "context_ms", "first_alloc_ms")}
    rows = []
    for label, got, n, split in (
            ("driver: cuInit + primary context + 1 MiB", driver, 9,
             " / ".join(f1(added[s]) for s in ("cuinit_ms", "context_ms", "first_alloc_ms"))),
            ("PyTorch: import torch, torch.cuda.init, first tensor", torch_init, 3, "-")):
        nat, lib = statistics.median(got["native"]), statistics.median(got["libvgpu"])
        rows.append([label, n, f1(nat), f1(lib), f1(lib - nat), split])
    return section("CUDA init, fresh processes, alternately native and under libvgpu (medians)",
                   ["what", "processes each", "native ms", "libvgpu ms", "added ms",
                    "added at cuInit / context / first allocation ms"], rows)


def nvml_rows(_seconds):
    """init_costs.py: what the NVML calls libvgpu makes around a first context cost, each way."""
    got = _run([sys.executable, str(INIT_COSTS), "--processes", "5"], {}, 120)
    steps = ["cuinit_ms", "nvml_init_ms", "first_handle_ms", "context_ms", "cuinit_and_nvml_init_ms",
             "context_and_nvml_ms"]
    rows = [[way] + (["failed: " + marks["failed"][-200:]] + ["-"] * (len(steps) - 1) if "failed" in marks
                     else [f1(marks.get(step)) for step in steps])
            for way, marks in got.items()]
    return section("NVML around a first context, no libvgpu (init_costs.py, 5 processes a way, medians)",
                   ["way", "cuInit ms", "nvmlInit ms", "first handle ms", "primary context ms",
                    "cuInit with NVML's start ms", "context with NVML's start ms"], rows,
                   "beside_context: NVML started on a thread as the primary context is created; "
                   "where its figure is the context's alone, NVML's start could hide behind it.")


def spill_rows(_seconds):
    card = int(gpu_env.device0()["total_mib"])
    got = probe(["spill", "--mib", SPILL_MIB, "--passes", 5, "--fill"],
                limited(CUDA_OVERSUBSCRIBE="true", CUDA_DEVICE_MEMORY_LIMIT_0=f"{2 * card}m"))
    rows = [["device memory (same process, after)", got["device_managed"], "-", f1(got["device_first_pass_gbs"]),
             f1(got["device_steady_gbs"]), "100.0 %"],
            [f"spilled (card {got['card_free_mib']} MiB free, filled with {got['filler_mib']} MiB first)",
             got["managed"], f"{got['alloc_ms']:.2f}", f1(got["first_pass_gbs"]), f1(got["steady_gbs"]),
             f"{100 * got['steady_gbs'] / got['device_steady_gbs']:.1f} %"]]
    return section(f"Spill to managed memory, {SPILL_MIB} MiB tensor, x.add_(1), {card} MiB card",
                   ["case", "managed", "allocation ms", "first pass GB/s", "steady GB/s", "steady vs device"], rows,
                   f"The filler is freed before the spilled tensor is touched ({got['card_free_at_first_touch_mib']} "
                   "MiB free then): the first pass is the pages' migration to the card.")


def environment():
    dev = gpu_env.device0()
    smi = gpu_env.card()
    try:
        import torch
        versions = {"torch": torch.__version__, "torch_cuda": torch.version.cuda}
    except ImportError:
        versions = {}
    return {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "gpu": dev["name"],
            "memory_mib": smi.get("memory_total_mib"), "driver": smi.get("driver"),
            "cuda_driver_api": dev["cuda_driver_version"], "sms": dev["sms"], **versions,
            "python": platform.python_version(),
            "kernel": platform.release(), "commit": _commit()}


def _commit():
    out = subprocess.run(["git", "-C", str(gpu_env.ROOT), "rev-parse", "--short", "HEAD"], capture_output=True,
                         text=True)
    return out.stdout.strip() or None


SECTIONS = {"memory": (memory_rows, 40), "sm": (sm_time_rows, None), "policy": (policy_rows, None),
            "matmul": (matmul_rows, None), "graph": (graph_rows, None), "decode": (decode_rows, None),
            "compiled": (compiled_rows, None), "init": (init_rows, 60), "nvml": (nvml_rows, 45),
            "spill": (spill_rows, 60)}


def estimate(name, seconds):
    """Seconds a section takes, roughly (to skip what no longer fits the budget)."""
    fixed = SECTIONS[name][1]
    # decode: import, a 0.9-of-the-card cache, capture, the check, 12 timed replays; compiled: ~9 s
    # of compile (the H200, 2026-11-27) and the profiler's trace
    per_run = {"sm": 12 * (seconds + 1), "policy": 3 * seconds + 12, "matmul": 4 * (seconds + 5),
               "graph": 3 * (seconds + 8), "decode": 3 * (seconds + 10), "compiled": 2 * (seconds + 20)}
    return fixed if fixed is not None else per_run[name]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=int, default=10)
    parser.add_argument("--budget", type=float, default=0, help="seconds; 0: no limit")
    parser.add_argument("--json", help="also write the tables as data to this file")
    parser.add_argument("--only", default=",".join(SECTIONS), help="comma list of: " + ", ".join(SECTIONS))
    args = parser.parse_args()
    if not gpu_env.LIBVGPU.exists():
        sys.exit("build/libvgpu.so is missing: run `make build` first")
    reason = gpu_env.no_gpu_reason()
    if reason:
        sys.exit(f"bench/gpu/run.py: {reason}")
    started = time.monotonic()
    env = environment()
    print(report.environment_line(env) + "\n", flush=True)
    done = []
    for name in args.only.split(","):
        func = SECTIONS[name][0]
        left = args.budget - (time.monotonic() - started) if args.budget else None
        if left is not None and left < estimate(name, args.seconds):
            need = estimate(name, args.seconds)
            got = {"title": name, "skipped": f"not run: {left:.0f} s of the budget left, ~{need} s needed"}
        else:
            t0 = time.monotonic()
            try:
                got = func(args.seconds)
            except Exception as exc:                 # one section's failure is reported, the rest still run
                got = {"title": name, "error": f"{type(exc).__name__}: {exc}"}
            got["seconds"] = round(time.monotonic() - t0, 1)
        got["name"] = name
        done.append(got)
        print(report.section_markdown(got), flush=True)
        if args.json:
            Path(args.json).write_text(json.dumps({"environment": env, "sections": done}, indent=1))
    return 1 if any("error" in s for s in done) else 0


if __name__ == "__main__":
    sys.exit(main())
