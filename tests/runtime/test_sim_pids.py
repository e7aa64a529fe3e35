"""Two containers on one simulated card, with no pid service beside the simulator's
state (tests/simgpu/sim_pids.c): each container's process is pid 1 in its own pid
namespace, yet each gets its whole slice, the host's NVML names each by its host pid
with its own memory, and the host's tools put that memory in its slice, none of it
"outside every slice"."""
import json
import subprocess
import sys
import time

import pytest

from .node import Node

SLICE = {"hami.io/gpumem": "1024"}
HOLD_MIB = 300
CONTEXT_MIB = 300  # the simulator's default context size
MiB = 1 << 20
WAIT = 30
HOST_NVML = """
import json, pynvml
pynvml.nvmlInit()
h = pynvml.nvmlDeviceGetHandleByIndex(0)
print(json.dumps({p.pid: p.usedGpuMemory for p in pynvml.nvmlDeviceGetComputeRunningProcesses(h)}))
"""


@pytest.fixture
def bare_node(tmp_path, rootfs, spec_template, sim_copy):
    n = Node(tmp_path, rootfs, spec_template, sim_copy, pid_service=False)
    yield n
    n.cleanup()


def wait_for(what, check, timeout=WAIT):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.1)
    raise AssertionError(f"no {what} in {timeout} s")


def test_two_containers_figures_are_right_without_the_pid_service(bare_node):
    node = bare_node
    runs, gates = {}, {}
    try:
        for cid in ("first", "second"):
            gates[cid] = node.rootfs / "tmp" / f"{node.tmp.name}-{cid}-go"   # it holds its memory until this exists
            bundle = node.bundle(cid, SLICE, args=("sh", "-c", f"cuda_alloc {HOLD_MIB} @/tmp/{gates[cid].name}"))
            with open(node.tmp / f"{cid}.out", "wb") as out:
                runs[cid] = subprocess.Popen(node.runtime_argv("run", "--bundle", str(bundle), cid),
                                             stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                             env=node.env, cwd=node.tmp)
            out = node.tmp / f"{cid}.out"
            wait_for(f"allocation in {cid}", lambda: "alloc" in out.read_text())
            assert f"alloc {HOLD_MIB} 0" in out.read_text()  # 0: CUDA_SUCCESS
        assert not (node.sim_state / "host-pids.sock").exists()

        top = json.loads(node.hamictl("top", "--json", "--interval", "0.2").stdout)
        held = (HOLD_MIB + CONTEXT_MIB) * MiB
        host_pids = {}
        for c in top["containers"]:
            [proc] = c["processes"]
            assert proc["pid"] == 1  # each container's own view
            host_pids[c["id"]] = proc["host_pid"]
            assert c["devices"][0]["mem_used_bytes"] == held
        assert len(set(host_pids.values())) == 2

        env = {**node.env, "LD_LIBRARY_PATH": str(node.sim_root / "lib")}
        nvml = subprocess.run([sys.executable, "-c", HOST_NVML], env=env, capture_output=True, text=True,
                              timeout=WAIT, check=True)
        assert json.loads(nvml.stdout) == {str(pid): held for pid in host_pids.values()}

        [gpu] = [g for g in top["gpus"] if g["index"] == 0]
        assert gpu["driver_used_bytes"] == 2 * held
        assert gpu["outside_bytes"] == 0 and gpu["outside_pids"] == []
        gpus = json.loads(node.hamictl("gpus", "--json").stdout)
        assert gpus[0]["memory_outside_mib"] == 0 and gpus[0]["outside_pids"] == []
    finally:
        for gate in gates.values():
            gate.touch()
        for proc in runs.values():
            proc.wait(timeout=WAIT)
        for gate in gates.values():
            gate.unlink(missing_ok=True)
