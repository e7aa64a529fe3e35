"""libvgpu measured through PyTorch, on a real NVIDIA GPU or the simulated one.

Run one measurement per process, so that each sees the environment (LD_PRELOAD,
CUDA_DEVICE_MEMORY_LIMIT_0, CUDA_DEVICE_SM_LIMIT, PYTORCH_CUDA_ALLOC_CONF, ...) it
was started with, or the container it runs in:

    python3 bench/gpu/torch_probe.py memory     # largest torch.empty, mem_get_info
    python3 bench/gpu/torch_probe.py sm --seconds 10
    python3 bench/gpu/torch_probe.py init
    python3 bench/gpu/torch_probe.py spill --mib 4096 [--fill]   # cost of memory spilled to the host
    python3 bench/gpu/torch_probe.py info       # what torch.cuda sees
    python3 bench/gpu/torch_probe.py fill       # 256 MiB tensors until OutOfMemoryError, then empty_cache
    python3 bench/gpu/torch_probe.py resnet-memory --batch 8  # seed 003: the largest tensor beside a ResNet-18
    python3 bench/gpu/torch_probe.py resnet-train --steps 5   # seed 003: ResNet-18 training step time

Each prints one JSON object on stdout (the last line); bench/gpu/run.py, bench/torch_seed003.py
and the tests compare them.
"""
import argparse
import json
import statistics
import sys
import time
import uuid
from pathlib import Path

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


def _largest(torch, total: int):
    """The largest torch.empty in MiB that fits now, and the first that does not (None if all do)."""
    low, high = 0, total // MIB + 1  # low fits, high does not
    if _fits(torch, high):
        return high, None
    while high - low > 1:
        mid = (low + high) // 2
        low, high = (mid, high) if _fits(torch, mid) else (low, mid)
    return low, high


def memory(_args) -> dict:
    torch = _torch()
    torch.empty(1, device="cuda")  # creates the context
    free, total = torch.cuda.mem_get_info()
    low, high = _largest(torch, total)
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


def info(_args) -> dict:
    torch = _torch()
    props = torch.cuda.get_device_properties(0)
    free, total = torch.cuda.mem_get_info()
    return {"count": torch.cuda.device_count(), "name": props.name, "uuid": f"GPU-{props.uuid}",
            "capability": list(torch.cuda.get_device_capability(0)),
            "total_memory_mib": props.total_memory / MIB, "mem_get_info_total_mib": total / MIB,
            "mem_get_info_free_mib": free / MIB, "allocator": torch.cuda.get_allocator_backend(),
            "cuda": torch.version.cuda, "torch": torch.__version__}


def fill(args) -> dict:
    """Tensors of --block-mib until the allocator refuses; then empty_cache, and the same again."""
    torch = _torch()
    torch.empty(1, device="cuda")
    rounds = []
    for _ in range(2):
        held, refusal = [], None
        try:
            while len(held) * args.block_mib < 1 << 20:
                held.append(torch.empty(args.block_mib * MIB, dtype=torch.uint8, device="cuda"))
        except torch.cuda.OutOfMemoryError as exc:
            refusal = {"error": type(exc).__name__, "message": str(exc).splitlines()[0]}
        filled, full_free = args.block_mib * len(held), torch.cuda.mem_get_info()[0] / MIB
        held.clear()
        torch.cuda.empty_cache()
        rounds.append({"filled_mib": filled, "refusal": refusal, "free_when_full_mib": full_free,
                       "free_after_empty_cache_mib": torch.cuda.mem_get_info()[0] / MIB})
    return {"rounds": rounds}


# ---- seed 003: a ResNet-18 (built here from torch.nn, as torchvision's) trained on dummy data ----

def resnet18(torch, classes: int = 1000):
    nn = torch.nn

    class Block(nn.Module):
        def __init__(self, cin, cout, stride):
            super().__init__()
            self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
            self.bn1 = nn.BatchNorm2d(cout)
            self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
            self.bn2 = nn.BatchNorm2d(cout)
            self.down = None if stride == 1 and cin == cout else nn.Sequential(
                nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

        def forward(self, x):
            y = self.bn2(self.conv2(torch.relu(self.bn1(self.conv1(x)))))
            return torch.relu(y + (x if self.down is None else self.down(x)))

    layers = [nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64), nn.ReLU(), nn.MaxPool2d(3, 2, 1)]
    cin = 64
    for cout, stride in ((64, 1), (128, 2), (256, 2), (512, 2)):
        layers += [Block(cin, cout, stride), Block(cout, cout, 1)]
        cin = cout
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(512, classes)]
    return nn.Sequential(*layers)


class Trainer:
    """The ImageNet example's loop on dummy data: SGD with momentum, cross entropy, cudnn.benchmark."""

    def __init__(self, torch, batch: int):
        torch.backends.cudnn.benchmark = True
        self.torch = torch
        self.model = resnet18(torch).cuda()
        self.loss = torch.nn.CrossEntropyLoss().cuda()
        self.opt = torch.optim.SGD(self.model.parameters(), 0.1, momentum=0.9, weight_decay=1e-4)
        self.images = torch.randn(batch, 3, 224, 224, device="cuda")
        self.target = torch.randint(0, 1000, (batch,), device="cuda")

    def step(self) -> float:
        start = time.perf_counter()
        loss = self.loss(self.model(self.images), self.target)
        self.opt.zero_grad()
        loss.backward()
        self.opt.step()
        self.torch.cuda.synchronize()
        return time.perf_counter() - start


def resnet_memory(args) -> dict:
    """After a training step and empty_cache: what holds the card (the process outside PyTorch's
    allocator: context and libraries; the allocator: the model's state) and the largest tensor
    that fits beside it."""
    torch = _torch()
    trainer = Trainer(torch, args.batch)
    trainer.step()
    del trainer.images, trainer.target
    torch.cuda.empty_cache()
    free, total = torch.cuda.mem_get_info()
    reserved = torch.cuda.memory_reserved()
    low, high = _largest(torch, total)
    refusal = None
    if high is not None:
        try:
            torch.empty(high * MIB, dtype=torch.uint8, device="cuda")
        except torch.cuda.OutOfMemoryError as exc:
            refusal = {"error": type(exc).__name__, "message": str(exc).splitlines()[0]}
    return {"total_mib": total / MIB, "free_mib": free / MIB, "model_mib": reserved / MIB,
            "outside_allocator_mib": (total - free - reserved) / MIB, "largest_ok_mib": low,
            "first_refused_mib": high, "refusal": refusal}


def _barrier(directory: str, parties: int, name: str, timeout: float = 120) -> None:
    """Marks this process at the barrier and waits (bounded) until `parties` have."""
    where = Path(directory)
    (where / f"{name}.{uuid.uuid4().hex}").touch()  # pids repeat across containers' namespaces
    deadline = time.monotonic() + timeout
    while len(list(where.glob(f"{name}.*"))) < parties:
        if time.monotonic() > deadline:
            sys.exit(f"barrier {name}: {parties} parties did not arrive in {timeout:.0f} s")
        time.sleep(0.05)


def resnet_train(args) -> dict:
    """Step times of --steps steps after --warmup; with --barrier, the processes sharing it fill their
    slices beside their training and train on together (none is lent what another holds)."""
    torch = _torch()
    trainer = Trainer(torch, args.batch)
    for _ in range(args.warmup):
        trainer.step()
    result = {}
    if args.barrier:
        _barrier(args.barrier, args.parties, "trained")
        # what is free, in whole 2 MiB pages, but --headroom-mib, held while the others train; the
        # steps go on in what the allocator keeps from the warm-up, and the headroom
        free, total = torch.cuda.mem_get_info()
        held = free // (2 * MIB) * 2 - args.headroom_mib
        block = torch.empty(held * MIB, dtype=torch.uint8, device="cuda")
        result.update(total_mib=total / MIB, held_mib=held, training_mib=torch.cuda.memory_reserved() / MIB - held,
                      free_when_held_mib=torch.cuda.mem_get_info()[0] / MIB, headroom_mib=args.headroom_mib)
        _barrier(args.barrier, args.parties, "holding")
    times = [trainer.step() for _ in range(args.steps)]
    if args.barrier:
        _barrier(args.barrier, args.parties, "done")
        del block
    result.update(step_s=times, median_step_s=statistics.median(times),
                  total_memory_mib=torch.cuda.get_device_properties(0).total_memory / MIB)
    return result


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
    sub.add_parser("info")
    fill_parser = sub.add_parser("fill")
    fill_parser.add_argument("--block-mib", type=int, default=256)
    resnet_memory_parser = sub.add_parser("resnet-memory")
    resnet_memory_parser.add_argument("--batch", type=int, default=8)
    train_parser = sub.add_parser("resnet-train")
    train_parser.add_argument("--batch", type=int, default=8)
    train_parser.add_argument("--warmup", type=int, default=2)
    train_parser.add_argument("--steps", type=int, default=5)
    train_parser.add_argument("--barrier", help="a directory the processes training together share")
    train_parser.add_argument("--parties", type=int, default=2)
    train_parser.add_argument("--headroom-mib", type=int, default=64)
    args = parser.parse_args()
    what = {"memory": memory, "sm": sm, "init": init, "spill": spill, "info": info, "fill": fill,
            "resnet-memory": resnet_memory, "resnet-train": resnet_train}
    print(json.dumps(what[args.what](args)))


if __name__ == "__main__":
    main()
