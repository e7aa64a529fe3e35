"""The allocator under 100 concurrent creates: never overcommits, and how long
each create's allocation step takes while all of them contend for the lock.

  .venv/bin/python bench/runtime_allocator.py [--processes 100]

Each process runs hami-runtime's real create path (request, NVML discovery on
the simulated GPU, locked allocation, region, spec edit) for 1500 MiB of one
16384 MiB GPU, then stays alive (an allocation lives while its creator does).
Prints a markdown table.
"""
import argparse
import json
import multiprocessing
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

from sim_runtime import private_config, sim_config_missing

MEM_MIB = 1500


def one(config, root, bundle, cid, start, results, hold):
    os.environ["HAMI_CONFIG"] = config
    from hami_runtime import argv, config as config_mod
    from hami_runtime.lifecycle.commands import create
    from hami_runtime.errors import HamiError
    import hami_runtime.lifecycle.request.requests, hami_runtime.node.discovery, hami_runtime.node.region  # noqa: F401 (load first)
    inv = argv.parse(["--root", root, "create", "--bundle", bundle, cid])
    cfg = config_mod.load()
    start.wait()
    t = time.perf_counter()
    try:
        create.prepare(cfg, inv)
        outcome = "ok"
    except HamiError as exc:
        outcome = exc.line()
    results.put((cid, outcome, (time.perf_counter() - t) * 1000))
    hold.wait(120)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--processes", type=int, default=100)
    n = parser.parse_args().processes
    if sim_config_missing():
        return 1
    work = Path(tempfile.mkdtemp(prefix="hami-alloc-bench-"))
    try:
        config = private_config(work)
        os.environ["HAMI_SIM_STATE"] = str(work / "sim.state")
        from hami_runtime import config as config_mod
        from hami_runtime.node.discovery import load_gpus
        ctx = multiprocessing.get_context("fork")
        results, start, hold = ctx.Queue(), ctx.Event(), ctx.Event()
        procs = []
        for i in range(n):
            bundle = work / f"b{i}"
            bundle.mkdir()
            annotations = {"hami.io/gpumem": str(MEM_MIB), "hami.io/gpu": "1"}
            (bundle / "config.json").write_text(json.dumps({
                "ociVersion": "1.0.2", "root": {"path": "rootfs"},
                "process": {"args": ["true"], "env": ["PATH=/bin"]}, "annotations": annotations}))
            procs.append(ctx.Process(target=one, args=(str(config), str(work / "runc"), str(bundle),
                                                       f"c{i}", start, results, hold)))
        for p in procs:
            p.start()
        time.sleep(2)  # let every process finish its imports
        start.set()
        outcomes = [results.get(timeout=120) for _ in procs]
        state = json.loads((work / "state" / "allocations.json").read_text())["allocations"]
        hold.set()
        for p in procs:
            p.join(60)
        os.environ["HAMI_CONFIG"] = str(config)
        gpus = load_gpus(config_mod.load().nvml_library)
        capacity = {g.uuid: g.memory_mib for g in gpus}
        split = config_mod.load().split_count
        granted = [o for o in outcomes if o[1] == "ok"]
        per_gpu = {}
        for entry in state.values():
            for d in entry["devices"]:
                used = per_gpu.setdefault(d["uuid"], [0, 0])
                used[0] += d["mem_mib"]
                used[1] += 1
        fits = sum(min(split, capacity[u] // MEM_MIB) for u in capacity)
        over = any(m > capacity[u] or s > split for u, (m, s) in per_gpu.items())
        times = sorted(o[2] for o in outcomes)
        print(f"allocator: {n} concurrent creates of {MEM_MIB} MiB on {len(gpus)} simulated GPUs "
              f"({os.cpu_count()} CPUs)\n")
        print("| processes | fit (capacity) | granted | refused | overcommitted | median ms | p99 ms |")
        print("| ---: | ---: | ---: | ---: | --- | ---: | ---: |")
        p99 = times[min(len(times) - 1, int(len(times) * 0.99))]
        print(f"| {n} | {fits} | {len(granted)} | {n - len(granted)} | {'YES' if over else 'no'} | "
              f"{statistics.median(times):.1f} | {p99:.1f} |")
        return 1 if over or len(granted) != fits else 0
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
