"""libvgpu on a real NVIDIA GPU: memory limit, SM share, overhead, init, spill cost.

Needs an NVIDIA driver, PyTorch and `make build` (build/libvgpu.so). Runs
bench/gpu/torch_probe.py in fresh processes, native and under libvgpu, side by
side in one run, and prints markdown tables plus the environment they were
measured on. Usage: python3 bench/gpu/run.py [--seconds 10]
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PROBE = [sys.executable, str(ROOT / "bench/gpu/torch_probe.py")]
LIBVGPU = ROOT / "build/libvgpu.so"
LIMIT_MIB = 4096
SPILL_MIB = 4096


def probe(args, env_extra=None, timeout=600):
    env = dict(os.environ, **(env_extra or {}))
    out = subprocess.run(PROBE + args, env=env, capture_output=True, text=True, timeout=timeout)
    if out.returncode != 0:
        raise RuntimeError(f"probe {args} failed: {out.stderr.strip()[-500:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


FORCE = {"GPU_CORE_UTILIZATION_POLICY": "force"}  # the levels are hard caps; `default` alone is lent the GPU


def limited(**env):
    return {"LD_PRELOAD": str(LIBVGPU), **{k: str(v) for k, v in env.items()}}


class HostUsage:
    """Largest memory nvidia-smi (outside libvgpu) shows for any process while active."""

    def __init__(self):
        self.peak_mib = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)

    def _poll(self):
        while not self._stop.is_set():
            out = subprocess.run(
                ["nvidia-smi", "--query-compute-apps=used_memory", "--format=csv,noheader,nounits"],
                capture_output=True, text=True, env={"PATH": os.environ["PATH"]},
            ).stdout
            for line in out.split():
                if line.strip().isdigit():
                    self.peak_mib = max(self.peak_mib, int(line))
            time.sleep(0.1)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()


def memory_rows():
    rows = []
    for label, extra in [
        ("native allocator", {}),
        ("cudaMallocAsync", {"PYTORCH_CUDA_ALLOC_CONF": "backend:cudaMallocAsync"}),
    ]:
        with HostUsage() as host:
            got = probe(["memory"], limited(CUDA_DEVICE_MEMORY_LIMIT_0=f"{LIMIT_MIB}m", **extra))
        rows.append((label, got, host.peak_mib))
    with tempfile.TemporaryDirectory() as tmp:
        env = limited(CUDA_DEVICE_MEMORY_LIMIT_0=f"{LIMIT_MIB}m",
                      CUDA_DEVICE_MEMORY_SHARED_CACHE=f"{tmp}/vgpu.region")
        holder = subprocess.Popen(
            [sys.executable, "-c",
             "import torch,sys,time; x=torch.empty(1024<<20,dtype=torch.uint8,device='cuda');"
             "print('ready',flush=True); time.sleep(600)"],
            env=dict(os.environ, **env), stdout=subprocess.PIPE, text=True)
        try:
            assert holder.stdout.readline().strip() == "ready"
            with HostUsage() as host:
                got = probe(["memory"], env)
            rows.append(("second process, 1 GiB held by another", got, host.peak_mib))
        finally:
            holder.kill()
            holder.wait()
    print(f"### Memory, CUDA_DEVICE_MEMORY_LIMIT_0={LIMIT_MIB}m\n")
    print("| case | mem_get_info total MiB | free MiB | largest torch.empty MiB | first refused MiB | host peak MiB |")
    print("| --- | --- | --- | --- | --- | --- |")
    for label, got, peak in rows:
        print(f"| {label} | {got['mem_get_info_total_mib']:.0f} | {got['mem_get_info_free_mib']:.0f} "
              f"| {got['largest_ok_mib']} | {got['first_refused_mib']} | {peak} |")
    print()


def sm_rows(seconds):
    native = probe(["sm", "--seconds", str(seconds)])
    base = probe(["sm", "--seconds", str(seconds)], limited())
    print(f"### SM share, fp16 4096² matmul, {seconds} s each\n")
    print("| limit % | matmul/s | fraction of unlimited | max per-second deviation (points) |")
    print("| --- | --- | --- | --- |")
    print(f"| native (no libvgpu) | {native['mean']:.1f} | - | - |")
    print(f"| libvgpu, no limit | {base['mean']:.1f} | {100 * base['mean'] / native['mean']:.1f} % of native | - |")
    for pct in (10, 30, 60):
        got = probe(["sm", "--seconds", str(seconds)], limited(CUDA_DEVICE_SM_LIMIT=pct, **FORCE))
        fraction = 100 * got["mean"] / base["mean"]
        jitter = max(abs(100 * s / base["mean"] - pct) for s in got["matmuls_per_second"])
        print(f"| {pct} | {got['mean']:.1f} | {fraction:.1f} | {jitter:.1f} |")
    procs = [subprocess.Popen(PROBE + ["sm", "--seconds", str(seconds)],
                              env=dict(os.environ, **limited(CUDA_DEVICE_SM_LIMIT=pct, **FORCE)),
                              stdout=subprocess.PIPE, text=True) for pct in (30, 70)]
    means = [json.loads(p.communicate(timeout=600)[0].strip().splitlines()[-1])["mean"] for p in procs]
    print(f"| 30 and 70 at once | {means[0]:.1f} : {means[1]:.1f} | "
          f"{100 * means[0] / sum(means):.1f} : {100 * means[1] / sum(means):.1f} | - |")
    lent = probe(["sm", "--seconds", str(seconds)], limited(CUDA_DEVICE_SM_LIMIT=30))
    print(f"| 30, policy `default`, alone | {lent['mean']:.1f} | {100 * lent['mean'] / base['mean']:.1f} | - |\n")


def card_mib() -> int:
    """The physical card's size, as nvidia-smi outside libvgpu says."""
    out = subprocess.run(["nvidia-smi", "--query-gpu=memory.total", "--format=csv,noheader,nounits"],
                         capture_output=True, text=True, env={"PATH": os.environ["PATH"]}).stdout
    return int(out.split()[0])


def spill_rows():
    """What memory spilled to the host costs (memory_scaling > 1): the same pass over a
    tensor in device memory, and over one libvgpu served from managed memory because
    the card was full."""
    card = card_mib()
    native = probe(["spill", "--mib", str(SPILL_MIB)])
    spilled = probe(["spill", "--mib", str(SPILL_MIB), "--fill"],
                    limited(CUDA_OVERSUBSCRIBE="true", CUDA_DEVICE_MEMORY_LIMIT_0=f"{2 * card}m"))
    print(f"### Spill to managed memory, {SPILL_MIB} MiB tensor, x.add_(1), {card} MiB card\n")
    print("| case | managed | allocation ms | first pass GB/s | steady GB/s | steady vs device |")
    print("| --- | --- | --- | --- | --- | --- |")
    for label, got in (("device memory (no libvgpu)", native),
                       (f"spilled (card filled with {spilled['filler_gib']} GiB first)", spilled)):
        print(f"| {label} | {got['managed']} | {got['alloc_ms']:.2f} | {got['first_pass_gbs']:.1f} "
              f"| {got['steady_gbs']:.1f} | {100 * got['steady_gbs'] / native['steady_gbs']:.1f} % |")
    print()


def init_rows():
    native = sorted(probe(["init"])["cuda_init_ms"] for _ in range(5))
    under = sorted(probe(["init"], limited())["cuda_init_ms"] for _ in range(5))
    print("### CUDA init (torch.cuda.init + first tensor), median of 5\n")
    print("| native ms | libvgpu ms | added ms |\n| --- | --- | --- |")
    print(f"| {native[2]:.1f} | {under[2]:.1f} | {under[2] - native[2]:.1f} |\n")


def environment():
    smi = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
                         capture_output=True, text=True).stdout.strip()
    import torch
    print(f"Measured {time.strftime('%Y-%m-%d')} on {smi}; CUDA {torch.version.cuda}, "
          f"PyTorch {torch.__version__}.\n")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=int, default=10)
    args = parser.parse_args()
    if not LIBVGPU.exists():
        sys.exit("build/libvgpu.so is missing: run `make build` first")
    environment()
    memory_rows()
    sm_rows(args.seconds)
    init_rows()
    spill_rows()


if __name__ == "__main__":
    main()
