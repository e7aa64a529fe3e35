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
"""
import argparse
import json
import statistics
import time

MIB = 1 << 20
BLOCK_TOKENS = 16


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
    # a block holds BLOCK_TOKENS tokens' keys and values of every layer (never read before written)
    cache = torch.empty(blocks, BLOCK_TOKENS, args.layers, 2, args.hidden, dtype=dtype, device="cuda")

    def step(x, slot, mask, batch):
        # sequence b owns blocks [b * blocks_per_seq, (b + 1) * blocks_per_seq); views, never copies
        seqs = cache[: batch * blocks_per_seq]
        for i, layer in enumerate(model):
            keys = seqs[:, :, i, 0].view(batch, args.context, args.hidden)
            values = seqs[:, :, i, 1].view(batch, args.context, args.hidden)
            x = layer(x, keys, values, slot, mask)
        return x

    graphs, pool = {}, torch.cuda.graph_pool_handle()
    started = time.perf_counter()
    with torch.inference_mode():
        for batch in reversed(sizes):            # largest first, as vLLM captures
            x = torch.zeros(batch, args.hidden, dtype=dtype, device="cuda")
            slot = torch.zeros(1, dtype=torch.long, device="cuda")
            mask = torch.zeros(1, 1, 1, args.context, dtype=dtype, device="cuda")
            step(x, slot, mask, batch)           # warm-up outside the capture
            torch.cuda.synchronize()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                out = step(x, slot, mask, batch)
            graphs[batch] = (graph, x, out)
    torch.cuda.synchronize()
    capture_s = time.perf_counter() - started

    # one replay's GPU time, alone: each after a pause, so that no wait for an SM share
    # (a limiter refills while nothing runs) falls between its events
    begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    replay_ms = []
    for _ in range(3):
        for batch in sizes:
            time.sleep(0.2)
            begin.record()
            graphs[batch][0].replay()
            end.record()
            end.synchronize()
            replay_ms.append(begin.elapsed_time(end))
    graph_ms = statistics.median(replay_ms)

    replays, started = 0, time.perf_counter()
    while time.perf_counter() - started < args.seconds:
        for batch in sizes:
            graphs[batch][0].replay()
            replays += 1
        torch.cuda.synchronize()
    elapsed = time.perf_counter() - started
    print(json.dumps({
        "total_mib": total / MIB, "free_before_cache_mib": free / MIB, "kv_cache_mib": cache.numel() * cache.element_size() / MIB,
        "kv_blocks": blocks, "graphs": len(graphs), "capture_s": capture_s, "replay_gpu_ms": graph_ms,
        "replays": replays, "replays_per_s": replays / elapsed,
        "busy_percent": 100 * replays * graph_ms / 1000 / elapsed,
        "tokens_per_s": replays * statistics.mean(sizes) / elapsed,
    }))


if __name__ == "__main__":
    main()
