"""Seed 003 on the simulated GPU: a ResNet-18 (bench/gpu/torch_probe.py) under libvgpu.

Three tables, each from fresh processes of PyTorch's CUDA 13 build (build/torch/venv)
on a simulated card with a CUDA 13 driver, libvgpu preloaded with the limits as env
(what a runtime-made container gets through its region; tests/torch/test_seed003.py
runs the same through hami-runtime):

- memory: a 20000 MiB slice of a 24 GiB card, for each allocator back-end: what holds
  the card after a training step and empty_cache, and the largest tensor beside it;
- SM share: median step time at 60 % and 30 % (policy force), unlimited, and 30 %
  under `default` alone (an activity board with nobody on the GPU); every kernel
  books --kernel-us on the card;
- libvgpu's cost per training step: the same run bare and preloaded (no SM limit),
  interleaved, with the default 10 us kernels so that launches dominate.

    python bench/torch_seed003.py [--steps 10] [--repeats 3] [--kernel-us 430]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BUILD = ROOT / "build"
TORCH_PYTHON = BUILD / "torch" / "venv" / "bin" / "python"
PROBE = ROOT / "bench" / "gpu" / "torch_probe.py"
LIBVGPU = BUILD / "libvgpu.so"
SIM_LIB = BUILD / "sim" / "lib"
CARD_MIB = 24576
SLICE_MIB = 20000
BACKENDS = {"native": "", "expandable segments": "expandable_segments:True",
            "cudaMallocAsync": "backend:cudaMallocAsync"}


def probe(work: Path, args, kernel_us: int, limits: dict = None) -> dict:
    """One probe process on a fresh simulated card (its own state file); limits: libvgpu's env."""
    work.mkdir(parents=True)
    (work / "sim.conf").write_text(f"devices = 1\nmemory_mib = {CARD_MIB}\ncuda_version = 13000\n"
                                   f"kernel_us = {kernel_us}\n")
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(work), "LD_LIBRARY_PATH": str(SIM_LIB),
           "HAMI_SIM_CONFIG": str(work / "sim.conf"), "HAMI_SIM_STATE": str(work / "sim.state")}
    if limits is not None:
        env.update(LD_PRELOAD=str(LIBVGPU), CUDA_DEVICE_MEMORY_SHARED_CACHE=str(work / "vgpu.region"),
                   **{k: str(v) for k, v in limits.items()})
    out = subprocess.run([str(TORCH_PYTHON), str(PROBE), *map(str, args)], env=env, capture_output=True,
                         text=True, timeout=900, cwd=work)
    if out.returncode != 0:
        raise RuntimeError(f"probe {args} failed: {out.stderr.strip()[-800:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def memory_rows(tmp: Path) -> None:
    print(f"### Memory: the largest tensor beside a ResNet-18, {SLICE_MIB} MiB slice of a {CARD_MIB} MiB card\n")
    print("| allocator | slice MiB | outside the allocator MiB | model state MiB | free MiB | largest tensor MiB "
          "| first refused MiB | slice − largest MiB |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for i, (name, conf) in enumerate(BACKENDS.items()):
        got = probe(tmp / f"mem-{i}", ["resnet-memory", "--batch", 8], 10,
                    {"CUDA_DEVICE_MEMORY_LIMIT": f"{SLICE_MIB}m", "PYTORCH_CUDA_ALLOC_CONF": conf})
        print(f"| {name} | {got['total_mib']:.0f} | {got['outside_allocator_mib']:.0f} | {got['model_mib']:.0f} "
              f"| {got['free_mib']:.0f} | {got['largest_ok_mib']} | {got['first_refused_mib']} "
              f"| {got['total_mib'] - got['largest_ok_mib']:.0f} |")
    print()


def sm_rows(tmp: Path, steps: int, kernel_us: int) -> None:
    # `default` asks the activity board who else works on the GPU: an empty one, nobody
    board = tmp / "board"
    (board / probe(tmp / "uuid", ["info"], kernel_us)["uuid"]).mkdir(parents=True)
    cases = [("unlimited (libvgpu, no SM limit)", {}), ("60 %, force", {"CUDA_DEVICE_SM_LIMIT": 60,
             "GPU_CORE_UTILIZATION_POLICY": "force"}), ("30 %, force", {"CUDA_DEVICE_SM_LIMIT": 30,
             "GPU_CORE_UTILIZATION_POLICY": "force"}),
             ("30 %, default, alone", {"CUDA_DEVICE_SM_LIMIT": 30, "CUDA_ACTIVITY_BOARD": board})]
    medians = {}
    print(f"### SM share: ResNet-18 training step (batch 8), {steps} steps after 3, kernels of {kernel_us} us\n")
    print("| case | median step s | min–max s |")
    print("| --- | --- | --- |")
    for i, (name, limits) in enumerate(cases):
        got = probe(tmp / f"sm-{i}", ["resnet-train", "--warmup", 3, "--steps", steps], kernel_us,
                    {"CUDA_DEVICE_MEMORY_LIMIT": "4096m", **limits})
        medians[name] = got["median_step_s"]
        print(f"| {name} | {got['median_step_s']:.3f} | {min(got['step_s']):.3f}–{max(got['step_s']):.3f} |")
    print(f"\nstep at 30 % / step at 60 %: {medians['30 %, force'] / medians['60 %, force']:.2f}\n")


def overhead_rows(tmp: Path, steps: int, repeats: int) -> None:
    times = {"bare": [], "libvgpu": []}
    for r in range(repeats):  # interleaved, so that drift of the machine falls on both
        for name, limits in (("bare", None), ("libvgpu", {"CUDA_DEVICE_MEMORY_LIMIT": f"{SLICE_MIB}m"})):
            got = probe(tmp / f"cost-{name}-{r}", ["resnet-train", "--warmup", 3, "--steps", steps], 10, limits)
            times[name] += got["step_s"]
    bare, hooked = statistics.median(times["bare"]), statistics.median(times["libvgpu"])
    print(f"### libvgpu's cost per training step (batch 8, kernels of 10 us), {repeats} x {steps} steps each\n")
    print("| case | median step ms | added ms | added % |")
    print("| --- | --- | --- | --- |")
    print(f"| bare | {bare * 1000:.1f} | - | - |")
    print(f"| libvgpu preloaded | {hooked * 1000:.1f} | {(hooked - bare) * 1000:.2f} | "
          f"{100 * (hooked - bare) / bare:.1f} |\n")


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--kernel-us", type=int, default=430)
    args = parser.parse_args()
    missing = [p for p in (TORCH_PYTHON, LIBVGPU, SIM_LIB / "libcuda.so.1") if not p.exists()]
    if missing:
        print(f"run `make build sim torch` first: {missing[0]} is missing", file=sys.stderr)
        return 1
    with tempfile.TemporaryDirectory() as tmp:
        memory_rows(Path(tmp))
        sm_rows(Path(tmp), args.steps, args.kernel_us)
        overhead_rows(Path(tmp), args.steps * 2, args.repeats)
    return 0


if __name__ == "__main__":
    sys.exit(main())
