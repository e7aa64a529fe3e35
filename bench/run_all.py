"""Runs every benchmark under bench/ in turn and prints their tables.

Each benchmark is a script that prints a markdown table; BENCHMARKS.md records
the figures with the command that produced them.
"""
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parent
ORDER = ["libvgpu_overhead.py", "sm_accuracy.py", "sm_short_kernels.py", "runtime_latency.py", "runtime_allocator.py",
         "resize_latency.py", "metrics_scrape.py", "agent_cost.py", "torch_seed003.py", "llm_decode.py"]


def main() -> int:
    failed = []
    for name in ORDER:
        script = BENCH / name
        if not script.exists():
            print(f"## {name}: not present, skipped\n")
            continue
        print(f"## {name}\n", flush=True)
        if subprocess.call([sys.executable, str(script)], cwd=BENCH.parent) != 0:
            failed.append(name)
        print(flush=True)
    if failed:
        print("failed: " + ", ".join(failed), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
