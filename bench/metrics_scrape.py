"""How long a `hamictl metrics` scrape takes, with the driver answering and with a
driver that hangs.

  .venv/bin/python bench/metrics_scrape.py [--containers 10,100] [--scrapes 20]

A state dir holds N GPU containers on the simulated GPU's two cards (each with its
limits, region and allocator record, as a create makes them; a pod's names on half
of them). `hamictl metrics` serves it, in a process of its own, with the simulated
driver as it is and with `nvml_memory_info_us` at 30 s (every memory query hangs);
each scrape is a plain HTTP GET, timed to its last byte. Prints a markdown table:
median, p95 and max seconds per scrape, series per scrape, and how many scrapes
said the driver was read.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from sim_runtime import ROOT
from stats import percentile

sys.path.insert(0, str(ROOT))
from hami_runtime.files import process_start  # noqa: E402
from hami_runtime.lifecycle.node_state import container_files, state_layout  # noqa: E402
from hami_runtime.node import region  # noqa: E402
from hami_runtime.node.region import DeviceLimit  # noqa: E402

SIM_LIB = ROOT / "build" / "sim" / "lib"
UUIDS = ("GPU-453c5d90-9eaf-43fa-be71-c8ae8fc44d65", "GPU-da942c99-406e-4954-8dfc-5fec34eaffef")
ROOT_K8S = "/run/containerd/runc/k8s.io"


def make_node(state: Path, count: int) -> None:
    me = {"pid": os.getpid(), "start": process_start(os.getpid())}
    entries = {}
    for i in range(count):
        cid = f"{i:064x}"
        name = state_layout.alloc_name(ROOT_K8S, cid)
        uuid = UUIDS[i % 2]
        state_layout.make_dirs(str(state), name)
        container_files.make(str(state), name, [DeviceLimit(uuid, 256 << 20, 10)], "default", 1,
                             region.PRIORITY_IDLE_MS_DEFAULT)
        identity = {"io.kubernetes.cri.sandbox-namespace": "bench", "io.kubernetes.cri.sandbox-name":
                    f"pod-{i}", "io.kubernetes.cri.container-name": "main"} if i % 2 else {}
        entries[name] = {"id": cid, "runc_root": ROOT_K8S, "bundle": f"/bundles/{i}",
                         "devices": [{"index": i % 2, "uuid": uuid, "mem_mib": 256, "cores": 10}],
                         "core_policy": "default", "priority": 1, "oversubscribe": True,
                         "identity": identity, "request": {"hami.io/gpumem": "256"},
                         "created_at": 0.0, "pid": 0, "creator": me}
    (state / "allocations.json").write_text(json.dumps({"version": 2, "allocations": entries}))


def scrapes(config: Path, sim_state: Path, sim_config: Path, count: int):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HAMI_", "LD_", "CUDA_"))}
    env.update(HAMI_CONFIG=str(config), HAMI_SIM_STATE=str(sim_state), HAMI_SIM_CONFIG=str(sim_config))
    proc = subprocess.Popen([sys.executable, "-c", "import sys; from hami_runtime.tools.hamictl import main; "
                             "sys.exit(main())", "metrics", "--listen", "127.0.0.1:0"],
                            cwd=ROOT, env=env, stderr=subprocess.PIPE, text=True)
    try:
        url = proc.stderr.readline().split()[1]
        times, series, read = [], 0, 0
        for _ in range(count):
            started = time.monotonic()
            with urllib.request.urlopen(url, timeout=10) as response:
                text = response.read().decode()
            times.append(time.monotonic() - started)
            lines = [line for line in text.splitlines() if line and not line.startswith("#")]
            series = len(lines)
            read += any(line.startswith("hami_gpu_driver_read{") and line.endswith(" 1.0") for line in lines)
        return times, series, read
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        proc.stderr.close()


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--containers", default="10,100")
    parser.add_argument("--scrapes", type=int, default=20)
    args = parser.parse_args()
    if not (SIM_LIB / "libnvidia-ml.so.1").exists():
        print("build/sim is missing: run `make sim`", file=sys.stderr)
        return 1
    print("| containers | driver | median s | p95 s | max s | series | driver read |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for count in (int(n) for n in args.containers.split(",")):
        with tempfile.TemporaryDirectory(prefix="hami-bench-metrics-") as tmp:
            tmp = Path(tmp)
            state = tmp / "state"
            state.mkdir()
            make_node(state, count)
            config = tmp / "hami.toml"
            config.write_text(f'state_dir = "{state}"\nnvml_library = "{SIM_LIB / "libnvidia-ml.so.1"}"\n')
            for driver, sim_line in (("answers", ""), ("hangs", "nvml_memory_info_us = 30000000\n")):
                sim_config = tmp / f"sim-{driver}.conf"
                sim_config.write_text(sim_line)
                times, series, read = scrapes(config, tmp / "sim.state", sim_config, args.scrapes)
                print(f"| {count} | {driver} | {statistics.median(times):.3f} | {percentile(times, 95):.3f} "
                      f"| {max(times):.3f} | {series} | {read}/{len(times)} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
