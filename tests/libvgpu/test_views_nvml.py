"""NVML as the container sees it: pynvml (dlopen + dlsym) and nvidia-smi (linked)."""
import re
import subprocess
import sys
import textwrap

from tests.conftest import SIM

from .conftest import MIB
from .conftest import release as finish
from .test_shared_limit import wait_line

HOLD = 256 * MIB
LIMIT = 1024 * MIB

PYNVML = textwrap.dedent("""
    import pynvml
    pynvml.nvmlInit()
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    m = pynvml.nvmlDeviceGetMemoryInfo(handle)
    v2 = pynvml.nvmlDeviceGetMemoryInfo(handle, version=pynvml.nvmlMemory_v2)
    pids = sorted(p.pid for p in pynvml.nvmlDeviceGetComputeRunningProcesses(handle))
    print(m.total, m.used, m.free, v2.total, v2.used, v2.free, ",".join(map(str, pids)))
""")


def pynvml_view(probe, **env):
    out = subprocess.run(probe.prefix + [sys.executable, "-c", PYNVML], env=probe.env(shared=True, **env),
                         capture_output=True, text=True, timeout=30, check=True).stdout.split()
    return [int(x) for x in out[:6]], [int(p) for p in out[6].split(",")] if len(out) > 6 else []


def test_pynvml_sees_the_limit_and_the_containers_usage(probe):
    ctx = probe.context_bytes()
    holder = probe.start("link", "hold", "mem", HOLD, 60, CUDA_DEVICE_MEMORY_LIMIT=LIMIT)
    try:
        assert wait_line(holder, "held") == "held rc=0\n"
        (total, used, free, total2, used2, free2), _ = pynvml_view(probe, CUDA_DEVICE_MEMORY_LIMIT=LIMIT)
        assert (total, used, free) == (LIMIT, ctx + HOLD, LIMIT - ctx - HOLD)
        assert (total2, used2, free2) == (total, used, free)
    finally:
        finish(holder)


def test_pynvml_unchanged_without_limit(probe):
    plain = subprocess.run([sys.executable, "-c", PYNVML], env=probe.env(preload=False),
                           capture_output=True, text=True, timeout=30, check=True).stdout
    hooked = subprocess.run([sys.executable, "-c", PYNVML], env=probe.env(),
                            capture_output=True, text=True, timeout=30, check=True).stdout
    assert hooked == plain


def test_running_processes_are_the_containers_own(probe):
    from hami_runtime.node import region

    probe.runtime_files([region.DeviceLimit(u, LIMIT, 0) for u in probe.uuids()]).close()
    ours = probe.start("link", "hold", "mem", HOLD, 60)
    theirs = probe.start("link", "hold", "mem", HOLD, 60, preload=False, shared=False)
    try:
        assert wait_line(ours, "held") == "held rc=0\n"
        assert wait_line(theirs, "held") == "held rc=0\n"
        _, pids = pynvml_view(probe)
        assert pids == [ours.pid]
    finally:
        finish(ours)
        finish(theirs)


def test_nvidia_smi_shows_the_limit(probe):
    holder = probe.start("link", "hold", "mem", HOLD, 60, CUDA_DEVICE_MEMORY_LIMIT=LIMIT)
    try:
        assert wait_line(holder, "held") == "held rc=0\n"
        out = subprocess.run([str(SIM / "bin" / "nvidia-smi")],
                             env=probe.env(shared=True, CUDA_DEVICE_MEMORY_LIMIT=LIMIT),
                             capture_output=True, text=True, timeout=30, check=True).stdout
        gpu0 = next(line for line in out.splitlines() if "|   0  " in line)
        # The Memory MiB column is used/total: the total is the limit, not the card.
        assert re.search(r"\|\s+\d+/1024\s", gpu0) and "16384" not in gpu0, out
    finally:
        finish(holder)


def test_usage_above_the_limit_never_underflows(probe):
    """A container over its limit (e.g. the runtime lowered it) shows a full card."""
    import os

    from hami_runtime.node import region

    probe.runtime_files([region.DeviceLimit(u, LIMIT, 0) for u in probe.uuids()]).close()
    with open(f"/proc/{os.getpid()}/stat") as f:
        start = int(f.read().rsplit(")", 1)[1].split()[19])
    with region.open(probe.region, writable=True) as r:
        slot = r._struct().procs[0]
        slot.owner = (os.getpid() << 32) | (start & 0xFFFFFFFF)  # alive: never reclaimed
        slot.pid = os.getpid()
        slot.mem_used[0] = 2 * LIMIT
        r._struct().procs_high = 1
    (total, used, free, total2, used2, free2), _ = pynvml_view(probe)
    assert (total, used, free) == (LIMIT, LIMIT, 0)
    assert (total2, used2, free2) == (LIMIT, LIMIT, 0)
