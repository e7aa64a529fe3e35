"""hami_runtime.node.region: the Python side of the shared region, on plain files."""
import os
import subprocess
import sys

import pytest

from hami_runtime.node import region
from hami_runtime.node.region import DeviceLimit, RegionError
from tests.conftest import ROOT
from tests.region.fakes import fake_process, patch_field

MiB = 1024 * 1024


@pytest.mark.parametrize("devices,policy,priority", [
    ([], "default", 1),
    ([DeviceLimit("GPU-0", 1024 * MiB, 0)], "default", 1),
    ([DeviceLimit("GPU-aaaa-bbbb", 3000 * MiB, 30), DeviceLimit("GPU-cc", 0, 100)], "force", 0),
    ([DeviceLimit(f"GPU-{i}", i * MiB, i) for i in range(region.MAX_DEVICES)], "disable", 1),
    ([DeviceLimit("G" * (region.UUID_LEN - 1), 2**64 - 1, 100)], "default", 0),
    ([DeviceLimit("GPU-0", 20000 * MiB, 0, region.DEVICE_SPILL), DeviceLimit("GPU-1", MiB, 0)],
     "default", 1),
])
def test_round_trip(tmp_path, devices, policy, priority):
    path = region.create(tmp_path / "vgpu.region", devices, policy, priority)
    assert os.stat(path).st_mode & 0o777 == 0o666
    assert os.path.getsize(path) == region.REGION_SIZE
    assert sorted(os.listdir(tmp_path)) == ["vgpu.region"]  # no temp file left
    with region.open(path) as r:
        assert r.devices == devices
        assert (r.core_policy, r.priority, r.state) == (policy, priority, "ready")
        assert r.processes() == []
        assert [r.used_bytes(i) for i in range(len(devices))] == [0] * len(devices)
        assert r.created_ns > 0


def test_create_replaces_existing_region_atomically(tmp_path):
    path = tmp_path / "vgpu.region"
    region.create(path, [DeviceLimit("GPU-0", 10 * MiB, 0)])
    with region.open(path) as old:
        region.create(path, [DeviceLimit("GPU-1", 20 * MiB, 50)])
        assert old.devices == [DeviceLimit("GPU-0", 10 * MiB, 0)]  # old mapping intact
    with region.open(path) as new:
        assert new.devices == [DeviceLimit("GPU-1", 20 * MiB, 50)]


@pytest.mark.parametrize("devices,policy,priority,message", [
    ([DeviceLimit("x", 0, 0)] * (region.MAX_DEVICES + 1), "default", 1, f"devices: {region.MAX_DEVICES + 1} devices"),
    ([DeviceLimit("G" * region.UUID_LEN, 0, 0)], "default", 1, "devices[0].uuid"),
    ([DeviceLimit("GPU-0", -1, 0)], "default", 1, "devices[0].mem_limit_bytes: -1"),
    ([DeviceLimit("GPU-0", 0, 101)], "default", 1, "devices[0].sm_limit_pct: 101"),
    ([DeviceLimit("GPU-0", 0, 0, -1)], "default", 1, "devices[0].flags: -1"),
    ([DeviceLimit("GPU-0", 0, 0, True)], "default", 1, "devices[0].flags: True"),
    ([], "sometimes", 1, "core_policy: 'sometimes'"),
    ([], "default", 2, "priority: 2"),
])
def test_bad_limits_refused_and_nothing_written(tmp_path, devices, policy, priority, message):
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("]", r"\]")):
        region.create(tmp_path / "vgpu.region", devices, policy, priority)
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("damage,message", [
    (("magic", 0x1234), "bad magic 0x1234"),
    (("version", region.VERSION + 1), f"version {region.VERSION + 1}"),
    (("device_count", region.MAX_DEVICES + 1), "device_count"),
])
def test_foreign_region_refused_naming_the_path(tmp_path, damage, message):
    path = region.create(tmp_path / "vgpu.region", [DeviceLimit("GPU-0", MiB, 0)])
    patch_field(path, *damage)
    with pytest.raises(RegionError, match=message) as err:
        region.open(path)
    assert str(path) in str(err.value)


@pytest.mark.parametrize("size", [0, 8, region.REGION_SIZE - 1])
def test_truncated_region_refused(tmp_path, size):
    path = region.create(tmp_path / "vgpu.region", [DeviceLimit("GPU-0", MiB, 0)])
    os.truncate(path, size)
    with pytest.raises(RegionError, match=f"truncated \\({size} bytes, expected {region.REGION_SIZE}\\)"):
        region.open(path)


def test_missing_region_named(tmp_path):
    with pytest.raises(RegionError, match=str(tmp_path / "nope")):
        region.open(tmp_path / "nope")


def test_usage_sums_over_slots(tmp_path):
    path = region.create(tmp_path / "vgpu.region",
                         [DeviceLimit("GPU-0", 4096 * MiB, 0), DeviceLimit("GPU-1", 4096 * MiB, 0)])
    fake_process(path, 0, pid=7, usage={0: (100 * MiB, 60 * MiB, 5_000, 3)})
    fake_process(path, 5, pid=9, usage={0: (50 * MiB, 40 * MiB, 1_000, 1), 1: (8 * MiB, 8 * MiB, 0, 0)},
                 host_pid=4242)
    fake_process(path, region.MAX_PROCS - 1, pid=11, usage={1: (2 * MiB, 0, 0, 0)})
    fake_process(path, 3, pid=13, usage={}, owner=region.OWNER_RECLAIMING)
    with region.open(path) as r:
        assert r.used_bytes(0) == 150 * MiB
        assert r.used_bytes(1) == 10 * MiB
        procs = r.processes()
        assert [(p.slot, p.pid, p.host_pid) for p in procs] == [
            (0, 7, 0), (5, 9, 4242), (region.MAX_PROCS - 1, 11, 0)]
        assert procs[0].devices[0] == region.DeviceUsage(100 * MiB, 60 * MiB, 5_000, 3)
        assert procs[1].mem_used == 58 * MiB
        with pytest.raises(IndexError, match="device: 2"):
            r.used_bytes(2)


def test_updates_need_a_writable_map(tmp_path):
    path = region.create(tmp_path / "vgpu.region", [DeviceLimit("GPU-0", MiB, 0)])
    fake_process(path, 2, pid=21, usage={0: (MiB, 0, 0, 0)})
    with region.open(path) as r:
        with pytest.raises(RegionError, match="read-only"):
            r.set_host_pid(21, 9999)
    with region.open(path, writable=True) as r:
        assert r.set_host_pid(21, 9999) == 1
        assert r.set_host_pid(22, 1) == 0
        r.set_limits([DeviceLimit("GPU-0", 2 * MiB, 40)], core_policy="force")
    with region.open(path) as r:
        assert r.processes()[0].host_pid == 9999
        assert r.devices == [DeviceLimit("GPU-0", 2 * MiB, 40)]
        assert (r.core_policy, r.priority) == ("force", 1)


def test_cdef_keeps_only_integer_defines():
    text = "#ifndef X\n#define X\n#include <stdint.h>\n#define A 0x10\n#define B 7 /* b */\nstruct s { int a; };\n#endif\n"
    assert region.cdef_source(text) == "#define A 0x10\n#define B 7 /* b */\nstruct s { int a; };\n"


def test_header_override_must_exist(tmp_path):
    env = dict(os.environ, HAMI_REGION_HEADER=str(tmp_path / "none.h"))
    result = subprocess.run([sys.executable, "-c", "import hami_runtime.node.region"], cwd=ROOT, env=env,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode != 0
    assert f"HAMI_REGION_HEADER: no such file: {tmp_path / 'none.h'}" in result.stderr


@pytest.mark.parametrize("host_pid,owner_start,expected", [
    (0, None, None),                 # host pid not known: cannot tell
    (os.getpid(), "own", True),      # that process, same start time
    (os.getpid(), "other", False),   # the pid was reused by another process
    (2**22 + 1, "own", False),       # no such process
])
def test_process_alive_as_the_host_sees_it(host_pid, owner_start, expected):
    start = region.process_start_ticks(os.getpid())
    low = {None: 0, "own": start, "other": start + 1}[owner_start] & 0xFFFFFFFF
    proc = region.ProcessUsage(slot=0, pid=1, host_pid=host_pid, started_ns=0, owner=(1 << 32) | low)
    assert proc.alive() is expected
