"""hamictl device-plugin against a stand-in kubelet that speaks the real
device-plugin API v1beta1: it serves Registration on its kubelet.sock, then,
as the kubelet does, calls the plugin's GetDevicePluginOptions, ListAndWatch,
GetPreferredAllocation and Allocate. The plugin runs as its own process on the
simulated GPU; Allocate's answer, put into an OCI spec as the kubelet and the
engine would, is created through the runtime with real runc."""
import json
import queue
import subprocess
import time

import pytest

grpc = pytest.importorskip("grpc")
pytest.importorskip("grpc_tools")

from hami_runtime.tools import device_plugin_api as api  # noqa: E402
from tests.k8s.kubelet import WAIT, Kubelet  # noqa: E402
from tests.runtime.node import HAMICTL, Node, copy_sim, make_rootfs, sim_missing, spec_template  # noqa: E402

VGPU, MEMORY = "hami.io/vgpu", "hami.io/vgpu-memory"
BLOCK = 256


@pytest.fixture(scope="module")
def node(tmp_path_factory):
    missing = sim_missing()
    if missing:
        pytest.skip(f"run `make build sim` first: missing {missing}")
    n = Node(tmp_path_factory.mktemp("dp"), make_rootfs(tmp_path_factory.mktemp("dp-rootfs")),
             spec_template(tmp_path_factory.mktemp("dp-spec")), copy_sim(tmp_path_factory.mktemp("dp-sim")),
             pid_service=False)
    n.simulate(devices=2, memory_mib=16384)
    yield n
    n.cleanup()


@pytest.fixture(scope="module")
def gpus(node):
    found = node.hamictl("gpus", "--json")
    assert found.returncode == 0, found.stderr
    return json.loads(found.stdout)


@pytest.fixture(scope="module")
def plugin(node):
    directory = node.tmp / "device-plugins"
    directory.mkdir()
    kubelet = Kubelet(directory)
    kubelet.start()
    log = open(node.tmp / "device-plugin.log", "wb")
    proc = subprocess.Popen(HAMICTL + ["device-plugin", "--plugin-dir", str(directory), "--memory-block",
                                       str(BLOCK), "--health-interval", "0.5"],
                            env=node.env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)
    log.close()
    try:
        first = kubelet.registrations()
    except queue.Empty:
        proc.kill()
        proc.wait()
        kubelet.stop()
        pytest.fail("no registration: " + (node.tmp / "device-plugin.log").read_text())
    yield proc, kubelet, first, directory
    proc.terminate()
    assert proc.wait(WAIT) == 0, (node.tmp / "device-plugin.log").read_text()
    kubelet.stop()
    assert sorted(p.name for p in directory.iterdir()) == []  # its sockets removed


def test_registers_both_resources(plugin):
    _, _, first, _ = plugin
    assert set(first) == {VGPU, MEMORY}
    assert {r.version for r in first.values()} == {"v1beta1"}
    assert first[VGPU].endpoint == "hami-vgpu.sock" and first[MEMORY].endpoint == "hami-vgpu-memory.sock"
    assert all(r.options.get_preferred_allocation_available for r in first.values())


def test_advertises_slots_and_memory_blocks(plugin, gpus):
    _, kubelet, first, _ = plugin
    pb = api.messages()
    for registration in first.values():
        options = kubelet.plugin(registration, "GetDevicePluginOptions", pb.Empty(), "DevicePluginOptions")
        assert options.get_preferred_allocation_available and not options.pre_start_required
    slots = kubelet.listing(first[VGPU])
    blocks = kubelet.listing(first[MEMORY])
    assert len(gpus) == 2
    assert len(slots) == sum(g["slots"] for g in gpus) == 20
    assert len(blocks) == sum(g["capacity_mib"] // BLOCK for g in gpus)
    for g in gpus:
        assert sum(d.startswith(g["uuid"] + "-") for d in slots) == g["slots"]
        assert f"{g['uuid']}-{g['slots'] - 1}" in slots
    assert set(slots.values()) == set(blocks.values()) == {"Healthy"}


def test_preferred_allocation_spreads_slots_packs_memory(plugin, gpus):
    _, kubelet, first, _ = plugin
    pb = api.messages()
    a, b = gpus[0]["uuid"], gpus[1]["uuid"]
    # b has more free slots in the kubelet's view: one slot goes there
    available = [f"{a}-0", f"{b}-0", f"{b}-1"]
    two = [pb.ContainerPreferredAllocationRequest(available_deviceIDs=available, allocation_size=1),
           pb.ContainerPreferredAllocationRequest(available_deviceIDs=available, allocation_size=2)]
    answer = kubelet.plugin(first[VGPU], "GetPreferredAllocation",
                            pb.PreferredAllocationRequest(container_requests=two), "PreferredAllocationResponse")
    one, pair = [list(r.deviceIDs) for r in answer.container_responses]
    assert one[0].startswith(b)
    assert len(pair) == 2 and {d.rsplit("-", 1)[0] for d in pair} == {a, b}  # two GPUs, never one twice
    blocks = [f"{a}-mem-{i}" for i in range(3)] + [f"{b}-mem-{i}" for i in range(5)]
    answer = kubelet.plugin(first[MEMORY], "GetPreferredAllocation", pb.PreferredAllocationRequest(
        container_requests=[pb.ContainerPreferredAllocationRequest(
            available_deviceIDs=blocks, must_include_deviceIDs=[f"{a}-mem-0"], allocation_size=4)]),
        "PreferredAllocationResponse")
    chosen = list(answer.container_responses[0].deviceIDs)
    assert chosen[0] == f"{a}-mem-0" and len(chosen) == 4
    assert all(d.startswith(b) for d in chosen[1:])  # the rest from the roomiest GPU


@pytest.mark.parametrize("carried", ["env", "annotations"])
def test_allocate_answer_gets_that_slice(plugin, gpus, node, carried):
    """A pod's resources.limits {hami.io/vgpu: 1, hami.io/vgpu-memory: 12}: the
    kubelet allocates a slot and 12 blocks; their answers, merged into the
    container's spec (env, or annotations where the engine passes them), are
    what the runtime allocates."""
    _, kubelet, first, _ = plugin
    uuid = gpus[1]["uuid"]
    slot = kubelet.allocate(first[VGPU], [f"{uuid}-3"])
    memory = kubelet.allocate(first[MEMORY], [f"{gpus[0]['uuid']}-mem-{i}" for i in range(12)])
    assert dict(slot.envs) == {"NVIDIA_VISIBLE_DEVICES": uuid}
    assert dict(memory.envs) == {"HAMI_GPUMEM": str(12 * BLOCK)}
    cid = f"dp-{carried}"
    if carried == "env":
        bundle = node.bundle(cid, env=[f"{k}={v}" for r in (slot, memory) for k, v in r.envs.items()])
    else:
        bundle = node.bundle(cid, annotations={**slot.annotations, **memory.annotations})
    created = node.create(cid, bundle)
    assert created.returncode == 0, created.stderr
    try:
        rows = [r for r in node.ps() if r["container"] == cid]
        assert [(r["uuid"], r["memory_mib"]) for r in rows] == [(uuid, 12 * BLOCK)]
        spec = json.loads((bundle / "config.json").read_text())
        assert f"CUDA_DEVICE_MEMORY_LIMIT_0={12 * BLOCK}m" in spec["process"]["env"]
    finally:
        node.runtime("delete", "-f", cid)


def test_allocate_refuses_two_slots_of_one_gpu(plugin, gpus):
    _, kubelet, first, _ = plugin
    uuid = gpus[0]["uuid"]
    with pytest.raises(grpc.RpcError) as refused:
        kubelet.allocate(first[VGPU], [f"{uuid}-0", f"{uuid}-1"])
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "another GPU" in refused.value.details()


def test_unhealthy_while_the_driver_does_not_answer(plugin, node):
    _, kubelet, first, _ = plugin
    conf = node.sim_state / "sim.conf"
    good = conf.read_text()
    channel, stream = kubelet.plugin(first[VGPU], "ListAndWatch", api.messages().Empty(),
                                     "ListAndWatchResponse", streaming=True)
    try:
        assert set(d.health for d in next(stream).devices) == {"Healthy"}
        conf.write_text("no_such_key = 1\n")  # the simulated driver then fails nvmlInit
        assert set(d.health for d in next(stream).devices) == {"Unhealthy"}
        conf.write_text(good)
        assert set(d.health for d in next(stream).devices) == {"Healthy"}
    finally:
        conf.write_text(good)
        stream.cancel()
        channel.close()


def test_registers_again_when_the_kubelet_restarts(plugin):
    proc, kubelet, _, directory = plugin
    kubelet.stop()
    for sock in directory.iterdir():  # a restarting kubelet removes every socket there
        sock.unlink()
    time.sleep(1)
    kubelet.start()
    again = kubelet.registrations()
    assert set(again) == {VGPU, MEMORY} and proc.poll() is None
    assert len(kubelet.listing(again[VGPU])) == 20  # served again on a new socket


def test_off_with_hami_scheduler(node):
    proc = subprocess.Popen(HAMICTL + ["device-plugin", "--plugin-dir", str(node.tmp / "absent"),
                                       "--scheduler", "hami"],
                            env=node.env, stdin=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    time.sleep(1)
    assert proc.poll() is None  # stays up, serving nothing
    proc.terminate()
    _, err = proc.communicate(timeout=WAIT)
    assert proc.returncode == 0 and "off: HAMi's scheduler" in err
    assert not (node.tmp / "absent").exists()


def test_no_plugin_dir_is_one_line(node, tmp_path):
    done = subprocess.run(HAMICTL + ["device-plugin", "--plugin-dir", str(tmp_path / "nowhere")],
                          env=node.env, capture_output=True, text=True, timeout=WAIT)
    assert done.returncode == 1
    assert done.stderr.strip().splitlines() == [
        f"hamictl: --plugin-dir={str(tmp_path / 'nowhere')!r}: not a directory (is the kubelet's mounted?)"]
