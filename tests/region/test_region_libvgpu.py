"""Limits and a region made from Python are the ones libvgpu uses, in a runtime-made
container's layout: a CUDA process's usage shows up, the limit holds."""
import os
import subprocess

import pytest

from hami_runtime.node import region
from hami_runtime.tools import top
from hami_runtime.node.region import DeviceLimit
from tests.conftest import LIBVGPU, ROOT, SIM_LIB, runtime_made, sim_uuids
from tests.region.fakes import make_container

MiB = 1024 * 1024


@pytest.fixture(scope="module")
def probe(tmp_path_factory):
    if not LIBVGPU.exists() or not (SIM_LIB / "libcuda.so.1").exists():
        pytest.fail("build/libvgpu.so and the simulated driver are needed: run `make build sim`")
    binary = tmp_path_factory.mktemp("probe") / "vgpu-probe"
    subprocess.run(["gcc", "-O2", "-o", str(binary), str(ROOT / "scripts/probe/vgpu-probe.c"), "-ldl"],
                   check=True, timeout=120)
    return binary


def run_env(tmp_path):
    return dict(os.environ, LD_PRELOAD=str(LIBVGPU), LD_LIBRARY_PATH=str(SIM_LIB),
                HAMI_SIM_STATE=str(tmp_path / "gpu.state"))


def test_c_process_usage_and_limit(tmp_path, probe):
    name = "c1@0123456789abcdef"
    path = make_container(tmp_path, name, [DeviceLimit(sim_uuids()[0], 1024 * MiB, 0)])
    env = run_env(tmp_path)
    inside = runtime_made(tmp_path / "private" / name / region.LIMITS_FILE_NAME, path.parent)
    holder = subprocess.Popen(inside + [str(probe), "hold", "200", "20"], env=env, stdout=subprocess.PIPE,
                              text=True)
    try:
        assert holder.stdout.readline().startswith("holding 200 MiB")
        with region.open(path) as r:
            procs = r.processes(1)
            assert [p.pid for p in procs] == [holder.pid]
            usage = procs[0].devices[0]
            assert usage.mem_used - usage.ctx_used == 200 * MiB
            assert r.used_bytes(0) == usage.mem_used
            held = r.used_bytes(0)
        views = top.read_all(str(tmp_path))
        assert views[0].devices[0].mem_used_bytes == held
        # The limit the runtime wrote holds for a second process of the container.
        fill = subprocess.run(inside + [str(probe), "fill"], env=env, capture_output=True, text=True,
                              timeout=60)
        assert fill.returncode == 0, fill.stderr
        got = int(fill.stdout.split("allocated ")[1].split(" MiB")[0])
        with region.open(path) as r:
            context = next(p for p in r.processes(1) if p.pid == holder.pid).devices[0].ctx_used
        # The second process has a context of its own as large as the first's.
        assert abs((1024 * MiB - held - context) - got * MiB) <= 2 * MiB
    finally:
        holder.kill()
        holder.wait(timeout=10)
        holder.stdout.close()
    # Once the holder is gone (SIGKILL) its memory is reclaimed for the next process.
    fill = subprocess.run(inside + [str(probe), "fill"], env=env, capture_output=True, text=True, timeout=60)
    got = int(fill.stdout.split("allocated ")[1].split(" MiB")[0])
    assert abs((1024 * MiB - context) - got * MiB) <= 2 * MiB
