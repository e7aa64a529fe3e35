"""MIG passthrough through the runtime and runc on the simulated GPU: card 1 in MIG
mode with two instances (1:0 of 4096 MiB, 1:1 of 8192 MiB), card 0 whole. A
container naming an instance (GPU:MIG index, MIG- UUID, CDI name) gets its GPU's
node, the control node and the instance's two nvidia-caps nodes, and holds the
instance whole."""
import json

import pytest

from hami_runtime.node import mig_caps
from tests.runtime.node import SIM

LISTING = "ls /dev | grep -E '^nvidia([0-9]+|ctl)$' ; ls /dev/nvidia-caps 2>/dev/null; echo NVIDIA_VISIBLE_DEVICES=$NVIDIA_VISIBLE_DEVICES"


@pytest.fixture
def mig_node(node):
    node.simulate(mig="1:4096, 1:8192")
    return node


def devices(node):
    proc = node.hamictl("gpus", "--json")
    assert proc.returncode == 0, proc.stderr
    return {row["name"]: row for row in json.loads(proc.stdout)}


def caps_nodes(gpu_minor, gpu_instance):
    """The nodes of GI `gpu_instance` (compute instance 0) on GPU `gpu_minor`, as the
    simulated driver's mig-minors lists them."""
    minors = mig_caps.parse((SIM / "mig-minors").read_text())
    gi = f"gpu{gpu_minor}/gi{gpu_instance}"
    return [f"nvidia-cap{minors[f'{gi}/access']}", f"nvidia-cap{minors[f'{gi}/ci0/access']}"]


def test_hamictl_lists_the_instances(mig_node):
    found = devices(mig_node)
    assert sorted(found) == ["0", "1", "1:0", "1:1"]
    assert found["1"]["mig_mode"] and found["1"]["slots"] == 0
    assert [(found[n]["memory_mib"], found[n]["slots"], found[n]["parent"]) for n in ("1:0", "1:1")] == [
        (4096, 1, found["1"]["uuid"]), (8192, 1, found["1"]["uuid"])]
    assert all(found[n]["uuid"].startswith("MIG-") for n in ("1:0", "1:1"))
    text = mig_node.hamictl("gpus").stdout
    assert "1:1" in text and "GPU 1 is in MIG mode" in text


@pytest.mark.parametrize("how", ["index", "uuid", "cdi-env", "cdi-annotation"])
def test_a_named_instance_gets_its_nodes_and_caps(mig_node, how):
    uuid = devices(mig_node)["1:1"]["uuid"]
    env, annotations = {
        "index": (["NVIDIA_VISIBLE_DEVICES=1:1"], None),
        "uuid": ([f"NVIDIA_VISIBLE_DEVICES={uuid}"], None),
        "cdi-env": (["NVIDIA_VISIBLE_DEVICES=nvidia.com/gpu=1:1"], None),
        "cdi-annotation": ([], {"cdi.k8s.io/nvidia-device-plugin_uuid": f"nvidia.com/gpu={uuid}"}),
    }[how]
    bundle = mig_node.bundle("mig", annotations, env=env, args=("sh", "-c", LISTING))
    proc = mig_node.runtime("run", "--bundle", str(bundle), "mig")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.split() == ["nvidia1", "nvidiactl", *caps_nodes(1, 2), f"NVIDIA_VISIBLE_DEVICES={uuid}"]
    assert "[hami]" not in proc.stdout + proc.stderr


def test_two_instances_of_one_gpu_share_its_node(mig_node):
    bundle = mig_node.bundle("two", env=["NVIDIA_VISIBLE_DEVICES=1:0,1:1"], args=("true",))
    assert mig_node.create("two", bundle).returncode == 0
    spec = json.loads((bundle / "config.json").read_text())
    paths = [d["path"] for d in spec["linux"]["devices"]]
    assert paths.count("/dev/nvidia1") == 1 and "/dev/nvidia0" not in paths
    assert sorted(p.rpartition("/")[2] for p in paths if p.startswith("/dev/nvidia-caps/")) == sorted(
        caps_nodes(1, 1) + caps_nodes(1, 2))
    assert [(d["mem_mib"], d["cores"]) for d in mig_node.allocations()["two"]["devices"]] == [(4096, 0), (8192, 0)]


def test_an_instance_is_one_containers(mig_node):
    assert mig_node.create("first", mig_node.bundle("first", env=["NVIDIA_VISIBLE_DEVICES=1:0"])).returncode == 0
    second = mig_node.bundle("second", env=["NVIDIA_VISIBLE_DEVICES=1:0"])
    proc = mig_node.create("second", second)
    assert proc.returncode == 1 and "GPU 1:0: 1/1 slots used" in proc.stderr
    assert sorted(mig_node.allocations()) == ["first"]
    row = devices(mig_node)["1:0"]
    assert (row["slots_used"], row["memory_allocated_mib"]) == (1, 4096)


@pytest.mark.parametrize("env,annotations,expected", [
    # a request that names no instance never lands on one, nor on a GPU in MIG mode
    (["NVIDIA_VISIBLE_DEVICES=all", "HAMI_GPUMEM=1000"], None, [("0", 1000)]),
    ([], {"hami.io/gpu": "1", "hami.io/gpumem": "1000"}, [("0", 1000)]),
    # no size: the node's slice of a GPU (visible_devices_alone), an instance whole
    (["NVIDIA_VISIBLE_DEVICES=0,1:0"], None, [("0", 1638), ("1:0", 4096)]),
])
def test_requests_get_gpus_and_named_instances(mig_node, env, annotations, expected):
    names = {row["uuid"]: name for name, row in devices(mig_node).items()}
    assert mig_node.create("c", mig_node.bundle("c", annotations, env=env, args=("true",))).returncode == 0
    assert [(names[d["uuid"]], d["mem_mib"]) for d in mig_node.allocations()["c"]["devices"]] == expected


@pytest.mark.parametrize("env,text", [
    (["NVIDIA_VISIBLE_DEVICES=1"], "NVIDIA_VISIBLE_DEVICES='1': GPU 1 is in MIG mode: name one of its "
                                   "MIG instances (1:0, 1:1)"),
    (["NVIDIA_VISIBLE_DEVICES=1:2"], "NVIDIA_VISIBLE_DEVICES='1:2': no MIG instance with this index"),
    (["NVIDIA_VISIBLE_DEVICES=1:0", "HAMI_GPUMEM=1000"], "MIG instance 1:0 is given whole"),
])
def test_refusals_leave_nothing(mig_node, env, text):
    bundle = mig_node.bundle("bad", env=env, args=("true",))
    before = (bundle / "config.json").read_bytes()
    proc = mig_node.create("bad", bundle)
    assert (proc.returncode, proc.stderr.count("\n")) == (1, 1) and text in proc.stderr, proc.stderr
    assert mig_node.allocations() == {} and (bundle / "config.json").read_bytes() == before


def test_a_node_without_the_caps_major_refuses_an_instance(mig_node, tmp_path):
    proc_devices = tmp_path / "devices"
    proc_devices.write_text("Character devices:\n195 nvidia-frontend\n511 nvidia-uvm\n")
    mig_node.write_config(proc_devices=str(proc_devices))
    bundle = mig_node.bundle("nocaps", env=["NVIDIA_VISIBLE_DEVICES=1:0"], args=("true",))
    before = (bundle / "config.json").read_bytes()
    proc = mig_node.create("nocaps", bundle)
    assert proc.returncode == 1 and "lists no nvidia-caps major" in proc.stderr, proc.stderr
    assert mig_node.allocations() == {} and (bundle / "config.json").read_bytes() == before
    # a whole GPU needs no caps
    assert mig_node.create("whole", mig_node.bundle("whole", env=["NVIDIA_VISIBLE_DEVICES=0"])).returncode == 0


@pytest.mark.parametrize("options", [("--gpumem", "1000"), ("--gpucores", "30")])
def test_an_instance_cannot_be_resized(mig_node, options):
    assert mig_node.create("held", mig_node.bundle("held", env=["NVIDIA_VISIBLE_DEVICES=1:0"])).returncode == 0
    before = mig_node.allocations()["held"]["devices"]
    proc = mig_node.hamictl("update", "held", *options)
    assert proc.returncode == 1 and proc.stderr.count("\n") == 1
    assert f"hamictl: {options[0]}='{options[1]}': GPU 1 (MIG-" in proc.stderr
    assert "is a MIG instance, given whole" in proc.stderr
    assert mig_node.allocations()["held"]["devices"] == before


def test_a_tenant_reaches_no_other_instance_nor_gpu(mig_node):
    """Root in a container holding 1:0, with CAP_MKNOD as the engines give it: nodes it
    makes for the other instance's caps or for GPU 0 cannot be opened (the device
    cgroup); its own open as far as the driver (the host has none here: ENXIO)."""
    own, other = caps_nodes(1, 1), caps_nodes(1, 2)
    probes = [(n, 236, int(n[len("nvidia-cap"):])) for n in own + other] + [("gpu0", 195, 0)]
    script = "; ".join(f"mknod /tmp/{n} c {major} {minor}; cat /tmp/{n} >/dev/null 2>/tmp/e; "
                       f"echo {n}: $(cat /tmp/e)" for n, major, minor in probes)
    bundle = mig_node.bundle("tenant", env=["NVIDIA_VISIBLE_DEVICES=1:0"], args=("sh", "-c", script))
    spec = json.loads((bundle / "config.json").read_text())
    for kind in spec["process"]["capabilities"].values():
        kind.append("CAP_MKNOD")
    (bundle / "config.json").write_text(json.dumps(spec))
    proc = mig_node.runtime("run", "--bundle", str(bundle), "tenant")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    seen = dict(line.split(": ", 1) for line in proc.stdout.splitlines())
    assert all(seen[n].endswith("No such device or address") for n in own), seen
    assert all(seen[n].endswith("Operation not permitted") for n in other + ["gpu0"]), seen
