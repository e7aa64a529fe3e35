"""An LLM-serving shape, as vLLM runs one, on a real NVIDIA GPU or the simulated one.

A small decoder (a few layers of attention over a paged KV cache and an MLP) is built
from torch.nn; one forward pass at the largest batch size profiles its memory; the KV
cache then takes what `gpu_memory_utilization` of the card leaves, as vLLM sizes it
from torch.cuda.mem_get_info; one decode step per batch size is captured as a CUDA
graph (one shared memory pool, as vLLM's CUDA graph runner does); then the graphs are
replayed in turn, batch sizes round-robin, for --seconds.

    python3 bench/decode_probe.py [--layers 2] [--hidden 256] [--batch-sizes 1,2,4,8]
                                  [--utilization 0.9] [--seconds 3] [--dtype float16]

Prints one JSON object (its last line): the card as torch sees it, the cache's size,
the replay rate, and the busy fraction (replays x one replay's GPU time, measured with
CUDA events while nothing else runs, over the wall time). Under a slice the cache is
sized to the slice, and the busy fraction is the SM share.

Every tensor a captured step reads or writes by address (its static inputs x, slot and
mask, its output, the cache, the model) is kept for the graphs' life; new inputs are
copied into the static ones before a replay, as PyTorch's CUDA graph notes prescribe.
Before the timing, each graph is replayed on fresh inputs and its output compared with
the same step run eagerly (torch.allclose, a tolerance for the dtype): a mismatch exits
non-zero. Where kernels do not compute (the simulated driver books their time and runs
nothing), the check is reported as not applicable.
"""
import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent / "gpu"))
from torch_probe import kernels_compute  # noqa: E402  (the simulator's kernels run nothing)

MIB = 1 << 20
BLOCK_TOKENS = 16
# replay against eager: the same kernels on the same inputs, but cuBLAS may pick another
# algorithm under capture; a residual stream of a few layers stays well inside these
TOLERANCE = {"float16": (1e-2, 1e-2), "bfloat16": (5e-2, 5e-2), "float32": (1e-4, 1e-4)}


def build(torch, layers: int, hidden: int, heads: int):
    nn = torch.nn

    class Layer(nn.Module):
        def __init__(self):
            super().__init__()
            self.norm1, self.norm2 = nn.LayerNorm(hidden), nn.LayerNorm(hidden)
            self.qkv, self.out = nn.Linear(hidden, 3 * hidden), nn.Linear(hidden, hidden)
            self.up, self.down = nn.Linear(hidden, 4 * hidden), nn.Linear(4 * hidden, hidden)

        def forward(self, x, keys, values, slot, mask):
            """x: [batch, hidden]; keys/values: this layer's cache of the batch's sequences,
            [batch, tokens, hidden]; the new token's key and value go to `slot`."""
            batch = x.shape[0]
            q, k, v = self.qkv(self.norm1(x)).chunk(3, dim=-1)
            keys.index_copy_(1, slot, k.unsqueeze(1))
            values.index_copy_(1, slot, v.unsqueeze(1))
            q = q.view(batch, heads, 1, hidden // heads)
            kh = keys.view(batch, -1, heads, hidden // heads).transpose(1, 2)
            vh = values.view(batch, -1, heads, hidden // heads).transpose(1, 2)
            scores = (q @ kh.transpose(-1, -2)) / (hidden // heads) ** 0.5 + mask
            attended = (scores.softmax(-1) @ vh).reshape(batch, hidden)
            x = x + self.out(attended)
            return x + self.down(torch.nn.functional.gelu(self.up(self.norm2(x))))

    return nn.ModuleList(Layer() for _ in range(layers))


def fresh_inputs(torch, static: dict, context: int, generator) -> None:
    """New inputs for one step, copied into the graph's static tensors (a replay reads those
    addresses): random hidden states, a random slot and a causal mask up to it."""
    x, slot, mask = static["x"], static["slot"], static["mask"]
    x.copy_(torch.randn(x.shape, generator=generator, dtype=torch.float32).to(x.device, x.dtype))
    position = int(torch.randint(1, context, (1,), generator=generator))
    slot.fill_(position)
    visible = torch.arange(context) <= position
    mask.copy_(torch.where(visible, 0.0, float("-inf")).view(mask.shape).to(mask.device, mask.dtype))


def check_against_eager(torch, graphs: dict, step, context: int, dtype_name: str, computes: bool) -> dict:
    """Each graph replayed on fresh inputs, its output against the same step run eagerly, right
    after it: the batch sizes' cache views overlap (they all start at block 0) and, in the shared
    pool, a later capture may have put its output where an earlier graph's intermediates were."""
    rtol, atol = TOLERANCE[dtype_name]
    generator = torch.Generator().manual_seed(0)
    diffs = {}
    for batch, static in sorted(graphs.items()):
        fresh_inputs(torch, static, context, generator)
        static["graph"].replay()
        replayed = static["out"].clone()
        eager = step(static["x"], static["slot"], static["mask"], batch)
        torch.cuda.synchronize()
        diffs[batch] = (float((replayed.float() - eager.float()).abs().max()),
                        bool(torch.allclose(replayed, eager, rtol=rtol, atol=atol)))
    if not computes:                             # the replays and eager steps ran; their numbers mean nothing
        return {"status": "not applicable: kernels do not compute on this device (simulated)"}
    result = {"rtol": rtol, "atol": atol, "max_abs_diff": {b: d for b, (d, _) in diffs.items()}}
    bad = [b for b, (_, ok) in diffs.items() if not ok]
    if bad:
        sys.exit(f"decode_probe: replay differs from eager at batch sizes {bad}: {result}")
    return {**result, "status": "passed"}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--batch-sizes", default="1,2,4,8")
    parser.add_argument("--context", type=int, default=256, help="tokens each sequence attends to")
    parser.add_argument("--utilization", type=float, default=0.9)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--dtype", default="float16", choices=["float16", "bfloat16", "float32"])
    args = parser.parse_args()

    import torch

    dtype = getattr(torch, args.dtype)
    sizes = sorted(int(b) for b in args.batch_sizes.split(","))
    model = build(torch, args.layers, args.hidden, args.heads).to("cuda", dtype).eval()
    blocks_per_seq = args.context // BLOCK_TOKENS

    # profile: one pass at the largest batch over a cache just big enough for it
    with torch.inference_mode():
        scratch = torch.zeros(args.layers, 2, sizes[-1], args.context, args.hidden, dtype=dtype, device="cuda")
        x = torch.zeros(sizes[-1], args.hidden, dtype=dtype, device="cuda")
        slot = torch.zeros(1, dtype=torch.long, device="cuda")
        mask = torch.zeros(1, 1, 1, args.context, dtype=dtype, device="cuda")
        for i, layer in enumerate(model):
            x = layer(x, scratch[i, 0], scratch[i, 1], slot, mask)
        torch.cuda.synchronize()
        del scratch, x
    torch.cuda.empty_cache()

    # the KV cache: what utilization x the card leaves, in blocks (vLLM's determine_num_available_blocks)
    free, total = torch.cuda.mem_get_info()
    budget = int(total * args.utilization) - (total - free)
    block_bytes = args.layers * 2 * BLOCK_TOKENS * args.hidden * torch.finfo(dtype).bits // 8
    blocks = budget // block_bytes
    if blocks < sizes[-1] * blocks_per_seq:
        raise SystemExit(f"no room for the KV cache: {budget // MIB} MiB left for it")
    # a block holds BLOCK_TOKENS tokens' keys and values of every layer
    cache = torch.empty(blocks, BLOCK_TOKENS, args.layers, 2, args.hidden, dtype=dtype, device="cuda")
    # attention reads every position of a sequence's blocks, masked ones too (times a zero
    # weight, and NaN x 0 is NaN): the blocks the graphs use hold numbers, not what was there
    cache[: sizes[-1] * blocks_per_seq].normal_()
    computes = kernels_compute(torch)

    def step(x, slot, mask, batch):
        # sequence b owns blocks [b * blocks_per_seq, (b + 1) * blocks_per_seq); views, never copies
        seqs = cache[: batch * blocks_per_seq]
        for i, layer in enumerate(model):
            keys = seqs[:, :, i, 0].view(batch, args.context, args.hidden)
            values = seqs[:, :, i, 1].view(batch, args.context, args.hidden)
            x = layer(x, keys, values, slot, mask)
        return x

    # graphs[batch]: the graph and every tensor it reads or writes by address, held as long as
    # the graph (a freed input's memory goes to the next allocation, which the replay then reads)
    graphs, pool = {}, torch.cuda.graph_pool_handle()
    started = time.perf_counter()
    with torch.inference_mode():
        for batch in reversed(sizes):            # largest first, as vLLM captures
            static = {"x": torch.zeros(batch, args.hidden, dtype=dtype, device="cuda"),
                      "slot": torch.zeros(1, dtype=torch.long, device="cuda"),
                      "mask": torch.zeros(1, 1, 1, args.context, dtype=dtype, device="cuda")}
            side = torch.cuda.Stream()           # warm-up on a side stream, as PyTorch asks
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                step(static["x"], static["slot"], static["mask"], batch)
            torch.cuda.current_stream().wait_stream(side)
            torch.cuda.synchronize()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                static["out"] = step(static["x"], static["slot"], static["mask"], batch)
            graphs[batch] = {"graph": graph, **static}
        torch.cuda.synchronize()
        capture_s = time.perf_counter() - started
        eager_check = check_against_eager(torch, graphs, step, args.context, args.dtype, computes)

    # one replay's GPU time, alone: each after a pause, so that no wait for an SM share
    # (a limiter refills while nothing runs) falls between its events
    begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    replay_ms = []
    for _ in range(3):
        for batch in sizes:
            time.sleep(0.2)
            begin.record()
            graphs[batch]["graph"].replay()
            end.record()
            end.synchronize()
            replay_ms.append(begin.elapsed_time(end))
    graph_ms = statistics.median(replay_ms)

    replays, started = 0, time.perf_counter()
    while time.perf_counter() - started < args.seconds:
        for batch in sizes:                     # the inputs stay as the check left them
            graphs[batch]["graph"].replay()
            replays += 1
        torch.cuda.synchronize()
    elapsed = time.perf_counter() - started
    print(json.dumps({
        "total_mib": total / MIB, "free_before_cache_mib": free / MIB, "kv_cache_mib": cache.numel() * cache.element_size() / MIB,
        "kv_blocks": blocks, "graphs": len(graphs), "capture_s": capture_s, "replay_gpu_ms": graph_ms,
        "replays": replays, "replays_per_s": replays / elapsed,
        "busy_percent": 100 * replays * graph_ms / 1000 / elapsed,
        "tokens_per_s": replays * statistics.mean(sizes) / elapsed, "eager_check": eager_check,
    }))


if __name__ == "__main__":
    main()
