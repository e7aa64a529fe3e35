"""One limit shared by the container's processes through the region: atomic across
processes, given back when a process exits or is killed, never overcommitted."""
import signal
import time

import pytest

from .conftest import MIB, release

HOLD = 300 * MIB


def wait_line(proc, prefix, timeout=20):
    """The first stdout line starting with `prefix`, or fail (never hang)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if line.startswith(prefix):
            return line
        if not line and proc.poll() is not None:
            break
    proc.kill()
    raise AssertionError(f"no {prefix!r} line: {proc.stderr.read()}")


def test_two_processes_share_one_limit_and_a_third_is_refused(probe):
    ctx = probe.context_bytes()
    limit = 3 * ctx + 2 * HOLD + HOLD // 2  # room for two holders and a third context
    env = {"CUDA_DEVICE_MEMORY_LIMIT": limit}
    first = probe.start("link", "hold", "mem", HOLD, 60, **env)
    second = probe.start("link", "hold", "mem", HOLD, 60, **env)
    try:
        assert wait_line(first, "held") == "held rc=0\n"
        assert wait_line(second, "held") == "held rc=0\n"
        third = probe.run("link", "alloc", "mem", HOLD, shared=True, **env)
        assert third.fields["rc"] == 2
    finally:
        release(first)
        release(second)
    # both exited: their memory can be taken again
    again = probe.run("link", "alloc", "mem", 2 * HOLD, shared=True, **env)
    assert again.fields["rc"] == 0


def test_memory_of_a_process_killed_while_allocating_comes_back(probe):
    ctx = probe.context_bytes()
    limit = 2 * ctx + HOLD + HOLD // 2
    env = {"CUDA_DEVICE_MEMORY_LIMIT": limit}
    churner = probe.start("link", "churn", "mem", HOLD, 30, **env)
    try:
        assert wait_line(churner, "ready") == "ready rc=0\n"
        refused = probe.run("link", "alloc", "mem", HOLD, shared=True, **env)
        assert refused.fields["rc"] == 2
        churner.send_signal(signal.SIGKILL)
        churner.wait(timeout=10)
    finally:
        churner.kill()
    start = time.monotonic()
    taken = probe.run("link", "alloc", "mem", HOLD, shared=True, timeout=20, **env)
    assert taken.fields["rc"] == 0
    assert time.monotonic() - start < 10


def test_bare_processes_share_usage_each_under_its_own_env_limit(probe):
    """Bare use: the region holds usage only; no process's env decides another's
    limit (the first process's env decided everyone's in HAMi-core)."""
    holder = probe.start("link", "hold", "mem", HOLD, 60, CUDA_DEVICE_MEMORY_LIMIT="1g")
    try:
        assert wait_line(holder, "held") == "held rc=0\n"
        info = probe.run("link", "info", shared=True, CUDA_DEVICE_MEMORY_LIMIT="4g").fields
        assert info["total"] == 4096 * MIB
        assert info["free"] <= 4096 * MIB - HOLD  # the holder's usage counts against it
    finally:
        release(holder)


def test_random_load_from_many_threads_and_processes_never_exceeds_the_limit(probe):
    limit = 2048 * MIB
    env = {"CUDA_DEVICE_MEMORY_LIMIT": limit}
    seconds = 3
    # The independent reader: the simulated driver's own count, through NVML, without libvgpu.
    watcher = probe.start("none", "watch", seconds + 3, preload=False, shared=False)
    start_at = time.time() + 1.0  # every context is made before the load starts
    workers = [probe.start("link", "stress", 16, seconds, 96, start_at, **env) for _ in range(4)]
    outputs = []
    try:
        for worker in workers:
            out, err = worker.communicate(timeout=30)
            assert worker.returncode == 0, (out, err)
            outputs.append(out)
        out, _ = watcher.communicate(timeout=30)
    finally:
        for p in workers + [watcher]:
            p.kill()
    fields = [dict(kv.split("=") for kv in o.split()) for o in outputs]
    assert sum(int(f["ok"]) for f in fields) > 100
    assert sum(int(f["refused"]) for f in fields) > 0  # the limit was reached
    max_used = int(out.split("=")[1])
    assert 0 < max_used <= limit


def region_bytes(magic, version, state):
    import struct

    from hami_runtime.node import region

    size = region.ffi.sizeof("struct hami_region")
    return struct.pack("<QII", magic, version, state) + b"\0" * (size - 16)


REGION_MAGIC = 0x314E4752494D4148


@pytest.mark.parametrize("content, why", [
    (b"garbage!", "bytes"),
    (b"\x01" * 8 + b"\0" * 600000, "bytes"),
    (region_bytes(0x1234, 1, 2), "magic"),
    (region_bytes(REGION_MAGIC, 99, 2), "version"),
], ids=["short", "long", "magic", "version"])
def test_unusable_region_file_means_one_error_and_no_limit(probe, content, why):
    probe.region.write_bytes(content)
    result = probe.run("link", "info", shared=True, CUDA_DEVICE_MEMORY_LIMIT="1g")
    errors = [l for l in result.stderr.splitlines() if l.startswith("[hami]")]
    assert len(errors) == 1 and "region" in errors[0] and why in errors[0], result.stderr
    assert result.fields["total"] == 16384 * MIB
    assert probe.region.read_bytes() == content  # a foreign file is left as it was


def test_region_made_by_a_bare_process_is_read_by_the_runtime(probe):
    from hami_runtime.node import region

    holder = probe.start("link", "hold", "mem", HOLD, 60, CUDA_DEVICE_MEMORY_LIMIT="1g")
    try:
        assert wait_line(holder, "held") == "held rc=0\n"
        with region.open(probe.region) as r:
            assert r.state == "ready"
            mine = [p for p in r.processes(1) if p.pid == holder.pid]
            assert len(mine) == 1 and mine[0].devices[0].mem_used >= HOLD
            assert mine[0].devices[0].ctx_used > 0
    finally:
        release(holder)


def test_limits_from_the_runtime_map_devices_by_uuid(probe):
    from hami_runtime.node import region

    uuids = probe.uuids()
    # listed in reverse: index 0 is CUDA device 1
    probe.runtime_files([region.DeviceLimit(uuids[1], 512 * MIB, 0),
                         region.DeviceLimit(uuids[0], 1024 * MIB, 0)]).close()
    info = probe.run("link", "info", shared=True, CUDA_DEVICE_MEMORY_LIMIT="8g").fields
    assert info["total"] == 1024 * MIB  # and the env's limit counts for nothing


def test_process_without_cuda_leaves_no_trace(probe):
    import subprocess

    subprocess.run(["/bin/true"], env=probe.env(shared=True, CUDA_DEVICE_MEMORY_LIMIT="1g"),
                   check=True, timeout=10)
    assert not probe.region.exists()


def test_a_stopped_lock_holder_blocks_nobody(probe):
    import fcntl

    from hami_runtime.node import region

    probe.runtime_files([region.DeviceLimit(u, 1024 * MIB, 0) for u in probe.uuids()]).close()
    with open(probe.region, "rb") as held:
        fcntl.flock(held, fcntl.LOCK_EX)  # as a process stopped inside context creation
        start = time.monotonic()
        info = probe.run("link", "info", shared=True, LIBCUDA_LOG_LEVEL=2, timeout=20)
        elapsed = time.monotonic() - start
    assert info.fields["total"] == 1024 * MIB
    assert elapsed < 10
    assert "lock not had" in info.stderr
