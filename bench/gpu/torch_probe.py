"""Measurements of libvgpu on a real NVIDIA GPU through PyTorch.

Run one measurement per process, so that each sees the environment (LD_PRELOAD,
CUDA_DEVICE_MEMORY_LIMIT_0, CUDA_DEVICE_SM_LIMIT, ...) it was started with:

    python3 bench/gpu/torch_probe.py memory     # largest torch.empty, mem_get_info
    python3 bench/gpu/torch_probe.py sm --seconds 10
    python3 bench/gpu/torch_probe.py init
    python3 bench/gpu/torch_probe.py spill --mib 4096 [--fill]   # cost of memory spilled to the host

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


def _is_managed(ptr: int) -> bool:
    import ctypes
    value = ctypes.c_int(0)  # zeroed: the driver writes a boolean into it
    rc = ctypes.CDLL("libcuda.so.1").cuPointerGetAttribute(ctypes.byref(value), 8, ctypes.c_uint64(ptr))
    return rc == 0 and value.value != 0  # 8: CU_POINTER_ATTRIBUTE_IS_MANAGED


def spill(args) -> dict:
    """Times an elementwise pass over a tensor of --mib. With --fill (under libvgpu with
    CUDA_OVERSUBSCRIBE=true and a limit past the card) the card is first filled with 1 GiB
    blocks until one comes back as managed memory, so the tensor is spilled to the host."""
    torch = _torch()
    torch.empty(1, device="cuda")
    filler = []
    while args.fill:
        block = torch.empty(1024 * MIB, dtype=torch.uint8, device="cuda")
        filler.append(block)
        if _is_managed(block.data_ptr()) or len(filler) > 1024:
            break
    torch.cuda.synchronize()
    start = time.perf_counter()
    x = torch.empty(args.mib * MIB // 4, dtype=torch.float32, device="cuda")
    alloc_ms = (time.perf_counter() - start) * 1000
    passes = []
    for _ in range(args.passes):
        torch.cuda.synchronize()
        start = time.perf_counter()
        x.add_(1.0)                      # reads and writes every byte once
        torch.cuda.synchronize()
        passes.append(time.perf_counter() - start)
    steady = sorted(passes[1:])[len(passes[1:]) // 2]
    gbs = lambda sec: 2 * args.mib * MIB / sec / 1e9
    return {"managed": _is_managed(x.data_ptr()), "filler_gib": len(filler), "alloc_ms": alloc_ms,
            "first_pass_gbs": gbs(passes[0]), "steady_gbs": gbs(steady)}


def main() -> None:
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers(dest="what", required=True)
    sub.add_parser("memory")
    sm_parser = sub.add_parser("sm")
    sm_parser.add_argument("--seconds", type=int, default=10)
    sm_parser.add_argument("--size", type=int, default=4096)
    sm_parser.add_argument("--batch", type=int, default=8)
    sub.add_parser("init")
    spill_parser = sub.add_parser("spill")
    spill_parser.add_argument("--mib", type=int, default=4096)
    spill_parser.add_argument("--passes", type=int, default=11)
    spill_parser.add_argument("--fill", action="store_true")
    args = parser.parse_args()
    print(json.dumps({"memory": memory, "sm": sm, "init": init, "spill": spill}[args.what](args)))


if __name__ == "__main__":
    main()
