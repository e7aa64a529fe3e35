"""libvgpu in a runtime-made container's layout (the limits read-only at the runtime's
path, the region dir read-write), without the rest of a container: limits come from
the file alone, anything unusable fails closed, and a region written over from
inside never lets one process past its limit or share."""
import os
import shutil
import subprocess
import threading
import time

import pytest

from hami_runtime.node import region
from tests.conftest import SIM, runtime_made

from .conftest import MIB, PROBE
from .test_resize import Running

LIMIT = 1024 * MIB
NOT_PERMITTED = 800


def limits_for(probe, **kw):
    return [region.DeviceLimit(u, LIMIT, kw.get("sm", 0)) for u in probe.uuids()]


def test_the_env_decides_nothing(probe):
    probe.runtime_files(limits_for(probe)).close()
    info = probe.run("link", "info", CUDA_DEVICE_MEMORY_LIMIT="8g", CUDA_DEVICE_MEMORY_LIMIT_0="8g",
                     CUDA_DEVICE_MEMORY_SHARED_CACHE=str(probe.tmp / "mine")).fields
    assert info["total"] == LIMIT
    assert not (probe.tmp / "mine").exists()  # no region of its own either


def writable_limits(probe):
    """The limits mounted read-write: a file the container could have made."""
    probe.prefix = runtime_made(probe.limits, probe.tmp, limits_mount="rw")


def damage(field, value):
    def apply(probe):
        with region.open_limits(probe.limits, writable=True) as limits:
            setattr(limits._struct(), field, value)
    return apply


def remove_region(probe):
    probe.region.unlink()


def link_region(probe):
    probe.region.unlink()
    probe.region.symlink_to(probe.limits)


def zero_region(probe):
    probe.region.write_bytes(bytes(region.REGION_SIZE))


UNUSABLE = {
    "limits writable": (writable_limits, "writable, not the runtime's read-only mount"),
    "limits magic": (damage("magic", 7), "magic 0x7"),
    "limits policy": (damage("core_policy", 9), "core_policy 9"),
    "limits devices": (damage("device_count", 0), "device_count 0"),
    "region removed": (remove_region, "No such file or directory"),
    "region a link": (link_region, "Too many levels of symbolic links"),
    "region zeroed": (zero_region, "magic 0"),
}


@pytest.mark.parametrize("spoil,why", UNUSABLE.values(), ids=UNUSABLE.keys())
def test_unusable_files_fail_closed(probe, spoil, why):
    probe.runtime_files(limits_for(probe)).close()
    spoil(probe)
    result = probe.run("link", "info", check=False, CUDA_DEVICE_MEMORY_LIMIT="1g")
    errors = [line for line in result.stderr.splitlines() if line.startswith("[hami]")]
    assert len(errors) == 1 and why in errors[0] and "refused" in errors[0], result.stderr
    assert f"rc={NOT_PERMITTED}" in result.stdout, result.stdout
    # NVML too: nvidia-smi finds no way in
    smi = subprocess.run(probe.prefix + [str(SIM / "bin" / "nvidia-smi")], env=probe.env(),
                         capture_output=True, text=True, timeout=30)
    assert smi.returncode != 0 and "16384" not in smi.stdout


def zero_usage(path, stop):
    """Writes the region's usage and SM tokens over and over, as a tenant with a
    shell in the container could."""
    with region.open(path, writable=True) as r:
        c = r._struct()
        while not stop.is_set():
            for i in range(4):
                c.procs[i].mem_used[0] = 0
            c.sm[0].tokens_ns = 10**15
            time.sleep(0.0005)


def test_a_process_is_held_whatever_its_region_says(probe):
    probe.runtime_files([region.DeviceLimit(probe.uuids()[0], LIMIT, 20)], "force").close()
    proc = Running(probe)
    stop = threading.Event()
    scribbler = threading.Thread(target=zero_usage, args=(probe.region, stop), daemon=True)
    try:
        free_run = proc.ask("spin 4 10000")["seconds"]  # the first burst: no debt yet
        scribbler.start()
        assert proc.ask("alloc 600")["rc"] == 0
        assert proc.ask("alloc 600")["rc"] == 2     # its own count: past 1024 MiB with the context
        held = proc.ask("spin 20 10000")["seconds"]  # 200 ms of work at 20 %
        assert held > 0.5, (free_run, held)
    finally:
        stop.set()
        scribbler.join(timeout=10)
        proc.close()


COMPAT_DIR = "/usr/local/vgpu"   # where the runtime also mounts libvgpu, as HAMi-core users expect it


def make_compat_dir(probe):
    """The shell that makes COMPAT_DIR, in the test's private mount namespace,
    without writing to the host's disk: where it is missing, a tmpfs over
    /usr/local holds it, unless what the test runs (the probe, its tmp dir, the
    simulated driver) is under /usr/local, which the tmpfs would hide; then it
    is made on the disk and the test session removes it (tests/conftest.py)."""
    used = [PROBE, probe.tmp, SIM]
    if any(str(p).startswith(f"{COMPAT_PARENT}/") for p in used):
        return f"mkdir -p {COMPAT_DIR}"
    return (f"{{ test -d {COMPAT_DIR} || {{ mount -t tmpfs -o mode=0755 hami-test {COMPAT_PARENT} && "
            f"mkdir {COMPAT_DIR}; }}; }}")


COMPAT_PARENT = os.path.dirname(COMPAT_DIR)


@pytest.mark.parametrize("preload", [f"{COMPAT_DIR}/libvgpu.so", "{tmp}/a-link.so"], ids=["by name", "by a link"])
def test_the_runtimes_library_without_its_limits_fails_closed(probe, preload):
    """Loaded from where the runtime mounts it, libvgpu is in a runtime-made container,
    whatever hides the limits file: it refuses, never runs bare on the env's limits."""
    from tests.conftest import LIBVGPU
    preload = preload.format(tmp=probe.tmp)
    shutil.copy2(LIBVGPU, probe.tmp / "libvgpu.so")
    script = (f"{make_compat_dir(probe)} && mount -t tmpfs hami-test {COMPAT_DIR} && "
              f"cp {probe.tmp}/libvgpu.so {COMPAT_DIR}/libvgpu.so && "
              f"ln -sf {COMPAT_DIR}/libvgpu.so {probe.tmp}/a-link.so && "
              f'LD_PRELOAD={preload} exec "$@"')
    probe.prefix = ["unshare", "--mount", "--propagation", "private", "--", "sh", "-c", script, "sh"]
    result = probe.run("link", "info", preload=False, check=False, CUDA_DEVICE_MEMORY_LIMIT="8g")
    assert f"rc={NOT_PERMITTED}" in result.stdout, result.stdout + result.stderr
    assert "refused" in result.stderr
