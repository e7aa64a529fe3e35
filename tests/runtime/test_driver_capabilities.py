"""NVIDIA_DRIVER_CAPABILITIES: which driver files a GPU container gets, table-driven
and through the runtime with runc on the simulated driver, whose driver root has a
stand-in for a file of every class (mk/sim.mk)."""
import json

import pytest

from hami_runtime.errors import HamiError
from hami_runtime.node import discovery, driver_capabilities as caps

UTILITY = {"/lib/libnvidia-ml.so.1", "/lib/libnvidia-ml.so", "/lib/libnvidia-cfg.so.1", "/bin/nvidia-smi",
           "/bin/nvidia-debugdump"}
COMPUTE = {"/lib/libcuda.so.1", "/lib/libcuda.so", "/lib/libnvidia-ptxjitcompiler.so.1",
           "/bin/nvidia-cuda-mps-control"}
VIDEO = {"/lib/libnvidia-encode.so.1", "/lib/libnvcuvid.so.1"}
GRAPHICS = {"/lib/libEGL_nvidia.so.0", "/lib/libnvidia-glcore.so.1"}
NGX = {"/lib/libnvidia-ngx.so.1"}


@pytest.mark.parametrize("soname,expected", [
    ("libcuda.so.1", "compute"), ("libcuda.so", "compute"), ("libnvidia-ml.so.1", "utility"),
    ("libnvidia-encode.so.1", "video"), ("libnvcuvid.so.1", "video"), ("libEGL_nvidia.so.0", "graphics"),
    ("libnvidia-glcore.so.550.54.15", "graphics"), ("libnvidia-ngx.so.1", "ngx"),
    ("libnvidia-pkcs11-openssl3.so.550", "compute"),
    ("libcudart.so.12", None), ("libnvidia-escape.so.1", None), ("libcudax.so.1", None), ("libGL.so.1", None),
])
def test_library_class(soname, expected):
    assert caps.library_class(soname) == expected


@pytest.mark.parametrize("value,expected", [
    (None, {"compute", "utility"}), ("", {"compute", "utility"}), ("utility", {"utility"}),
    ("compute, video", {"compute", "video"}), ("all", set(caps.CLASSES)), ("graphics,all", set(caps.CLASSES)),
    ("none", set()),
])
def test_parse(value, expected):
    assert caps.parse(value) == expected


@pytest.mark.parametrize("value", ["compute,gpu", "none,utility", "Compute"])
def test_unknown_class_is_refused_by_name(value):
    with pytest.raises(HamiError) as caught:
        caps.parse(value)
    assert caught.value.field == "NVIDIA_DRIVER_CAPABILITIES"


def test_compat32_adds_the_32_bit_copies(tmp_path):
    for arch in ("x86_64-linux-gnu", "i386-linux-gnu"):
        (tmp_path / arch).mkdir()
        (tmp_path / arch / "libcuda.so.1").write_bytes(b"\x7fELF")
    files = discovery.select_driver_libs([("libcuda.so.1", "libc6,x86-64", "/x86_64-linux-gnu/libcuda.so.1"),
                                          ("libcuda.so.1", "libc6", "/i386-linux-gnu/libcuda.so.1")],
                                         str(tmp_path))
    assert [f.container_path for f in caps.chosen(files, caps.parse("compute"))] == [
        "/x86_64-linux-gnu/libcuda.so.1"]
    assert [f.container_path for f in caps.chosen(files, caps.parse("compute,compat32"))] == [
        "/x86_64-linux-gnu/libcuda.so.1", "/i386-linux-gnu/libcuda.so.1"]


def mounted(bundle):
    spec = json.loads((bundle / "config.json").read_text())
    return {m["destination"] for m in spec["mounts"] if m["destination"].startswith(("/lib/", "/bin/"))}


@pytest.mark.parametrize("value,expected", [
    (None, UTILITY | COMPUTE),                   # NVIDIA's default
    ("compute,utility", UTILITY | COMPUTE),
    ("utility", UTILITY),
    ("video", VIDEO),
    ("graphics", GRAPHICS),
    ("ngx", NGX),
    ("all", UTILITY | COMPUTE | VIDEO | GRAPHICS | NGX),
])
def test_a_container_gets_the_files_of_its_capabilities(node, value, expected):
    env = ["NVIDIA_VISIBLE_DEVICES=0", "HAMI_GPUMEM=1000"] + (
        [f"NVIDIA_DRIVER_CAPABILITIES={value}"] if value is not None else [])
    bundle = node.bundle("caps", env=env, args=("true",))
    proc = node.create("caps", bundle)
    assert proc.returncode == 0, proc.stderr
    assert mounted(bundle) == expected


def test_a_bad_capability_is_refused_and_leaves_nothing(node):
    bundle = node.bundle("bad", env=["NVIDIA_VISIBLE_DEVICES=0", "NVIDIA_DRIVER_CAPABILITIES=compute,gpu"],
                         args=("true",))
    before = (bundle / "config.json").read_bytes()
    proc = node.create("bad", bundle)
    assert (proc.returncode, proc.stderr.count("\n")) == (1, 1)
    assert "NVIDIA_DRIVER_CAPABILITIES='compute,gpu': 'gpu' is not a driver capability" in proc.stderr
    assert node.allocations() == {} and (bundle / "config.json").read_bytes() == before


def test_utility_alone_shows_the_slice_without_libcuda(node):
    """nvidia-smi inside a `utility` container: NVML's view of the slice holds, and
    there is no libcuda to load."""
    bundle = node.bundle("smi", env=["NVIDIA_VISIBLE_DEVICES=0", "HAMI_GPUMEM=3000",
                                     "NVIDIA_DRIVER_CAPABILITIES=utility"],
                         # (the shared test rootfs keeps empty mount points of earlier containers)
                         args=("sh", "-c", "test -s /lib/libcuda.so.1 && echo libcuda || echo no libcuda; "
                                           "nvidia-smi --query-gpu=index,memory.total --format=csv"))
    proc = node.runtime("run", "--bundle", str(bundle), "smi")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "no libcuda" in proc.stdout
    assert "0, 3000 MiB" in proc.stdout, proc.stdout + proc.stderr
    assert "[hami]" not in proc.stdout + proc.stderr   # libvgpu has nothing to warn about
