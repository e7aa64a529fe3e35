"""What NVML shows per process, as a node agent on the host reads it: one entry per
process by its host pid, whatever it loaded (two copies of the driver in one process,
one of them by dlmopen, are one process), and the memory of a process of another pid
namespace let go of as soon as it is gone (the host checks it by its host pid, as a
real driver sees a process end), not when its heartbeat goes stale."""
import json
import shutil
import signal
import subprocess
import sys
import time

import pytest

from tests.conftest import PidService
from tests.simgpu.conftest import SIM_LIB, SIM_TESTS, script

MIB = 1 << 20
CONTEXT = 300  # MiB, the simulator's context_mib

HOST = script("""
    import pynvml
    pynvml.nvmlInit()
    h = pynvml.nvmlDeviceGetHandleByIndex(0)
    print(json.dumps([[p.pid, p.usedGpuMemory >> 20] for p in pynvml.nvmlDeviceGetComputeRunningProcesses(h)]))
""").replace("import ctypes,", "import json, ctypes,")

# the process's own copy (libcuda linked as any program's), then a second one in a new link-map
# namespace, each with a context and an allocation
TWO_COPIES = script(f"""
    c = Cuda(); c.init(); c.alloc(64 << 20)
    libc = ctypes.CDLL(None)
    libc.dlmopen.restype = libc.dlsym.restype = ctypes.c_void_p
    libc.dlmopen.argtypes = [ctypes.c_long, ctypes.c_char_p, ctypes.c_int]
    libc.dlsym.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
    copy = libc.dlmopen(-1, b"{SIM_LIB}/libcuda.so.1", 2)
    def fn(name, *types):
        return ctypes.CFUNCTYPE(ctypes.c_int, *types)(libc.dlsym(copy, name.encode()))
    ctx, ptr = ctypes.c_void_p(), ctypes.c_ulonglong()
    assert fn("cuInit", ctypes.c_uint)(0) == 0
    assert fn("cuCtxCreate_v2", ctypes.c_void_p, ctypes.c_uint, ctypes.c_int)(ctypes.byref(ctx), 0, 0) == 0
    assert fn("cuMemAlloc_v2", ctypes.c_void_p, ctypes.c_size_t)(ctypes.byref(ptr), 128 << 20) == 0
    print("ready", os.getpid(), flush=True)
    wait_for_stdin_close()
""")


def test_two_copies_of_the_driver_are_one_process(sim_env, run_py):
    proc = subprocess.Popen([sys.executable, "-c", TWO_COPIES], env=sim_env, stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    try:
        ready, pid = proc.stdout.readline().split()
        assert ready == "ready"
        assert json.loads(run_py(HOST)) == [[int(pid), 2 * CONTEXT + 64 + 128]]
    finally:
        proc.stdin.close()
        proc.wait(timeout=30)
        proc.stdout.close()


def test_a_dlmopen_copy_alone_is_counted_by_the_driver(sim_env, run_py):
    """dlmopen_alloc (the agent tests' process that bypasses libvgpu) holds what it asked for."""
    proc = subprocess.Popen([str(SIM_TESTS / "dlmopen_alloc"), "200", "@"], env=sim_env, stdout=subprocess.PIPE,
                            text=True)
    try:
        lines = [proc.stdout.readline().strip() for _ in range(3)]
        assert lines[1:] == ["alloc 200 0", "held"], lines
        assert json.loads(run_py(HOST)) == [[proc.pid, CONTEXT + 200]]
    finally:
        proc.kill()
        proc.wait(timeout=30)
        proc.stdout.close()


@pytest.mark.skipif(shutil.which("unshare") is None, reason="needs unshare")
def test_another_namespace_let_go_of_at_once_where_its_host_pid_is_known(tmp_path, sim_env, run_py):
    """stale_seconds at its default (10): the host sees the memory go within a second."""
    holder_script = script("c = Cuda(); c.init(0); c.alloc(1 << 30); print('ready', flush=True); "
                           "wait_for_stdin_close()")
    with PidService(tmp_path):
        holder = subprocess.Popen(["unshare", "--pid", "--fork", "--kill-child", "--mount-proc", sys.executable,
                                   "-c", holder_script], env=sim_env, stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, text=True)
        try:
            if holder.stdout.readline().strip() != "ready":
                pytest.skip("cannot create a pid namespace here")
            child = int(subprocess.run(["pgrep", "-P", str(holder.pid)], capture_output=True,
                                       text=True).stdout.split()[0])
            assert json.loads(run_py(HOST)) == [[child, CONTEXT + 1024]]
            holder.send_signal(signal.SIGKILL)  # its namespace's init: everything in it dies
            holder.wait(timeout=10)
            deadline = time.monotonic() + 1.0
            while json.loads(run_py(HOST)) and time.monotonic() < deadline:
                time.sleep(0.05)
            assert json.loads(run_py(HOST)) == []
        finally:
            if holder.poll() is None:
                holder.kill()
            holder.wait(timeout=10)
            holder.stdin.close()
            holder.stdout.close()
