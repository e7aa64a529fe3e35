"""An LLM-serving shape through hami-runtime and runc on the simulated GPU.

bench/decode_probe.py (a small decoder captured as CUDA graphs for four batch sizes, a
KV cache sized from torch.cuda.mem_get_info at 90 % utilization, as vLLM does) runs in
containers made by hami-runtime with real runc (tests/torch/containers.py), one after
another on one simulated 16 GiB card whose kernels each book --kernel-us: a 3000 MiB
slice unlimited, at 60 % and at 30 % of the SMs (`force`), and the whole card. Per container: the card PyTorch sees, the KV cache, one replay's GPU time,
replays per second and the GPU's busy fraction (replays x one replay's GPU time over the
wall time), and the replay rate against the unlimited slice.

    .venv/bin/python bench/llm_decode.py [--seconds 5] [--kernel-us 100]
"""
import argparse
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

CARD_MIB, SLICE_MIB = 16384, 3000
CASES = [("3000 MiB slice, no SM limit", {"hami.io/gpumem": str(SLICE_MIB)}),
         ("3000 MiB slice, 60 %", {"hami.io/gpumem": str(SLICE_MIB), "hami.io/gpucores": "60",
                                   "hami.io/core-policy": "force"}),
         ("3000 MiB slice, 30 %", {"hami.io/gpumem": str(SLICE_MIB), "hami.io/gpucores": "30",
                                   "hami.io/core-policy": "force"}),
         ("the whole card (gpumem-percentage 100)", {"hami.io/gpumem-percentage": "100"})]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=5)
    parser.add_argument("--kernel-us", type=int, default=100)
    args = parser.parse_args()
    from tests.runtime.node import Node, copy_sim, make_rootfs, sim_missing, spec_template
    from tests.torch.containers import run, torch_bundle, use_card
    from tests.torch.conftest import TORCH_PYTHON
    missing = sim_missing() or (None if TORCH_PYTHON.exists() else TORCH_PYTHON)
    if missing:
        print(f"run `make build sim torch` first: {missing} is missing", file=sys.stderr)
        return 1
    with tempfile.TemporaryDirectory(prefix="hami-llm-bench-") as tmp:
        work = Path(tmp)
        for sub in ("root", "rootfs", "spec", "node"):
            (work / sub).mkdir()
        node = Node(work / "node", make_rootfs(work / "rootfs"), spec_template(work / "spec"), copy_sim(work / "root"))
        try:
            env = use_card(node, CARD_MIB, args.kernel_us)
            print(f"decode loop in containers (hami-runtime + runc), one simulated {CARD_MIB} MiB card, kernels of "
                  f"{args.kernel_us} us, {args.seconds:g} s of replays each, float16\n")
            print("| container | card seen MiB | KV cache MiB | replay GPU ms | replays/s | GPU busy % "
                  "| rate vs unlimited slice |")
            print("| --- | --- | --- | --- | --- | --- | --- |")
            reference = None
            for i, (name, annotations) in enumerate(CASES):
                bundle = torch_bundle(node, f"d{i}", annotations, "--dtype", "float16", "--seconds", args.seconds,
                                      script=ROOT / "bench" / "decode_probe.py")
                got = run(node, env, bundle, f"d{i}")
                reference = reference or got["replays_per_s"]
                print(f"| {name} | {got['total_mib']:.0f} | {got['kv_cache_mib']:.0f} | {got['replay_gpu_ms']:.2f} "
                      f"| {got['replays_per_s']:.1f} | {got['busy_percent']:.1f} "
                      f"| {got['replays_per_s'] / reference:.2f} |")
        finally:
            node.cleanup()
    return 0


if __name__ == "__main__":
    sys.exit(main())
