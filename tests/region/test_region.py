"""hami_runtime.node.region: the Python side of the limits and region files, on plain files."""
import os
import subprocess
import sys

import pytest

from hami_runtime.node import region
from hami_runtime.node.region import DeviceLimit, RegionError
from tests.conftest import ROOT
from tests.region.fakes import fake_process, patch_field

MiB = 1024 * 1024


@pytest.mark.parametrize("devices,policy,priority,idle", [
    ([DeviceLimit("GPU-0", 1024 * MiB, 0)], "default", 1, 200),
    ([DeviceLimit("GPU-aaaa-bbbb", 3000 * MiB, 30), DeviceLimit("GPU-cc", 0, 100)], "force", 0, 1),
    ([DeviceLimit(f"GPU-{i}", i * MiB, i) for i in range(region.MAX_DEVICES)], "disable", 1, 60000),
    ([DeviceLimit("G" * (region.UUID_LEN - 1), 2**64 - 1, 100)], "default", 0, 200),
    ([DeviceLimit("GPU-0", 20000 * MiB, 0, region.DEVICE_SPILL), DeviceLimit("GPU-1", MiB, 0)],
     "default", 1, 200),
])
def test_limits_round_trip(tmp_path, devices, policy, priority, idle):
    path = tmp_path / "limits"
    region.create_limits(path, devices, policy, priority, idle)
    assert os.stat(path).st_mode & 0o777 == 0o644
    assert os.path.getsize(path) == region.LIMITS_SIZE
    assert sorted(os.listdir(tmp_path)) == ["limits"]  # no temp file left
    with region.open_limits(path) as limits:
        assert limits.devices == devices
        assert (limits.core_policy, limits.priority, limits.priority_idle_ms) == (policy, priority, idle)


def test_region_starts_empty(tmp_path):
    made = region.create_region(tmp_path / "vgpu.region")
    assert os.stat(tmp_path / "vgpu.region").st_mode & 0o777 == 0o666
    assert region.identity(made) == region.identity(os.stat(tmp_path / "vgpu.region"))
    with region.open(tmp_path / "vgpu.region") as r:
        assert (r.state, r.processes(region.MAX_DEVICES)) == ("ready", [])
        assert [r.used_bytes(i) for i in range(region.MAX_DEVICES)] == [0] * region.MAX_DEVICES
        assert r.created_ns > 0
        created = r.created_ns
    # the whole image, its tables zero and allocated on the filesystem (not a sparse tail)
    st = os.stat(tmp_path / "vgpu.region")
    assert (tmp_path / "vgpu.region").read_bytes() == region.region_image(created)
    assert st.st_blocks * 512 >= region.REGION_SIZE


def test_create_replaces_existing_limits_atomically(tmp_path):
    path = tmp_path / "limits"
    region.create_limits(path, [DeviceLimit("GPU-0", 10 * MiB, 0)])
    with region.open_limits(path) as old:
        region.create_limits(path, [DeviceLimit("GPU-1", 20 * MiB, 50)])
        assert old.devices == [DeviceLimit("GPU-0", 10 * MiB, 0)]  # old mapping intact
    with region.open_limits(path) as new:
        assert new.devices == [DeviceLimit("GPU-1", 20 * MiB, 50)]


@pytest.mark.parametrize("devices,policy,priority,idle,message", [
    ([], "default", 1, 200, "devices: 0 devices"),
    ([DeviceLimit("x", 0, 0)] * (region.MAX_DEVICES + 1), "default", 1, 200,
     f"devices: {region.MAX_DEVICES + 1} devices"),
    ([DeviceLimit("", 0, 0)], "default", 1, 200, "devices[0].uuid: ''"),
    ([DeviceLimit("G" * region.UUID_LEN, 0, 0)], "default", 1, 200, "devices[0].uuid"),
    ([DeviceLimit("GPU-0", -1, 0)], "default", 1, 200, "devices[0].mem_limit_bytes: -1"),
    ([DeviceLimit("GPU-0", 0, 101)], "default", 1, 200, "devices[0].sm_limit_pct: 101"),
    ([DeviceLimit("GPU-0", 0, 0, -1)], "default", 1, 200, "devices[0].flags: -1"),
    ([DeviceLimit("GPU-0", 0, 0, 4)], "default", 1, 200, "devices[0].flags: 4"),
    ([DeviceLimit("GPU-0", 0, 0, True)], "default", 1, 200, "devices[0].flags: True"),
    ([DeviceLimit("GPU-0", 0, 0)], "sometimes", 1, 200, "core_policy: 'sometimes'"),
    ([DeviceLimit("GPU-0", 0, 0)], "default", 2, 200, "priority: 2"),
    ([DeviceLimit("GPU-0", 0, 0)], "default", 1, 0, "priority_idle_ms: 0"),
    ([DeviceLimit("GPU-0", 0, 0)], "default", 1, 60001, "priority_idle_ms: 60001"),
])
def test_bad_limits_refused_and_nothing_written(tmp_path, devices, policy, priority, idle, message):
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("]", r"\]")):
        region.create_limits(tmp_path / "limits", devices, policy, priority, idle)
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("opener,ctype,damage,message", [
    (region.open, "struct hami_region *", ("magic", 0x1234), "bad magic 0x1234"),
    (region.open, "struct hami_region *", ("version", region.VERSION + 1), f"version {region.VERSION + 1}"),
    (region.open_limits, "struct hami_limits *", ("magic", 0x1234), "magic 0x1234"),
    (region.open_limits, "struct hami_limits *", ("device_count", region.MAX_DEVICES + 1), "device_count"),
])
def test_foreign_file_refused_naming_the_path(tmp_path, opener, ctype, damage, message):
    region.create_limits(tmp_path / "limits", [DeviceLimit("GPU-0", MiB, 0)])
    region.create_region(tmp_path / "vgpu.region")
    path = tmp_path / ("limits" if opener is region.open_limits else "vgpu.region")
    patch_field(path, *damage, ctype=ctype)
    with pytest.raises(RegionError, match=message) as err:
        opener(path)
    assert str(path) in str(err.value)


@pytest.mark.parametrize("size", [0, 8, region.REGION_SIZE - 1, region.REGION_SIZE + 1])
def test_region_of_another_size_refused(tmp_path, size):
    path = tmp_path / "vgpu.region"
    region.create_region(path)
    os.truncate(path, size)
    with pytest.raises(RegionError, match=f"{size} bytes, expected {region.REGION_SIZE}"):
        region.open(path)


def test_missing_region_named(tmp_path):
    with pytest.raises(RegionError, match=str(tmp_path / "nope")):
        region.open(tmp_path / "nope")


@pytest.mark.parametrize("plant", ["symlink", "fifo", "directory", "replaced"])
def test_a_planted_file_is_refused_never_followed(tmp_path, plant):
    """What a container can put in its region dir: a link is never followed, a FIFO
    never blocks, and a file that is not the one made is named as replaced."""
    secret = tmp_path / "secret"
    secret.write_bytes(region.region_image())
    dir_fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        made = region.identity(region.create_region(tmp_path / "vgpu.region"))
        if plant == "replaced":  # a copy renamed over it, as from inside
            region.create_region(tmp_path / "copy")
            os.replace(tmp_path / "copy", tmp_path / "vgpu.region")
        else:
            os.unlink(tmp_path / "vgpu.region")
        if plant == "symlink":
            os.symlink(secret, tmp_path / "vgpu.region")
        elif plant == "fifo":
            os.mkfifo(tmp_path / "vgpu.region")
        elif plant == "directory":
            os.mkdir(tmp_path / "vgpu.region")
        with pytest.raises(RegionError, match={"symlink": "a symbolic link", "fifo": "not a regular file",
                                              "directory": "not a regular file",
                                              "replaced": "replaced"}[plant]):
            region.open("vgpu.region", dir_fd=dir_fd, expect=made, label="the region")
    finally:
        os.close(dir_fd)


def test_usage_sums_over_slots(tmp_path):
    path = tmp_path / "vgpu.region"
    region.create_region(path)
    fake_process(path, 0, pid=7, usage={0: (100 * MiB, 60 * MiB, 5_000, 3)})
    fake_process(path, 5, pid=9, usage={0: (50 * MiB, 40 * MiB, 1_000, 1), 1: (8 * MiB, 8 * MiB, 0, 0)},
                 host_pid=4242)
    fake_process(path, region.MAX_PROCS - 1, pid=11, usage={1: (2 * MiB, 0, 0, 0)})
    fake_process(path, 3, pid=13, usage={}, owner=region.OWNER_RECLAIMING)
    with region.open(path) as r:
        assert r.used_bytes(0) == 150 * MiB
        assert r.used_bytes(1) == 10 * MiB
        procs = r.processes(2)
        assert [(p.slot, p.pid, p.host_pid) for p in procs] == [
            (0, 7, 0), (5, 9, 4242), (region.MAX_PROCS - 1, 11, 0)]
        assert procs[0].devices[0] == region.DeviceUsage(100 * MiB, 60 * MiB, 5_000, 3)
        assert procs[1].mem_used == 58 * MiB
        with pytest.raises(IndexError, match=f"device: {region.MAX_DEVICES}"):
            r.used_bytes(region.MAX_DEVICES)


def test_live_updates_need_a_writable_map(tmp_path):
    limits = tmp_path / "limits"
    region.create_limits(limits, [DeviceLimit("GPU-0", MiB, 0)])
    with region.open_limits(limits) as lim:
        with pytest.raises(RegionError, match="read-only"):
            lim.update_live(mem_limits={0: 2 * MiB})
    made = os.stat(limits)
    with region.open_limits(limits, writable=True) as lim:
        lim.update_live(mem_limits={0: 2 * MiB}, sm_limits={0: 40}, core_policy="force")
        with pytest.raises(IndexError, match="device: 1"):
            lim.update_live(mem_limits={1: MiB})
        with pytest.raises(ValueError, match="sm_limit_pct: 101"):
            lim.update_live(sm_limits={0: 101})
    with region.open_limits(limits) as lim:
        assert lim.devices == [DeviceLimit("GPU-0", 2 * MiB, 40)]
        assert (lim.core_policy, lim.priority) == ("force", 1)
    # in place: a container's mount holds this very file
    assert region.identity(os.stat(limits)) == region.identity(made)


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
