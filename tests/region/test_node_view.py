"""node_view without a driver: a container's names and request source from its
allocator record, and the driver reader's deadline with a stand-in NVML read."""
import json
import threading
import time

import pytest

from hami_runtime.node.gpu import GpuInfo
from hami_runtime.tools import node_view

CONTAINERD = {"io.kubernetes.cri.sandbox-namespace": "ml", "io.kubernetes.cri.sandbox-name": "trainer-0",
              "io.kubernetes.cri.container-name": "main"}
CRIO = {"io.kubernetes.pod.namespace": "ml", "io.kubernetes.pod.name": "trainer-0",
        "io.kubernetes.container.name": "main"}


@pytest.mark.parametrize("identity,expected", [
    (CONTAINERD, ("ml", "trainer-0", "main")),
    (CRIO, ("ml", "trainer-0", "main")),
    ({"nerdctl/name": "web"}, ("", "", "web")),
    ({}, ("", "", "")),
    ({"io.kubernetes.cri.sandbox-name": 7, "io.kubernetes.pod.name": "p"}, ("", "p", "")),  # text only
    ({"io.kubernetes.cri.container-name": "y" * 1000}, ("", "", "y" * node_view.MAX_LABEL)),
    (None, ("", "", "")),
])
def test_names_from_the_record(identity, expected):
    meta = node_view.container_meta({"identity": identity, "request": {"hami.io/gpu": "1"}})
    assert (meta["pod_namespace"], meta["pod_name"], meta["container_name"]) == expected


@pytest.mark.parametrize("request_keys,source", [
    ({"hami.io/gpumem": "1024"}, "annotation"),
    ({"nvidia.com/gpucores": "30", "cdi.k8s.io/x": "nvidia.com/gpu=0"}, "annotation"),
    ({"hami.io/vgpu-devices-allocated": "GPU-x,NVIDIA,1024,30:;"}, "hami-scheduler"),
    ({"NVIDIA_VISIBLE_DEVICES": "0", "HAMI_GPUMEM": "1024"}, "env"),
    ({"NVIDIA_VISIBLE_DEVICES": "all"}, "env"),
    ({}, ""),
    ("not a mapping", ""),
])
def test_request_source(request_keys, source):
    assert node_view.request_source(request_keys) == source


@pytest.mark.parametrize("meta,shown", [
    ({"pod_namespace": "ml", "pod_name": "p", "container_name": "c"}, "ml/p/c"),
    ({"pod_namespace": "", "pod_name": "", "container_name": "web"}, "web"),
    ({"pod_namespace": "", "pod_name": "", "container_name": ""}, "-"),
    ({"pod_namespace": "ml", "pod_name": "p", "container_name": "a\nb\tc"}, "ml/p/a?b?c"),
])
def test_shown_name(meta, shown):
    assert node_view.shown_name(meta) == shown


GPU = GpuInfo(0, "GPU-0000", "Model", 1024, 0)
GPU1 = GpuInfo(1, "GPU-1111", "Model", 1024, 1)


class StuckDriver:
    """Stands in for read_driver: lists two GPUs, answers for the first, then hangs
    in the second until released."""

    def __init__(self):
        self.release, self.calls = threading.Event(), 0

    def __call__(self, nvml_library, into):
        self.calls += 1
        into.inventory = [GPU, GPU1]
        into.figures[GPU.uuid] = node_view.DriverGpu(GPU.uuid, 10, 5, {})
        self.release.wait(30)
        into.figures[GPU1.uuid] = node_view.DriverGpu(GPU1.uuid, 20, 7, {})


def test_a_hung_driver_costs_a_read_the_deadline_and_no_more():
    stuck = StuckDriver()
    reader = node_view.DriverReader(deadline_s=0.2, read=stuck)
    started = time.monotonic()
    first = reader.read()
    assert time.monotonic() - started < 1
    assert list(first.figures) == [GPU.uuid]  # what was read before the deadline counts
    assert first.error == "the driver did not answer within 0.2s"
    started = time.monotonic()
    second = reader.read()  # the worker is still stuck: no second one joins it
    assert time.monotonic() - started < 0.1 and stuck.calls == 1
    assert second.figures == {} and second.error.startswith("the driver has not answered a read started")
    assert reader.inventory == [GPU, GPU1]  # still named
    stuck.release.set()
    for _ in range(100):
        third = reader.read()
        if not third.error:
            break
        time.sleep(0.05)
    assert sorted(third.figures) == [GPU.uuid, GPU1.uuid] and stuck.calls >= 2


def test_driver_error_is_the_readings():
    def broken(nvml_library, into):
        raise OSError("libnvidia-ml.so.1: cannot open shared object file")

    reading = node_view.DriverReader(read=broken).read()
    assert reading.error == "NVML: libnvidia-ml.so.1: cannot open shared object file"
    views = node_view.gpu_views([GPU], node_view.AllocatorView(), reading, set(), 4, 1.0)
    assert [(v.gpu, v.driver_read, v.driver_error, v.driver_used_bytes) for v in views] == [
        ("0", False, reading.error, None)]


def test_unread_driver_names_gpus_from_discovery(tmp_path):
    """Before the driver ever answered, the GPUs are named as discovery last found them."""
    (tmp_path / "cache").mkdir()
    (tmp_path / "cache" / "gpus.json").write_text(json.dumps(
        {"key": {}, "value": [g._asdict() for g in (GPU, GPU1)]}))
    release = threading.Event()

    def hangs(nvml_library, into):
        release.wait(30)

    reader = node_view.DriverReader(deadline_s=0.1, read=hangs)
    settings = {"state_dir": str(tmp_path), "nvml_library": "", "split_count": 4, "memory_scaling": 2.0,
                "policy": "binpack", "core_policy": "default"}
    try:
        views = node_view.node_now(settings, reader, [])
    finally:
        release.set()
    assert [(v.gpu, v.model, v.capacity_bytes, v.slots, v.driver_read) for v in views] == [
        ("0", "Model", 2048 * node_view.MiB, 4, False), ("1", "Model", 2048 * node_view.MiB, 4, False)]


def test_outside_is_what_no_slice_counts():
    reading = node_view.DriverReading(inventory=[GPU], figures={GPU.uuid: node_view.DriverGpu(
        GPU.uuid, 700, 50, {101: 100, 102: 200, 103: 400})})
    [view] = node_view.gpu_views([GPU], node_view.AllocatorView(), reading, {101, 999}, 4, 1.0)
    assert (view.driver_used_bytes, view.utilization_pct, view.outside_bytes, view.outside_pids) == (
        700, 50, 600, [102, 103])


def test_reads_at_once_share_one_worker():
    calls = []

    def slow(nvml_library, into):
        calls.append(1)
        time.sleep(0.1)
        into.inventory = [GPU]
        into.figures[GPU.uuid] = node_view.DriverGpu(GPU.uuid, 10, 5, {})

    reader = node_view.DriverReader(deadline_s=0.5, read=slow)
    results = []
    threads = [threading.Thread(target=lambda: results.append(reader.read())) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(5)
    assert len(calls) == 1
    assert [(list(r.figures), r.error) for r in results] == [([GPU.uuid], "")] * 3


def test_mig_instance_is_read_with_its_gpu():
    parent = GPU._replace(mig_mode=True)
    instance = GPU._replace(uuid="MIG-0001", parent=GPU.uuid, mig_index=1, memory_mib=512)
    reading = node_view.DriverReading(inventory=[parent, instance], figures={
        GPU.uuid: node_view.DriverGpu(GPU.uuid, 700, 50, {})})
    views = node_view.gpu_views([parent, instance], node_view.AllocatorView(), reading, set(), 4, 1.0)
    assert [(v.gpu, v.driver_read, v.driver_used_bytes, v.capacity_bytes, v.slots) for v in views] == [
        ("0", True, 700, 0, 0), ("0:1", True, None, 512 * node_view.MiB, 1)]
