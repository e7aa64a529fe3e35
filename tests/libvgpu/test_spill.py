"""Oversubscription (HAMI_DEVICE_SPILL, bare use: CUDA_OVERSUBSCRIBE=true): allocations
within the limit that the card cannot hold are served from managed memory, the views
show the limit, the limit stays exact. On a simulated 4096 MiB card."""
import json
import os
import subprocess
import sys
import textwrap

import pytest

from tests.conftest import LIBVGPU, ROOT, SIM_LIB

from .test_shared_limit import wait_line

CARD_MIB = 4096
CONTEXT_MIB = 300
ABOVE, BELOW = 6144, 2048            # limits above and below the card

PRELUDE = textwrap.dedent("""
    import ctypes, json, os, sys, time
    from simcuda import Cuda, wait_for_stdin_close
    c = Cuda(); c.init(0)
    def alloc(kind, mib):
        ptr, nbytes = ctypes.c_uint64(), ctypes.c_size_t(mib << 20)
        if kind == "mem":
            rc = c.rc("cuMemAlloc_v2", ctypes.byref(ptr), nbytes)
        elif kind == "pitch":
            pitch = ctypes.c_size_t()
            rc = c.rc("cuMemAllocPitch_v2", ctypes.byref(ptr), ctypes.byref(pitch),
                      ctypes.c_size_t(1 << 20), ctypes.c_size_t(mib), 4)
        else:
            rc = c.rc("cuMemAllocAsync", ctypes.byref(ptr), nbytes, None)
        return rc, ptr.value
    def managed(ptr):
        v = ctypes.c_ubyte()
        c.call("cuPointerGetAttribute", ctypes.byref(v), 8, ctypes.c_uint64(ptr))
        return v.value
    def views():
        import pynvml
        pynvml.nvmlInit()
        m = pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByIndex(0))
        total = ctypes.c_size_t()
        c.call("cuDeviceTotalMem_v2", ctypes.byref(total), 0)
        free, getinfo_total = c.mem_info()
        return {"getinfo_total": getinfo_total >> 20, "getinfo_free": free >> 20,
                "totalmem": total.value >> 20, "nvml_total": m.total >> 20,
                "nvml_used": m.used >> 20, "nvml_free": m.free >> 20}
""")


@pytest.fixture
def spill_env(built, tmp_path):
    config = tmp_path / "sim.conf"
    config.write_text(f"devices = 1\nmemory_mib = {CARD_MIB}\ncontext_mib = {CONTEXT_MIB}\n")
    def env(flag, limit_mib, shared=False):
        e = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LD_LIBRARY_PATH": str(SIM_LIB),
             "LD_PRELOAD": str(LIBVGPU), "HAMI_SIM_STATE": str(tmp_path / "sim.state"),
             "HAMI_SIM_CONFIG": str(config), "PYTHONPATH": str(ROOT / "tests" / "simgpu"),
             "CUDA_DEVICE_MEMORY_LIMIT": f"{limit_mib}m"}
        if flag is not None:
            e["CUDA_OVERSUBSCRIBE"] = flag
        if shared:
            e["CUDA_DEVICE_MEMORY_SHARED_CACHE"] = str(tmp_path / "vgpu.region")
        return e
    return env


def run(env, body, check=True):
    proc = subprocess.run([sys.executable, "-c", PRELUDE + textwrap.dedent(body)], env=env,
                          capture_output=True, text=True, timeout=60)
    if check and proc.returncode != 0:
        raise AssertionError(f"scenario failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return proc


def result(env, body):
    return json.loads(run(env, body).stdout.splitlines()[-1])


@pytest.mark.parametrize("flag, limit, card", [
    ("true", ABOVE, ABOVE),           # oversubscribed: the whole limit, past the card
    ("false", ABOVE, CARD_MIB),       # not: as before, capped at the physical card
    ("true", BELOW, BELOW),
    ("false", BELOW, BELOW),
])
def test_views_show_the_limit(spill_env, flag, limit, card):
    v = result(spill_env(flag, limit), "print(json.dumps(views()))")
    assert v["getinfo_total"] == v["totalmem"] == v["nvml_total"] == card
    assert v["nvml_used"] == CONTEXT_MIB
    assert v["getinfo_free"] == v["nvml_free"] == card - CONTEXT_MIB


@pytest.mark.parametrize("kind", ["mem", "pitch", "async"])
@pytest.mark.parametrize("flag, mib, rc, spilled", [
    ("true", 3000, 0, 0),             # fits the card: device memory, no spill
    ("true", 5000, 0, 1),             # past the card, within the limit: managed memory
    ("false", 5000, 2, None),         # the same without the flag: OUT_OF_MEMORY
    (None, 5000, 2, None),            # unset is off
    ("true", ABOVE, 2, None),         # past the limit: always refused
    ("false", ABOVE, 2, None),
])
def test_allocations_past_the_card(spill_env, kind, flag, mib, rc, spilled):
    out = result(spill_env(flag, ABOVE), f"""
        rc, ptr = alloc({kind!r}, {mib})
        print(json.dumps([rc, managed(ptr) if rc == 0 else None]))
    """)
    assert out == [rc, spilled]


def test_freeing_a_spilled_allocation_gives_its_charge_back(spill_env):
    out = result(spill_env("true", ABOVE), """
        before = views()
        rc, ptr = alloc("mem", 5000)
        spilled = managed(ptr) if rc == 0 else None
        time.sleep(0.25)                  # the next view reconciles with NVML's count
        during = views()
        c.free(ptr)
        after = views()
        again = alloc("mem", 5000)[0]
        print(json.dumps([rc, spilled, before, during, after, again]))
    """)
    rc, spilled, before, during, after, again = out
    assert rc == 0 and spilled == 1 and again == 0
    # exactly its charge, counted once (NVML's per-process count shows device memory only)
    assert during["getinfo_free"] == during["nvml_free"] == before["getinfo_free"] - 5000
    assert during["nvml_used"] == CONTEXT_MIB + 5000
    assert after == before


def test_two_processes_sharing_the_region_stay_within_the_limit(spill_env):
    env = spill_env("true", ABOVE, shared=True)
    holder = subprocess.Popen(
        [sys.executable, "-c", PRELUDE + textwrap.dedent("""
            rc, ptr = alloc("mem", 4000)
            print(f"held rc={rc} managed={managed(ptr)}", flush=True)
            wait_for_stdin_close()
        """)], env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True)
    try:
        assert wait_line(holder, "held") == "held rc=0 managed=1\n"
        room = ABOVE - 2 * CONTEXT_MIB - 4000
        out = result(env, f"""
            print(json.dumps([views()["getinfo_free"], alloc("mem", {room})[0],
                              alloc("mem", 2)[0], views()["getinfo_free"]]))
        """)
        assert out == [room, 0, 2, 0]
    finally:
        holder.stdin.close()
        holder.wait(timeout=20)
        holder.stdout.close()
        holder.stderr.close()


def test_a_device_without_a_limit_never_spills(spill_env):
    out = result(spill_env("true", 0), 'print(json.dumps([alloc("mem", 5000)[0], views()["getinfo_total"]]))')
    assert out == [2, CARD_MIB]


def test_a_bad_oversubscribe_value_is_named_and_ignored(spill_env):
    proc = run(spill_env("yes", ABOVE), 'print(json.dumps([alloc("mem", 5000)[0], views()]))')
    rc, v = json.loads(proc.stdout.splitlines()[-1])
    assert rc == 2 and v["getinfo_total"] == CARD_MIB
    assert "CUDA_OVERSUBSCRIBE=yes" in proc.stderr
