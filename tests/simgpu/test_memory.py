"""Device memory is accounted across processes and given back when a process ends."""
import json
import signal
import time

import pytest

from tests.simgpu.conftest import MIB

CONTEXT = 300 * MIB
TOTAL = 16384 * MIB

HOLD_1000 = "c = Cuda(); c.init(0); c.alloc(1000 << 20); print('ready', flush=True); wait_for_stdin_close()"

VIEW = """
import pynvml
c = Cuda(); c.init(0)
free, total = c.mem_info()
pynvml.nvmlInit()
h = pynvml.nvmlDeviceGetHandleByIndex(0)
procs = sorted([p.pid, p.usedGpuMemory] for p in pynvml.nvmlDeviceGetComputeRunningProcesses(h))
import json
print(json.dumps([free, total, pynvml.nvmlDeviceGetMemoryInfo(h).used, procs, os.getpid()]))
"""


def view(run_py):
    free, total, nvml_used, procs, me = json.loads(run_py(VIEW))
    return free, total, nvml_used, [tuple(p) for p in procs], me


def test_two_processes_see_each_others_memory(run_py, spawn_py):
    holder = spawn_py(HOLD_1000)
    free, total, nvml_used, procs, me = view(run_py)
    assert total == TOTAL
    # the holder's context + 1000 MiB, and the viewer's own context
    assert free == TOTAL - (CONTEXT + 1000 * MIB) - CONTEXT
    assert nvml_used == TOTAL - free
    assert procs == sorted([(holder.pid, CONTEXT + 1000 * MIB), (me, CONTEXT)])


@pytest.mark.parametrize("how", ["exit", "sigkill"])
def test_ended_process_gives_memory_back(run_py, spawn_py, how):
    holder = spawn_py(HOLD_1000)
    if how == "exit":
        holder.stdin.close()
    else:
        holder.send_signal(signal.SIGKILL)
    holder.wait(timeout=10)
    free, total, nvml_used, procs, me = view(run_py)
    assert free == TOTAL - CONTEXT and procs == [(me, CONTEXT)]


def test_killed_while_allocating_in_a_loop_leaks_nothing(run_py, spawn_py):
    churn = spawn_py("""
        c = Cuda(); c.init(0); print('ready', flush=True)
        while True:
            c.free(c.alloc(64 << 20))
    """)
    time.sleep(0.3)
    churn.send_signal(signal.SIGKILL)
    churn.wait(timeout=10)
    assert view(run_py)[0] == TOTAL - CONTEXT


def test_out_of_memory_is_refused_and_the_largest_fit_succeeds(run_py, spawn_py):
    spawn_py("c = Cuda(); c.init(0); c.alloc(10000 << 20); print('ready', flush=True); wait_for_stdin_close()")
    out = run_py("""
        c = Cuda(); c.init(0)
        free, _ = c.mem_info()
        print(free, c.alloc_rc(free + 1), c.alloc_rc(free))
        print(c.mem_info()[0], c.alloc_rc(1))
    """).split()
    free = int(out[0])
    assert free == TOTAL - 2 * CONTEXT - 10000 * MIB
    assert out[1:] == ["2", "0", "0", "2"]  # OUT_OF_MEMORY, fits, then nothing left


def test_allocation_kinds_and_their_charges(run_py):
    out = run_py("""
        c = Cuda(); c.init(0)
        base = c.mem_info()[0]
        used = lambda: (base - c.mem_info()[0]) >> 20
        p = c.alloc(1); print(used()); c.free(p)
        ptr, pitch = ctypes.c_uint64(), ctypes.c_size_t()
        c.call("cuMemAllocPitch_v2", ctypes.byref(ptr), ctypes.byref(pitch), ctypes.c_size_t(1000), ctypes.c_size_t(4096), 4)
        print(pitch.value, used()); c.free(ptr.value)
        print(c.rc("cuMemAllocPitch_v2", ctypes.byref(ptr), ctypes.byref(pitch), ctypes.c_size_t(1000), ctypes.c_size_t(10), 3))
        c.call("cuMemAllocManaged", ctypes.byref(ptr), ctypes.c_size_t(100 << 20), 1); print(used()); c.free(ptr.value)
        host = ctypes.c_void_p(); c.call("cuMemAllocHost_v2", ctypes.byref(host), ctypes.c_size_t(100 << 20))
        print(used(), c.rc("cuMemFreeHost", host), c.rc("cuMemFreeHost", host))
        print(used(), c.rc("cuMemFree_v2", ctypes.c_uint64(0x1234)), c.alloc_rc(0), c.alloc_rc(2**64 - 1))
        print(c.rc("cuMemAllocAsync", ctypes.byref(ptr), ctypes.c_size_t(2**64 - 1), None), used())
    """).split()
    # managed memory lives in host pages: no device memory (test_managed.py)
    assert out == ["2", "1024", "4", "1", "0", "0", "0", "1", "0", "1", "1", "2", "2", "0"]


def test_context_create_and_destroy_take_and_free_memory(run_py):
    out = run_py("""
        c = Cuda(); c.call("cuInit", 0)
        free = lambda: c.mem_info()[0] >> 20
        ctx = ctypes.c_void_p(); c.call("cuCtxCreate_v2", ctypes.byref(ctx), 0, 0)
        a = free(); c.alloc(500 << 20)
        ctx2 = ctypes.c_void_p(); c.call("cuCtxCreate_v3", ctypes.byref(ctx2), None, 0, 0, 0)
        b = free()
        dev = ctypes.c_int(); cur = ctypes.c_void_p()
        c.call("cuCtxGetCurrent", ctypes.byref(cur)); c.call("cuCtxGetDevice", ctypes.byref(dev))
        print(a, b, cur.value == ctx2.value, dev.value)
        c.call("cuCtxDestroy_v2", ctx2); c.call("cuCtxGetCurrent", ctypes.byref(cur)); print(cur.value == ctx.value, free())
        c.call("cuCtxDestroy_v2", ctx)  # frees the 500 MiB allocated in it
        print(c.rc("cuCtxSetCurrent", ctx), c.rc("cuCtxDestroy_v2", ctx))
        c.init(0); print(free())
        c.call("cuDevicePrimaryCtxRelease_v2", 0); print(c.rc("cuMemGetInfo_v2", ctypes.byref(ctypes.c_size_t()), ctypes.byref(ctypes.c_size_t())))
    """).split()
    assert out == ["16084", "15284", "True", "0", "True", "15584", "201", "201", "16084", "201"]


def test_copies_use_real_backing_memory(run_py):
    out = run_py("""
        c = Cuda(); c.init(0)
        p = c.alloc(16 << 20)
        src = ctypes.create_string_buffer(b"simulated", 9); dst = ctypes.create_string_buffer(9)
        c.call("cuMemsetD8_v2", ctypes.c_uint64(p), 0x41, ctypes.c_size_t(16 << 20))
        c.call("cuMemcpyHtoD_v2_ptds", ctypes.c_uint64(p + 100), src, ctypes.c_size_t(9))
        c.call("cuMemcpyDtoH_v2", dst, ctypes.c_uint64(p + 98), ctypes.c_size_t(9))
        past_end = c.rc("cuMemcpyDtoH_v2", dst, ctypes.c_uint64(p + (16 << 20) - 4), ctypes.c_size_t(9))
        c.free(p)
        freed = c.rc("cuMemcpyDtoH_v2", dst, ctypes.c_uint64(p), ctypes.c_size_t(9))
        print(dst.raw.decode(), past_end, freed)
    """).split()
    assert out == ["AAsimulat", "1", "1"]
