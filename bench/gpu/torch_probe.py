"""libvgpu measured through PyTorch, on a real NVIDIA GPU or the simulated one.

Run one measurement per process, so that each sees the environment (LD_PRELOAD,
CUDA_DEVICE_MEMORY_LIMIT_0, CUDA_DEVICE_SM_LIMIT, PYTORCH_CUDA_ALLOC_CONF, ...) it
was started with, or the container it runs in:

    python3 bench/gpu/torch_probe.py memory     # largest torch.empty, mem_get_info
    python3 bench/gpu/torch_probe.py sm --seconds 10 [--profile]   # matmul rate; GPU time by the profiler
    python3 bench/gpu/torch_probe.py graph --seconds 5 [--oversize-mib N]  # torch.cuda.graph capture + replay
    python3 bench/gpu/torch_probe.py compiled --seconds 5 [--profile]  # torch.compile(mode="reduce-overhead")
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
import os
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
    # What PyTorch holds reserved but unused at that moment (its cache: the native allocator's
    # 2 MiB small-block segment, or cudaMallocAsync's pool, which the driver reserves by the
    # granule): taken from the card, so not free to the driver (nor to libvgpu's view), and
    # handed out again or given back (empty_cache trims the pool) before a large request fails.
    cached = torch.cuda.memory_reserved() - torch.cuda.memory_allocated()
    torch.cuda.empty_cache()
    free_emptied = torch.cuda.mem_get_info()[0]
    low, high = _largest(torch, total)
    return {
        "mem_get_info_total_mib": total / MIB,
        "mem_get_info_free_mib": free / MIB,
        "allocator_cached_mib": cached / MIB,
        "free_after_empty_cache_mib": free_emptied / MIB,
        "largest_ok_mib": low,
        "first_refused_mib": high,
        "allocator": torch.cuda.get_allocator_backend(),
    }


def _kernel_busy(torch, run) -> dict:
    """Runs `run()` under the profiler (CUPTI) and reads the kernels' own device time back from
    its trace: busy % = their time / the span from the first kernel's start to the last's end."""
    import os
    import tempfile

    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        run()
        torch.cuda.synchronize()
    fd, path = tempfile.mkstemp(suffix=".json")
    os.close(fd)
    try:
        prof.export_chrome_trace(path)
        trace = json.loads(Path(path).read_text())
    finally:
        os.unlink(path)
    events = trace["traceEvents"] if isinstance(trace, dict) else trace
    kernels = sorted((e["ts"], e["dur"]) for e in events if e.get("cat") == "kernel" and "dur" in e)
    if not kernels:
        return {"profiled_kernels": 0, "busy_pct": None, "kernel_us_median": None}
    span = max(ts + dur for ts, dur in kernels) - kernels[0][0]
    durations = sorted(dur for _, dur in kernels)
    return {"profiled_kernels": len(kernels), "busy_pct": 100 * sum(durations) / span,
            "kernel_us_median": durations[len(durations) // 2], "profiled_s": span / 1e6}


def sm(args) -> dict:
    torch = _torch()
    a = torch.randn(args.size, args.size, device="cuda", dtype=torch.float16)
    b = torch.randn(args.size, args.size, device="cuda", dtype=torch.float16)
    for _ in range(10):
        a @ b
    torch.cuda.synchronize()
    per_second = []

    def window():
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

    result = _kernel_busy(torch, window) if args.profile else (window() or {})
    result.update(matmuls_per_second=per_second, mean=sum(per_second) / len(per_second))
    return result


def graph(args) -> dict:
    """torch.cuda.graph: --matmuls fp16 matmuls captured once, then replayed for --seconds (the
    rate, and with --profile the kernels' GPU time); the replay's result against the same
    matmul run eagerly. With --oversize-mib: a capture that allocates that much (past a limit)
    must be refused with OutOfMemoryError, and a capture after it must still work."""
    torch = _torch()
    dtype = getattr(torch, args.dtype)
    a = torch.randn(args.size, args.size, device="cuda", dtype=dtype)
    b = torch.randn(args.size, args.size, device="cuda", dtype=dtype) / args.size ** 0.5
    side = torch.cuda.Stream()                    # warm-up off the default stream, as PyTorch asks
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            [a @ b for _ in range(args.matmuls)]
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    result = {"matmuls": args.matmuls, "size": args.size, "dtype": args.dtype}

    def capture():
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            outs = [a @ b for _ in range(args.matmuls)]
        return g, outs

    try:
        g, outs = capture()
    except Exception as exc:  # what capture_end / the driver said
        result.update(capture_ok=False, error=f"{type(exc).__name__}: {str(exc).splitlines()[0]}")
        return result
    result["capture_ok"] = True
    outs[0].zero_()
    g.replay()
    torch.cuda.synchronize()
    expect = (a @ b).float()
    result["replay_max_abs_diff"] = float((outs[0].float() - expect).abs().max())
    per_second = []
    window = _rate_window(torch, g.replay, 4, args.seconds, per_second)
    result.update(_kernel_busy(torch, window) if args.profile else (window() or {}))
    result.update(replays_per_second=per_second, replays_mean=sum(per_second) / len(per_second))
    if args.oversize_mib:
        refusal = None
        g2 = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(g2):
                big = torch.empty(args.oversize_mib * MIB, dtype=torch.uint8, device="cuda")
                big.fill_(1)
        except Exception as exc:
            refusal = {"error": type(exc).__name__, "message": str(exc).splitlines()[0]}
        result["oversize_refusal"] = refusal
        try:                                       # the process goes on capturing
            g3, outs3 = capture()
            g3.replay()
            torch.cuda.synchronize()
            result["capture_after_refusal_ok"] = True
            result["replay_after_refusal_max_abs_diff"] = float((outs3[0].float() - expect).abs().max())
        except Exception as exc:
            result["capture_after_refusal_ok"] = False
            result["error_after_refusal"] = f"{type(exc).__name__}: {str(exc).splitlines()[0]}"
    return result


def _rate_window(torch, call, per_round: int, seconds: int, per_second: list):
    """A window of `seconds` that runs `call` in rounds of per_round, synchronised, and
    appends each second's calls per second to per_second."""
    def window():
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            start, done = time.monotonic(), 0
            while time.monotonic() - start < 1.0:
                for _ in range(per_round):
                    call()
                torch.cuda.synchronize()
                done += per_round
            per_second.append(done / (time.monotonic() - start))
    return window


def kernels_compute(torch) -> bool:
    """Whether a kernel's result can be read back: False on the simulated driver, which books every
    kernel's time and runs none. Elsewhere a wrong answer is a broken GPU, not a reason to skip a check."""
    got = (torch.tensor([1.0, 2.0, 3.0], device="cuda") * 3 + 1).cpu().tolist()
    if got == [4.0, 7.0, 10.0]:
        return True
    name = torch.cuda.get_device_name(0)
    if not name.startswith("HAMi Simulated"):
        sys.exit(f"3 * [1, 2, 3] + 1 read back as {got} on {name}")
    return False


def compiled(args) -> dict:
    """torch.compile(mode="reduce-overhead") (inductor's kernels, replayed as CUDA graph trees) of
    --layers fp16 Linear+GELU layers of --width, batch --batch: the compile's time (the first
    calls, until the graph is recorded), the result against the same model run eagerly, then
    calls for --seconds (the rate, and with --profile the kernels' GPU time). An output off eager
    exits non-zero; where kernels do not compute (the simulated driver) the check is not applicable."""
    torch = _torch()
    dtype = getattr(torch, args.dtype)
    layers = []
    for _ in range(args.layers):
        layers += [torch.nn.Linear(args.width, args.width), torch.nn.GELU()]
    model = torch.nn.Sequential(*layers).to("cuda", dtype).eval()
    x = torch.randn(args.batch, args.width, device="cuda", dtype=dtype)
    result = {"layers": args.layers, "width": args.width, "batch": args.batch, "dtype": args.dtype}
    with torch.inference_mode():
        eager = model(x).float()
        fast = torch.compile(model, mode="reduce-overhead")
        start = time.perf_counter()
        for _ in range(3):                         # cudagraph trees record on a later call than the first
            torch.compiler.cudagraph_mark_step_begin()
            out = fast(x)
        torch.cuda.synchronize()
        result["compile_s"] = time.perf_counter() - start
        # a graph tree's output is overwritten by its next replay: read before another call. fp16's
        # tolerance, relative to the output's scale (six default-initialised layers shrink it)
        diff = float((out.float() - eager).abs().max())
        if not kernels_compute(torch):
            result["eager_check"] = "not applicable: kernels do not compute on this device (simulated)"
        elif not torch.allclose(out.float(), eager, rtol=1e-2, atol=1e-2 * float(eager.abs().max())):
            sys.exit(f"compiled: the output differs from eager: max |diff| {diff}, max |eager| {eager.abs().max()}")
        else:
            result.update(eager_check="passed", max_abs_diff=diff)
        per_second = []

        def step():
            torch.compiler.cudagraph_mark_step_begin()
            fast(x)

        window = _rate_window(torch, step, 8, args.seconds, per_second)
        result.update(_kernel_busy(torch, window) if args.profile else (window() or {}))
    result.update(calls_per_second=per_second, calls_mean=sum(per_second) / len(per_second))
    return result


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


def _card_free_mib(uuid: str) -> int:
    """What the card has free now, as the driver says outside libvgpu (nvidia-smi, no preload)."""
    import os
    import subprocess
    out = subprocess.run(["nvidia-smi", "--query-gpu=uuid,memory.free", "--format=csv,noheader,nounits"],
                         capture_output=True, text=True, timeout=30,
                         env={k: v for k, v in os.environ.items() if k != "LD_PRELOAD"})
    for line in out.stdout.splitlines():
        card, _, free = line.partition(",")
        if card.strip() == uuid:
            return int(free)
    sys.exit(f"nvidia-smi does not list {uuid}: {out.stdout.strip()} {out.stderr.strip()}")


def _passes(torch, x, count: int, mib: int) -> list:
    """GB/s of `count` x.add_(1) passes (each reads and writes every byte once)."""
    rates = []
    for _ in range(count):
        torch.cuda.synchronize()
        start = time.perf_counter()
        x.add_(1.0)
        torch.cuda.synchronize()
        rates.append(2 * mib * MIB / (time.perf_counter() - start) / 1e9)
    return rates


def spill(args) -> dict:
    """Times x.add_(1) passes over a tensor of --mib. With --fill (under libvgpu with
    CUDA_OVERSUBSCRIBE=true and a limit past the card): the card's free memory is read first
    (outside libvgpu), filled with device memory but --mib / 2, so that the tensor cannot fit
    and libvgpu serves it from managed memory; then the filler is freed before the tensor is
    touched, so the managed memory never asks for more than the card has free (a card left
    full while managed memory pages in can stall the GPU for everyone on it). The first pass
    migrates the pages to the card; the next ones run from there. A tensor of the same size in
    device memory is timed beside it in the same process."""
    torch = _torch()
    torch.empty(1, device="cuda")
    uuid = f"GPU-{torch.cuda.get_device_properties(0).uuid}"
    result = {"mib": args.mib}
    filler = []
    if args.fill:
        card_free = _card_free_mib(uuid)
        result["card_free_mib"] = card_free
        if card_free < 2 * args.mib + 1024:
            sys.exit(f"spill: the card has {card_free} MiB free, {2 * args.mib + 1024} needed")
        left = card_free - args.mib // 2
        while left > 0:
            block = torch.empty(min(1024, left) * MIB, dtype=torch.uint8, device="cuda")
            filler.append(block)
            left -= min(1024, left)
            if _is_managed(block.data_ptr()):      # the card was fuller than read: spilled already
                break
        result["filler_mib"] = sum(b.numel() for b in filler) // MIB
        result["filler_spilled"] = any(_is_managed(b.data_ptr()) for b in filler)
        result["card_free_when_filled_mib"] = _card_free_mib(uuid)
    torch.cuda.synchronize()
    start = time.perf_counter()
    x = torch.empty(args.mib * MIB // 4, dtype=torch.float32, device="cuda")
    result["alloc_ms"] = (time.perf_counter() - start) * 1000
    result["managed"] = _is_managed(x.data_ptr())
    if args.fill:
        del block
        filler.clear()
        torch.cuda.empty_cache()
        result["card_free_at_first_touch_mib"] = _card_free_mib(uuid)
    passes = _passes(torch, x, args.passes, args.mib)
    result.update(first_pass_gbs=passes[0], steady_gbs=sorted(passes[1:])[len(passes[1:]) // 2])
    if args.fill:
        del x
        torch.cuda.empty_cache()                   # else the allocator hands x's managed block back
        y = torch.empty(args.mib * MIB // 4, dtype=torch.float32, device="cuda")
        result["device_managed"] = _is_managed(y.data_ptr())
        device = _passes(torch, y, args.passes, args.mib)
        result.update(device_first_pass_gbs=device[0], device_steady_gbs=sorted(device[1:])[len(device[1:]) // 2])
    return result


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
    sm_parser.add_argument("--profile", action="store_true", help="the kernels' GPU time, by the profiler")
    graph_parser = sub.add_parser("graph")
    graph_parser.add_argument("--seconds", type=int, default=5)
    graph_parser.add_argument("--size", type=int, default=4096)
    graph_parser.add_argument("--matmuls", type=int, default=8)
    graph_parser.add_argument("--dtype", default="float16")
    graph_parser.add_argument("--profile", action="store_true")
    graph_parser.add_argument("--oversize-mib", type=int, default=0)
    compiled_parser = sub.add_parser("compiled")
    compiled_parser.add_argument("--seconds", type=int, default=5)
    compiled_parser.add_argument("--layers", type=int, default=6)
    compiled_parser.add_argument("--width", type=int, default=4096)
    compiled_parser.add_argument("--batch", type=int, default=64)
    compiled_parser.add_argument("--dtype", default="float16")
    compiled_parser.add_argument("--profile", action="store_true")
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
    what = {"memory": memory, "sm": sm, "graph": graph, "compiled": compiled, "init": init, "spill": spill,
            "info": info, "fill": fill, "resnet-memory": resnet_memory, "resnet-train": resnet_train}
    print(json.dumps(what[args.what](args)), flush=True)
    if args.what in TRAINING:
        # The autograd engine's CUDA thread may still hold the last backward's task when the
        # interpreter finalises; its release then takes the GIL, CPython 3.11 ends that thread
        # by unwinding it through a noexcept destructor, and the process aborts (std::terminate),
        # with or without libvgpu, now and then on a loaded machine. The result is out: end here,
        # as a killed process would (what a process leaves is reclaimed when it dies).
        os._exit(0)


TRAINING = ("resnet-memory", "resnet-train")


if __name__ == "__main__":
    main()
