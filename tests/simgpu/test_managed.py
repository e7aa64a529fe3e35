"""Managed (unified) memory: host-backed pages counted apart from device memory, bounded
by the machine's host budget, reached like device memory and from the host."""
import json
import textwrap

import pytest

from tests.simgpu.conftest import MIB

CARD_MIB = 4096
HOST_MIB = 8192
CONTEXT = 300 * MIB


@pytest.fixture
def small_env(sim_env, tmp_path):
    config = tmp_path / "sim.conf"
    config.write_text(f"devices = 1\nmemory_mib = {CARD_MIB}\nhost_memory_mib = {HOST_MIB}\n")
    return dict(sim_env, HAMI_SIM_CONFIG=str(config))


MANAGED = """
def managed(c, nbytes, flags=1):
    ptr = ctypes.c_uint64()
    rc = c.rc("cuMemAllocManaged", ctypes.byref(ptr), ctypes.c_size_t(nbytes), flags)
    return rc, ptr.value
def nvml_used():
    import pynvml
    pynvml.nvmlInit()
    h = pynvml.nvmlDeviceGetHandleByIndex(0)
    return (pynvml.nvmlDeviceGetMemoryInfo(h).used,
            [p.usedGpuMemory for p in pynvml.nvmlDeviceGetComputeRunningProcesses(h)])
"""


def scenario(body):
    return MANAGED + textwrap.dedent(body)


def test_managed_memory_goes_past_the_card_and_leaves_device_memory_alone(run_py, small_env):
    out = json.loads(run_py(scenario("""
        import json
        c = Cuda(); c.init(0)
        before = c.mem_info()[0], nvml_used()
        big = 6000 << 20                       # more than the card holds
        plain = c.alloc_rc(big)
        rc, p = managed(c, big)
        after = c.mem_info()[0], nvml_used()
        print(json.dumps({"plain": plain, "managed": rc, "same": before == after,
                          "free": after[0], "procs": after[1][1]}))
        c.free(p)
    """), env=small_env))
    assert out["plain"] == 2 and out["managed"] == 0          # OUT_OF_MEMORY vs success
    assert out["same"], "managed memory changed the device's free or NVML's used memory"
    assert out["free"] == CARD_MIB * MIB - CONTEXT
    assert out["procs"] == [CONTEXT]                          # per process: device memory only


@pytest.mark.parametrize("first, second, expect", [
    (4000, 4000, [0, 0]),            # within the host budget
    (6000, 4000, [0, 2]),            # the second passes it: OUT_OF_MEMORY
    (HOST_MIB + 2, 2, [2, 0]),       # larger than the host budget at all
])
def test_host_budget_bounds_managed_memory(run_py, small_env, first, second, expect):
    out = run_py(scenario(f"""
        c = Cuda(); c.init(0)
        a, _ = managed(c, {first} << 20)
        b, _ = managed(c, {second} << 20)
        print(a, b)
    """), env=small_env).split()
    assert [int(x) for x in out] == expect


def test_host_budget_is_shared_by_the_machine_and_given_back_on_free(run_py, spawn_py, small_env):
    holder = spawn_py(scenario("""
        c = Cuda(); c.init(0); rc, p = managed(c, 6000 << 20); assert rc == 0
        print('ready', flush=True); wait_for_stdin_close(); c.free(p)
    """), env=small_env)
    assert run_py(scenario("c = Cuda(); c.init(0); print(managed(c, 4000 << 20)[0])"),
                  env=small_env).split() == ["2"]
    holder.stdin.close()
    holder.wait(timeout=10)
    assert run_py(scenario("""
        c = Cuda(); c.init(0)
        rc, p = managed(c, 6000 << 20); c.free(p)
        print(rc, managed(c, 6000 << 20)[0])    # freed: the budget is back
    """), env=small_env).split() == ["0", "0"]


def test_managed_memory_is_reached_by_copies_fills_and_the_host(run_py, small_env):
    out = run_py(scenario("""
        c = Cuda(); c.init(0)
        rc, m = managed(c, 16 << 20)
        d = c.alloc(4 << 20)
        c.call("cuMemsetD8_v2", ctypes.c_uint64(m), 0x41, ctypes.c_size_t(16 << 20))
        src = ctypes.create_string_buffer(b"managed", 7)
        c.call("cuMemcpyHtoD_v2", ctypes.c_uint64(m + 100), src, ctypes.c_size_t(7))
        c.call("cuMemcpyDtoD_v2", ctypes.c_uint64(d), ctypes.c_uint64(m + 98), ctypes.c_size_t(9))
        dst = ctypes.create_string_buffer(9)
        c.call("cuMemcpyDtoH_v2", dst, ctypes.c_uint64(d), ctypes.c_size_t(9))
        host_view = ctypes.string_at(m + 98, 9)             # the host reads it in place
        ctypes.memmove(m, b"host", 4)                        # and writes it
        back = ctypes.create_string_buffer(4)
        c.call("cuMemcpyDtoH_v2", back, ctypes.c_uint64(m), ctypes.c_size_t(4))
        c.kernel(10)                                         # kernels run beside it
        c.call("cuCtxSynchronize")
        print(dst.raw.decode(), host_view.decode(), back.raw.decode())
        c.free(m)
        print(c.rc("cuMemcpyDtoH_v2", back, ctypes.c_uint64(m), ctypes.c_size_t(4)))
    """), env=small_env).split()
    assert out == ["AAmanaged", "AAmanaged", "host", "1"]    # freed: INVALID_VALUE


@pytest.mark.parametrize("attr, ctype, managed_value, device_value", [
    (2, "c_uint", 2, 2),             # MEMORY_TYPE: device, as the driver reports managed memory
    (8, "c_ubyte", 1, 0),            # IS_MANAGED
    (4, "c_uint64", "ptr", -1),      # HOST_POINTER: its own address; device memory has none
    (10, "c_ubyte", 0, 1),           # IS_LEGACY_CUDA_IPC_CAPABLE
    (12, "c_size_t", 3 << 20, 3 << 20),  # RANGE_SIZE
    (9, "c_int", 0, 0),              # DEVICE_ORDINAL
])
def test_pointer_attributes_of_managed_memory(run_py, small_env, attr, ctype, managed_value,
                                              device_value):
    out = json.loads(run_py(scenario(f"""
        import json
        c = Cuda(); c.init(0)
        rc, m = managed(c, 3 << 20)
        d = c.alloc(3 << 20)
        def get(ptr):
            v = ctypes.{ctype}(); rc = c.rc("cuPointerGetAttribute", ctypes.byref(v), {attr}, ctypes.c_uint64(ptr))
            return ("ptr" if v.value == ptr else v.value) if rc == 0 else -rc
        print(json.dumps([get(m + 4096), get(d + 4096)]))
    """), env=small_env))
    assert out == [managed_value, device_value]


def test_bad_managed_requests(run_py, small_env):
    out = run_py(scenario("""
        c = Cuda(); c.init(0)
        print(managed(c, 0)[0], managed(c, 1 << 20, flags=4)[0], managed(c, 1 << 20, flags=2)[0],
              c.rc("cuMemAllocManaged", None, ctypes.c_size_t(1 << 20), 1))
    """), env=small_env).split()
    assert out == ["1", "1", "0", "1"]   # size 0, bad flags: INVALID_VALUE; ATTACH_HOST is fine
