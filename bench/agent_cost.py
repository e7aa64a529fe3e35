"""What the node agent (`hamictl agent`) costs: CPU of one core with N GPU
containers, each read at every tick.

  .venv/bin/python bench/agent_cost.py [--containers 0,100] [--intervals 100,200,250] [--seconds 20]

A state dir holds N GPU containers on the simulated GPU's two cards (allocator
records and the recorded host pid of each one's first process, as a create and
its hook leave them). Each container is a real cgroup (in the v2 tree, else the
v1 pids hierarchy) holding two processes: its first one (`sleep`) and one that
holds device memory on the simulated driver (`dlmopen_alloc 64 @`: a context of
10 MiB and 64 MiB on the container's card), so every tick lists N cgroups and
NVML lists N/2 processes on each card. The agent runs as it would on a node (its own process, the simulated NVML
loaded into it, every container within its slice), and its CPU time (utime +
stime from /proc) is taken over `--seconds` after a settling second. The
simulated driver is a library in the agent's process (a real one answers from
its kernel module), so the same NVML reads are also run alone, at the same
interval, in a process of their own: what the agent costs beyond them is its
own. Prints a markdown table: containers, interval, CPU % of one core (the
agent's process, the simulated driver's reads alone, the difference) and the
agent's own CPU ms per tick.
"""
import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from sim_runtime import ROOT

sys.path.insert(0, str(ROOT))
from hami_runtime.files import process_start  # noqa: E402
from hami_runtime.lifecycle.node_state import state_layout  # noqa: E402
from hami_runtime.node import agent_state, cgroups  # noqa: E402

SIM = ROOT / "build" / "sim"
HOLDER = SIM / "tests" / "dlmopen_alloc"
UUIDS = ("GPU-453c5d90-9eaf-43fa-be71-c8ae8fc44d65", "GPU-da942c99-406e-4954-8dfc-5fec34eaffef")
RUNC_ROOT = "/run/hami-bench/runc"
TICK = os.sysconf("SC_CLK_TCK")


def cgroup_top() -> Path:
    where = cgroups.mounts()
    base = where.get("") or where.get("pids")
    if not base:
        raise SystemExit("no cgroup v2 tree and no v1 pids hierarchy mounted")
    top = Path(base) / f"hami-bench-agent-{os.getpid()}"
    top.mkdir()
    return top


def cpu_ticks(pid: int) -> int:
    with open(f"/proc/{pid}/stat", "rb") as handle:
        fields = handle.read().rpartition(b")")[2].split()
    return int(fields[11]) + int(fields[12])  # utime, stime


class Node:
    """N containers: records, pid files, cgroups and their processes."""

    def __init__(self, tmp: Path, count: int, env: dict):
        self.state = tmp / "state"
        self.state.mkdir(mode=0o700)
        self.procs = []
        self.top = cgroup_top()
        entries = {}
        me = {"pid": os.getpid(), "start": process_start(os.getpid())}
        for i in range(count):
            cid = f"bench-{i:04d}"
            name = state_layout.alloc_name(RUNC_ROOT, cid)
            group = self.top / cid
            group.mkdir()
            first = self.spawn(["sleep", "3600"], group, env)
            self.spawn([str(HOLDER), "-d", str(i % 2), "64", "@"], group, env, wait_line="held")
            state_layout.make_dirs(str(self.state), name)
            state_layout.record_host_pid(str(self.state), name, first.pid)
            uuid = UUIDS[i % 2]
            entries[name] = {"id": cid, "runc_root": RUNC_ROOT, "bundle": f"/bundles/{cid}",
                             "devices": [{"index": i % 2, "uuid": uuid, "mem_mib": 1024, "cores": 0}],
                             "core_policy": "default", "priority": 1, "oversubscribe": True,
                             "identity": {}, "request": {"hami.io/gpumem": "1024"},
                             "created_at": 0.0, "pid": 0, "creator": me}
        (self.state / "allocations.json").write_text(json.dumps({"version": 2, "allocations": entries}))

    def spawn(self, argv, group: Path, env: dict, wait_line: str = ""):
        def enter():
            with open(group / "cgroup.procs", "w") as handle:
                handle.write(str(os.getpid()))
        proc = subprocess.Popen(argv, env=env, preexec_fn=enter, stdin=subprocess.DEVNULL,
                                stdout=subprocess.PIPE if wait_line else subprocess.DEVNULL, text=True)
        self.procs.append(proc)
        while wait_line:
            line = proc.stdout.readline()
            if not line:
                raise SystemExit(f"{argv[0]} ended before it said {wait_line!r}")
            if line.strip() == wait_line:
                break
        return proc

    def close(self):
        for proc in self.procs:
            proc.kill()
        for proc in self.procs:
            proc.wait(timeout=30)
            if proc.stdout:
                proc.stdout.close()
        for group in sorted(self.top.iterdir(), reverse=True):
            if group.is_dir():
                group.rmdir()
        self.top.rmdir()


# the driver calls a tick makes (per GPU: the compute processes, the utilisation samples), straight
# through ctypes into buffers made once: what the simulated driver costs, next to nothing of Python
DRIVER_ALONE = """
import ctypes, os, sys, time
ctypes.CDLL(sys.argv[1], mode=os.RTLD_GLOBAL)
import pynvml
pynvml.nvmlInit()
handles = [pynvml.nvmlDeviceGetHandleByUUID(u) for u in sys.argv[2].split(",")]
procs = pynvml._nvmlGetFunctionPointer("nvmlDeviceGetComputeRunningProcesses_v3")
util = pynvml._nvmlGetFunctionPointer("nvmlDeviceGetProcessUtilization")
infos = (pynvml.c_nvmlProcessInfo_v3_t * 1024)()
samples = (pynvml.c_nvmlProcessUtilizationSample_t * 1024)()
interval = int(sys.argv[3]) / 1000
print("ready", flush=True)
while True:
    started = time.monotonic()
    since = ctypes.c_ulonglong(int((time.time() - 1) * 1e6))
    for handle in handles:
        count = ctypes.c_uint(1024)
        procs(handle, ctypes.byref(count), infos)
        count = ctypes.c_uint(1024)
        util(handle, samples, ctypes.byref(count), since)
    time.sleep(max(0.0, started + interval - time.monotonic()))
"""


def measure_driver(env: dict, interval_ms: int, seconds: float) -> float:
    """CPU % of one core of the agent's NVML reads alone, at its interval."""
    reads = subprocess.Popen([sys.executable, "-c", DRIVER_ALONE, str(SIM / "lib" / "libnvidia-ml.so.1"),
                              ",".join(UUIDS), str(interval_ms)], cwd=ROOT, env={**env, "PYTHONPATH": str(ROOT)},
                             stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, text=True)
    try:
        assert reads.stdout.readline().strip() == "ready"
        time.sleep(1.0)
        before, started = cpu_ticks(reads.pid), time.monotonic()
        time.sleep(seconds)
        return 100.0 * (cpu_ticks(reads.pid) - before) / TICK / (time.monotonic() - started)
    finally:
        reads.kill()
        reads.wait(timeout=30)
        reads.stdout.close()


def measure(tmp: Path, env: dict, interval_ms: int, seconds: float) -> tuple:
    config = tmp / f"hami-{interval_ms}.toml"
    config.write_text(f'state_dir = "{tmp / "state"}"\nnvml_library = "{SIM / "lib" / "libnvidia-ml.so.1"}"\n'
                      f"agent_interval_ms = {interval_ms}\n")
    agent = subprocess.Popen([sys.executable, "-c", "import sys; from hami_runtime.tools.hamictl import main; "
                              "sys.exit(main())", "agent"], cwd=ROOT, env={**env, "HAMI_CONFIG": str(config)},
                             stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while (state := agent_state.read(str(tmp / "state"))) is None or state.pid != agent.pid:
            if time.monotonic() > deadline or agent.poll() is not None:
                raise SystemExit("the agent did not start")
            time.sleep(0.1)
        time.sleep(1.0)  # settled: NVML started, every cgroup found
        before, started = cpu_ticks(agent.pid), time.monotonic()
        time.sleep(seconds)
        used, elapsed = (cpu_ticks(agent.pid) - before) / TICK, time.monotonic() - started
        state = agent_state.read(str(tmp / "state"))
        seen = sum(1 for rec in state.containers.values() if any(rec.held.values()))
        return 100.0 * used / elapsed, seen
    finally:
        agent.send_signal(signal.SIGTERM)
        agent.wait(timeout=30)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--containers", default="0,100")
    parser.add_argument("--intervals", default="100,200,250")
    parser.add_argument("--seconds", type=float, default=20.0)
    args = parser.parse_args()
    if not HOLDER.exists():
        print("build/sim is missing: run `make sim`", file=sys.stderr)
        return 1
    print("| containers | interval ms | agent's process, CPU % of one core | the simulated driver's reads "
          "alone | the agent's own | its own CPU ms per tick | containers seen holding |")
    print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for count in (int(n) for n in args.containers.split(",")):
        with tempfile.TemporaryDirectory(prefix="hami-bench-agent-") as tmp:
            tmp = Path(tmp)
            (tmp / "sim.conf").write_text("context_mib = 10\n")
            env = {k: v for k, v in os.environ.items() if not k.startswith(("HAMI_", "LD_", "CUDA_"))}
            env.update(HAMI_SIM_STATE=str(tmp / "sim.state"), HAMI_SIM_CONFIG=str(tmp / "sim.conf"),
                       LD_LIBRARY_PATH=str(SIM / "lib"))
            node = Node(tmp, count, env)
            try:
                for interval in (int(n) for n in args.intervals.split(",")):
                    pct, seen = measure(tmp, env, interval, args.seconds)
                    driver = measure_driver(env, interval, args.seconds)
                    own = max(0.0, pct - driver)
                    print(f"| {count} | {interval} | {pct:.2f} | {driver:.2f} | {own:.2f} | "
                          f"{10 * own * interval / 1000:.2f} | {seen} |", flush=True)
            finally:
                node.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
