"""What NVIDIA's users bring, through the runtime and runc on the simulated GPU
(two 16384 MiB cards): a stock CUDA image's env with no HAMi key, and the
prestart hook dockerd writes for `docker run --gpus`."""
import json

import pytest

# the env of an nvidia/cuda image, no HAMi key
STOCK = ["NVIDIA_VISIBLE_DEVICES=all", "NVIDIA_DRIVER_CAPABILITIES=compute,utility",
         "NVIDIA_REQUIRE_CUDA=cuda>=12.4 brand=tesla,driver>=470,driver<471"]
DOCKER_HOOK = {"path": "/usr/bin/nvidia-container-runtime-hook", "args": ["nvidia-container-runtime-hook", "prestart"]}
TOOLKIT_HOOK = {"path": "/usr/local/bin/nvidia-container-toolkit", "args": ["nvidia-container-toolkit", "prestart"]}
OTHER_HOOK = {"path": "/bin/true", "args": ["true"]}


def memory(node, cid):
    return [d["mem_mib"] for d in node.allocations()[cid]["devices"]]


@pytest.mark.parametrize("setting,stock_gets,neighbour_created", [
    (None, [1638, 1638], True),             # the default: slice
    ("slice", [1638, 1638], True),
    ("whole", [16384, 16384], False),
    ("none", None, True),
])
def test_a_stock_image_does_not_lock_the_node(node, setting, stock_gets, neighbour_created):
    if setting:
        node.write_config(visible_devices_alone=setting)
    stock = node.bundle("stock", env=STOCK, args=("true",))
    before = (stock / "config.json").read_bytes()
    assert node.create("stock", stock).returncode == 0
    if stock_gets is None:
        assert "stock" not in node.allocations()
        assert (stock / "config.json").read_bytes() == before   # runs as under runc
    else:
        assert memory(node, "stock") == stock_gets
    proc = node.create("sized", node.bundle("sized", {"hami.io/gpumem": "1000"}, args=("true",)))
    assert (proc.returncode == 0) == neighbour_created, proc.stderr
    if not neighbour_created:
        assert "0 of 1 GPU(s) have room" in proc.stderr


def test_a_default_size_is_the_slice(node):
    node.write_config(default_memory_mib=4096)
    assert node.create("stock", node.bundle("stock", env=STOCK, args=("true",))).returncode == 0
    assert memory(node, "stock") == [4096, 4096]


@pytest.mark.parametrize("visible", ["none", "void", ""])
def test_no_gpu_values(node, visible):
    bundle = node.bundle("nogpu", env=[f"NVIDIA_VISIBLE_DEVICES={visible}"], args=("true",))
    before = (bundle / "config.json").read_bytes()
    assert node.create("nogpu", bundle).returncode == 0
    assert node.allocations() == {} and (bundle / "config.json").read_bytes() == before


def with_hooks(node, cid, env, hooks):
    bundle = node.bundle(cid, env=env, args=("true",))
    spec = json.loads((bundle / "config.json").read_text())
    spec["hooks"] = {"prestart": hooks}
    (bundle / "config.json").write_text(json.dumps(spec))
    return bundle


def prestart(bundle):
    return json.loads((bundle / "config.json").read_text()).get("hooks", {}).get("prestart")


@pytest.mark.parametrize("gpu_hook", [DOCKER_HOOK, TOOLKIT_HOOK], ids=["docker", "toolkit"])
def test_dockerd_gpu_hook_is_served_and_removed(node, gpu_hook):
    """`docker run --gpus '"device=1"' -e HAMI_GPUMEM=2000`, as dockerd writes it: the
    request is the env's (dockerd's value, appended after the image's), the hook goes,
    every other hook stays, and the container runs."""
    env = ["NVIDIA_VISIBLE_DEVICES=all", "HAMI_GPUMEM=2000", "NVIDIA_VISIBLE_DEVICES=1"]
    bundle = with_hooks(node, "gpus", env, [gpu_hook, OTHER_HOOK])
    proc = node.create("gpus", bundle)
    assert proc.returncode == 0, proc.stderr
    assert prestart(bundle) == [OTHER_HOOK]
    assert [(d["index"], d["mem_mib"]) for d in node.allocations()["gpus"]["devices"]] == [(1, 2000)]
    assert node.runtime("start", "gpus").returncode == 0


def test_dockerd_gpu_hook_goes_when_no_gpu_is_served(node):
    bundle = with_hooks(node, "void", ["NVIDIA_VISIBLE_DEVICES=void"], [DOCKER_HOOK])
    assert node.create("void", bundle).returncode == 0
    assert prestart(bundle) is None and node.allocations() == {}


def test_dockerd_gpu_hook_is_refused_where_env_requests_are_off(node):
    node.write_config(env_requests=False)
    bundle = with_hooks(node, "off", ["NVIDIA_VISIBLE_DEVICES=all"], [DOCKER_HOOK])
    proc = node.create("off", bundle)
    assert (proc.returncode, proc.stderr) == (1, "hami-runtime: docker --gpus='nvidia-container-runtime-hook "
                                              "prestart': this node takes no env requests (config "
                                              "env_requests = false)\n")
    assert node.containers() == []


def gpu_uuids(node):
    return [g["uuid"] for g in json.loads(node.hamictl("gpus", "--json").stdout)]


@pytest.mark.parametrize("annotations,env,expected", [
    # CDI names in NVIDIA_VISIBLE_DEVICES, as NVIDIA's runtime takes them in its CDI mode
    (None, ["NVIDIA_VISIBLE_DEVICES=nvidia.com/gpu=1", "HAMI_GPUMEM=1000"], [(1, 1000)]),
    (None, ["NVIDIA_VISIBLE_DEVICES=nvidia.com/gpu=all"], [(0, 1638), (1, 1638)]),  # a stock image's slice
    (None, ["NVIDIA_VISIBLE_DEVICES=nvidia.com/gpu={uuid1}", "HAMI_GPUCORES=20"], [(1, 16384)]),
    # and in a device plugin's cdi.k8s.io/ annotation, sized by HAMi's keys
    ({"cdi.k8s.io/nvidia-device-plugin_uuid": "nvidia.com/gpu={uuid0}", "hami.io/gpumem": "2000"}, [],
     [(0, 2000)]),
    ({"cdi.k8s.io/devices": "vendor.com/nic=eth1,nvidia.com/gpu=0,nvidia.com/gpu=1", "hami.io/gpumem": "500"},
     [], [(0, 500), (1, 500)]),
])
def test_cdi_names_are_served(node, annotations, env, expected):
    uuids = gpu_uuids(node)
    fill = lambda text: text.format(uuid0=uuids[0], uuid1=uuids[1])
    annotations = {k: fill(v) for k, v in (annotations or {}).items()}
    proc = node.create("cdi", node.bundle("cdi", annotations, env=[fill(e) for e in env], args=("true",)))
    assert proc.returncode == 0, proc.stderr
    assert [(d["index"], d["mem_mib"]) for d in node.allocations()["cdi"]["devices"]] == expected


def test_another_vendors_cdi_devices_are_left_to_the_engine(node):
    bundle = node.bundle("nic", {"cdi.k8s.io/nic": "vendor.com/nic=eth1"}, args=("true",))
    before = (bundle / "config.json").read_bytes()
    assert node.create("nic", bundle).returncode == 0
    assert node.allocations() == {} and (bundle / "config.json").read_bytes() == before


@pytest.mark.parametrize("annotations,env,line", [
    (None, ["NVIDIA_VISIBLE_DEVICES=vendor.com/gpu=0"],
     "NVIDIA_VISIBLE_DEVICES='vendor.com/gpu=0': 'vendor.com/gpu=0' is not a CDI name of kind nvidia.com/gpu"),
    ({"cdi.k8s.io/x": "nvidia.com/gpu=7"}, [], "cdi.k8s.io/x='7': no GPU with this index on this node"),
    ({"cdi.k8s.io/x": "nvidia.com/gpu=0", "hami.io/gpu-uuid": "GPU-x"}, [],
     "cdi.k8s.io/x='nvidia.com/gpu=0': conflicts with hami.io/gpu-uuid: the GPUs are named twice"),
])
def test_bad_cdi_names_are_refused_in_one_line(node, annotations, env, line):
    bundle = node.bundle("bad", annotations, env=env, args=("true",))
    before = (bundle / "config.json").read_bytes()
    proc = node.create("bad", bundle)
    assert (proc.returncode, proc.stderr) == (1, f"hami-runtime: {line}\n")
    assert node.allocations() == {} and (bundle / "config.json").read_bytes() == before
