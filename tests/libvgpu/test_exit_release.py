"""A process that exits normally gives its slot back at once: with no other process
starting in between, the container's views (NVML through libvgpu, the simulated
nvidia-smi) count only the processes still running."""
import re
import subprocess
import sys
import textwrap

import pytest

from tests.conftest import ROOT, SIM

from .conftest import MIB, PROBE
from .conftest import release as finish
from .test_shared_limit import wait_line
from .test_views_nvml import pynvml_view

LIMIT = 1024 * MIB
HOLD = 256 * MIB
KEPT = 64 * MIB

# Takes a context and KEPT bytes it never frees, then ends as argv[1] says.
SCRIPT = textwrap.dedent("""
    import ctypes, os, sys, threading, time
    from tests.simgpu.simcuda import Cuda
    cuda = Cuda()
    ctx = cuda.init()
    cuda.alloc(%d)
    how = sys.argv[1]
    if how == "exit":
        ctypes.CDLL(None).exit(0)
    elif how == "threads":
        def churn():
            cuda.call("cuCtxSetCurrent", ctx)
            while True:
                cuda.free(cuda.alloc(2 << 20))
        for _ in range(4):
            threading.Thread(target=churn, daemon=True).start()
        time.sleep(0.3)
        ctypes.CDLL(None).exit(0)
    elif how == "fork":
        pid = os.fork()
        if pid == 0:
            sys.exit(0)
        os.waitpid(pid, 0)
        print("forked", flush=True)
        sys.stdin.read()
""" % KEPT)

EXITS = {
    "probe returns from main": [str(PROBE), "link", "alloc", "mem", str(KEPT)],
    "python ends holding memory": [sys.executable, "-c", SCRIPT, "end"],
    "exit() holding memory": [sys.executable, "-c", SCRIPT, "exit"],
    "exit() while other threads allocate": [sys.executable, "-c", SCRIPT, "threads"],
}


def env(probe):
    return probe.env(shared=True, CUDA_DEVICE_MEMORY_LIMIT=LIMIT, PYTHONPATH=ROOT)


def used_views(probe):
    """Device 0's used bytes as pynvml sees it, and as nvidia-smi prints it (MiB)."""
    (_, used, *_), _ = pynvml_view(probe, CUDA_DEVICE_MEMORY_LIMIT=LIMIT)
    out = subprocess.run([str(SIM / "bin" / "nvidia-smi")], env=env(probe),
                         capture_output=True, text=True, timeout=30, check=True).stdout
    gpu0 = next(line for line in out.splitlines() if "|   0  " in line)
    smi = re.search(r"\|\s+(\d+)/1024\s", gpu0)
    assert smi, out
    return used, int(smi.group(1)) * MIB


@pytest.mark.parametrize("argv", EXITS.values(), ids=EXITS.keys())
def test_exited_process_leaves_the_view_at_once(probe, argv):
    ctx = probe.context_bytes()
    holder = probe.start("link", "hold", "mem", HOLD, 60, CUDA_DEVICE_MEMORY_LIMIT=LIMIT)
    try:
        assert wait_line(holder, "held") == "held rc=0\n"
        subprocess.run(argv, env=env(probe), cwd=ROOT, capture_output=True, timeout=30, check=True)
        assert used_views(probe) == (ctx + HOLD, ctx + HOLD)
    finally:
        finish(holder)


def test_forked_child_leaves_the_parents_slot(probe):
    ctx = probe.context_bytes()
    parent = subprocess.Popen([sys.executable, "-c", SCRIPT, "fork"], env=env(probe), cwd=ROOT,
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
    try:
        assert wait_line(parent, "forked") == "forked\n"
        assert used_views(probe) == (ctx + KEPT, ctx + KEPT)
    finally:
        finish(parent)
    assert parent.returncode == 0
    assert used_views(probe) == (0, 0)
