"""Discovery from literal inputs: /proc/devices, ldconfig -p output, a driver
root whose links try to leave it."""

import re

import pytest

from hami_runtime.errors import HamiError
from hami_runtime.node import discovery, mig_caps
from hami_runtime.node.gpu import GpuInfo

PROC_DEVICES = """Character devices:
  1 mem
195 nvidia-frontend
195 nvidia
236 nvidia-caps
508 nvidia-uvm

Block devices:
  7 loop
259 blkext
"""


def test_proc_devices():
    majors = discovery.parse_proc_devices(PROC_DEVICES)
    assert majors["nvidia-frontend"] == 195 and majors["nvidia-uvm"] == 508
    assert "loop" not in majors


CACHE = """5 libs found in cache `/etc/ld.so.cache'
\tlibnvidia-ml.so.1 (libc6,x86-64) => /usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1
\tlibcuda.so.1 (libc6,x86-64) => /usr/lib/x86_64-linux-gnu/libcuda.so.1
\tlibcuda.so.1 (libc6) => /usr/lib/i386-linux-gnu/libcuda.so.1
\tlibcudart.so.12 (libc6,x86-64) => /usr/local/cuda/lib64/libcudart.so.12
\tlibescape.so.1 (libc6,x86-64) => /usr/lib/libnvidia-escape.so.1
\tlibc.so.6 (libc6,x86-64, OS ABI: Linux 3.2.0) => /lib/x86_64-linux-gnu/libc.so.6
"""


def test_driver_libs_only_64bit_driver_files_inside_the_root(tmp_path):
    lib = tmp_path / "usr/lib/x86_64-linux-gnu"
    lib.mkdir(parents=True)
    for name in ("libnvidia-ml.so.1", "libcuda.so.1"):
        (lib / name).write_bytes(b"\x7fELF")
    outside = tmp_path.parent / f"{tmp_path.name}-outside.so"
    outside.write_bytes(b"x")
    (tmp_path / "usr/lib/libnvidia-escape.so.1").symlink_to(outside)
    entries = discovery.parse_ld_cache(CACHE)
    assert len(entries) == 6
    files = discovery.select_driver_libs(entries, str(tmp_path))
    assert sorted(f.container_path for f in files) == [
        "/usr/lib/x86_64-linux-gnu/libcuda.so.1", "/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1"]
    assert all(f.host_path.startswith(str(tmp_path) + "/") for f in files)
    outside.unlink()


@pytest.mark.parametrize("problem,field", [("no-cache", "config driver_root"),
                                           ("unreadable-proc", "config proc_devices")])
def test_discovery_refusals(tmp_path, problem, field):
    from hami_runtime.errors import HamiError
    with pytest.raises(HamiError) as caught:
        if problem == "no-cache":
            discovery.driver_files(str(tmp_path))
        else:
            discovery.read_majors(str(tmp_path / "devices"))
    assert caught.value.field == field


MIG_MINORS = """config 1
monitor 2
gpu0/gi0/access 3
gpu0/gi0/ci0/access 4
gpu1/gi2/access 156
gpu1/gi2/ci0/access 157
gpu1/gi2/ci1/access 158
"""


@pytest.mark.parametrize("minor,gi,ci,expected", [
    (0, 0, 0, [3, 4]),
    (1, 2, 0, [156, 157]),
    (1, 2, 1, [156, 158]),
    (1, 3, 0, "lists no gpu1/gi3/access (MIG instance 1:0)"),
    (0, 0, 1, "lists no gpu0/gi0/ci1/access"),
])
def test_mig_access_minors(minor, gi, ci, expected):
    instance = GpuInfo(1, "MIG-x", "m", 1, minor, parent="GPU-x", mig_index=0, gpu_instance=gi,
                       compute_instance=ci)
    minors = mig_caps.parse(MIG_MINORS)
    if isinstance(expected, list):
        assert mig_caps.access_minors(minors, instance, "/proc/x") == expected
    else:
        with pytest.raises(HamiError, match=re.escape(expected)) as caught:
            mig_caps.access_minors(minors, instance, "/proc/x")
        assert caught.value.field == "config mig_minors"
