"""Measurements of libvgpu on a real NVIDIA GPU through PyTorch.

Run one measurement per process, so that each sees the environment (LD_PRELOAD,
CUDA_DEVICE_MEMORY_LIMIT_0, CUDA_DEVICE_SM_LIMIT, ...) it was started with:

    python3 bench/gpu/torch_probe.py memory     # largest torch.empty, mem_get_info
    python3 bench/gpu/torch_probe.py sm --seconds 10
    python3 bench/gpu/torch_probe.py init

Each prints one JSON object on stdout; bench/gpu/run.py compares them.
"""
import argparse
import json
import sys
import time

MIB = 1 << 20


def _torch():
    import torch

    if not torch.cuda.is_available():
        sys.exit("torch sees no CUDA device")
    return torch


def _fits(torch, mib: int) -> bool:
    try:
        block = torch.empty(mib * MIB, dtype=torch.uint8, device="cuda")
    except torch.cuda.OutOfMemoryError:
        return False
    del block
    torch.cuda.empty_cache()
    return True


def memory(_args) -> dict:
    torch = _torch()
    torch.empty(1, device="cuda")  # creates the context
    free, total = torch.cuda.mem_get_info()
    low, high = 0, total // MIB + 1  # low fits, high does not
    if _fits(torch, high):
        high = None
    else:
        while high - low > 1:
            mid = (low + high) // 2
            low, high = (mid, high) if _fits(torch, mid) else (low, mid)
    return {
        "mem_get_info_total_mib": total / MIB,
        "mem_get_info_free_mib": free / MIB,
        "largest_ok_mib": low,
        "first_refused_mib": high,
        "allocator": torch.cuda.get_allocator_backend(),
    }


def sm(args) -> dict:
    torch = _torch()
    a = torch.randn(args.size, args.size, device="cuda", dtype=torch.float16)
    b = torch.randn(args.size, args.size, device="cuda", dtype=torch.float16)
    for _ in range(10):
        a @ b
    torch.cuda.synchronize()
    per_second = []
    start = time.monotonic()
    second_end = start + 1.0
    done = 0
    while True:
        for _ in range(args.batch):
            a @ b
        torch.cuda.synchronize()
        done += args.batch
        now = time.monotonic()
        if now >= second_end:
            per_second.append(done)
            done = 0
            second_end += 1.0
            if len(per_second) >= args.seconds:
                break
    return {"matmuls_per_second": per_second, "mean": sum(per_second) / len(per_second)}


def init(_args) -> dict:
    start = time.perf_counter()
    torch = _torch()
    torch.cuda.init()
    torch.empty(1, device="cuda")
    torch.cuda.synchronize()
    return {"cuda_init_ms": (time.perf_counter() - start) * 1000}


def main() -> None:
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers(dest="what", required=True)
    sub.add_parser("memory")
    sm_parser = sub.add_parser("sm")
    sm_parser.add_argument("--seconds", type=int, default=10)
    sm_parser.add_argument("--size", type=int, default=4096)
    sm_parser.add_argument("--batch", type=int, default=8)
    sub.add_parser("init")
    args = parser.parse_args()
    print(json.dumps({"memory": memory, "sm": sm, "init": init}[args.what](args)))


if __name__ == "__main__":
    main()
