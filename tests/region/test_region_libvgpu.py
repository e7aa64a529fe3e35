"""A region created from Python is the one libvgpu uses: a CUDA process's usage shows up."""
import os
import subprocess

import pytest

from hami_runtime.node import region
from hami_runtime.tools import top
from hami_runtime.node.region import DeviceLimit
from tests.conftest import LIBVGPU, ROOT, SIM_LIB

MiB = 1024 * 1024


@pytest.fixture(scope="module")
def probe(tmp_path_factory):
    if not LIBVGPU.exists() or not (SIM_LIB / "libcuda.so.1").exists():
        pytest.fail("build/libvgpu.so and the simulated driver are needed: run `make build sim`")
    binary = tmp_path_factory.mktemp("probe") / "vgpu-probe"
    subprocess.run(["gcc", "-O2", "-o", str(binary), str(ROOT / "scripts/probe/vgpu-probe.c"), "-ldl"],
                   check=True, timeout=120)
    return binary


def run_env(tmp_path, region_path):
    return dict(os.environ, LD_PRELOAD=str(LIBVGPU), LD_LIBRARY_PATH=str(SIM_LIB),
                CUDA_DEVICE_MEMORY_SHARED_CACHE=str(region_path),
                HAMI_SIM_STATE=str(tmp_path / "gpu.state"))


def test_c_process_usage_and_limit(tmp_path, probe):
    container = tmp_path / "containers" / "c1"
    container.mkdir(parents=True)
    path = region.create(container / region.REGION_FILE_NAME, [DeviceLimit("", 1024 * MiB, 0)])
    env = run_env(tmp_path, path)
    holder = subprocess.Popen([str(probe), "hold", "200", "20"], env=env, stdout=subprocess.PIPE,
                              text=True)
    try:
        assert holder.stdout.readline().startswith("holding 200 MiB")
        with region.open(path) as r:
            procs = r.processes()
            assert [p.pid for p in procs] == [holder.pid]
            usage = procs[0].devices[0]
            assert usage.mem_used - usage.ctx_used == 200 * MiB
            assert r.used_bytes(0) == usage.mem_used
            held = r.used_bytes(0)
        views = top.read_all(str(tmp_path))
        assert views[0].devices[0].mem_used_bytes == held
        # The limit the runtime wrote holds for a second process of the container.
        fill = subprocess.run([str(probe), "fill"], env=env, capture_output=True, text=True, timeout=60)
        assert fill.returncode == 0, fill.stderr
        got = int(fill.stdout.split("allocated ")[1].split(" MiB")[0])
        with region.open(path) as r:
            context = next(p for p in r.processes() if p.pid == holder.pid).devices[0].ctx_used
        # The second process has a context of its own as large as the first's.
        assert abs((1024 * MiB - held - context) - got * MiB) <= 2 * MiB
    finally:
        holder.kill()
        holder.wait(timeout=10)
        holder.stdout.close()
    # Once the holder is gone (SIGKILL) its memory is reclaimed for the next process.
    fill = subprocess.run([str(probe), "fill"], env=env, capture_output=True, text=True, timeout=60)
    got = int(fill.stdout.split("allocated ")[1].split(" MiB")[0])
    assert abs((1024 * MiB - context) - got * MiB) <= 2 * MiB
