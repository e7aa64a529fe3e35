"""Live resize through the real libvgpu.so: a running process of a runtime-made
container (its limits file read-only at the runtime's path) follows limits
changed in that file (as hamictl update changes them, Limits.update_live) at its
next allocation, view or launch, with no restart and no signal."""
import subprocess

import pytest

from hami_runtime.node import region
from tests.conftest import BUILD, ROOT

from .conftest import MIB
from .test_views_nvml import pynvml_view

RESIZE_PROBE = BUILD / "tests" / "resize_probe"


class Running:
    """resize_probe under libvgpu: one command, one answer."""

    def __init__(self, probe):
        if not RESIZE_PROBE.exists():
            subprocess.run(["make", "-s", "-C", str(ROOT), "libvgpu-tests"], check=True, timeout=300)
        self.proc = subprocess.Popen(probe.prefix + [str(RESIZE_PROBE)], env=probe.env(),
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.DEVNULL, text=True)
        assert self.proc.stdout.readline().strip() == "ready"

    def ask(self, command):
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()
        words = self.proc.stdout.readline().split()
        assert words and words[0] != "error", (command, words)
        return {k: float(v) if "." in v else int(v) for k, v in (w.split("=") for w in words[1:])}

    def close(self):
        self.proc.stdin.close()
        try:
            self.proc.wait(timeout=20)
        finally:
            self.proc.kill()
            self.proc.wait(timeout=20)


@pytest.fixture
def running(probe):
    """Limits made as the runtime makes them (1024 MiB, no SM share, `force`), the
    process, and the limits (writable) with the region (to read usage)."""
    limits = probe.runtime_files([region.DeviceLimit(probe.uuids()[0], 1024 * MIB, 0)], "force", 1)
    proc = Running(probe)
    with limits, region.open(probe.region) as reg:
        yield proc, limits, reg
    proc.close()


def test_memory_grow_then_forced_shrink(running, probe):
    proc, limits, reg = running
    assert proc.ask("info")["total"] == 1024 * MIB
    assert proc.ask("alloc 600")["rc"] == 0
    assert proc.ask("alloc 600")["rc"] == 2          # CUDA_ERROR_OUT_OF_MEMORY: past 1024 MiB
    limits.update_live(mem_limits={0: 2048 * MIB})  # grown: the next allocation fits
    assert proc.ask("info")["total"] == 2048 * MIB
    assert proc.ask("alloc 600")["rc"] == 0
    used = reg.used_bytes(0)
    assert used >= 1200 * MIB
    limits.update_live(mem_limits={0: 512 * MIB})   # forced below use: nothing is freed
    info = proc.ask("info")
    assert (info["total"], info["free"]) == (512 * MIB, 0)   # free clamps, never underflows
    (total, used_view, free, *_), _ = pynvml_view(probe)    # NVML, from another process
    assert (total, used_view, free) == (512 * MIB, 512 * MIB, 0)
    assert reg.used_bytes(0) == used
    assert proc.ask("alloc 2")["rc"] == 2            # every allocation refused ...
    assert proc.ask("free")["n"] == 2
    assert proc.ask("alloc 100")["rc"] == 0          # ... until use is below the limit
    info = proc.ask("info")
    assert info["total"] == 512 * MIB and 0 < info["free"] < 412 * MIB + 1


def test_sm_share_set_and_lifted_while_running(running):
    """Direction only: a share that starts to apply while the process runs (here
    by the policy going from `disable` to `force`, after launches found the
    device unlimited) slows the next launches; lifting it lets them run free."""
    proc, limits, _ = running
    limits.update_live(sm_limits={0: 20}, core_policy="disable")
    free_run = proc.ask("spin 20 10000")["seconds"]      # 20 x 10 ms, not held
    limits.update_live(core_policy="force")
    held = proc.ask("spin 20 10000")["seconds"]          # 200 ms of work at 20 %
    assert held > 2 * free_run and held > 0.4, (free_run, held)
    limits.update_live(sm_limits={0: 100})
    assert proc.ask("spin 20 10000")["seconds"] < held / 2
    limits.update_live(sm_limits={0: 20})
    assert proc.ask("spin 20 10000")["seconds"] > 0.4
