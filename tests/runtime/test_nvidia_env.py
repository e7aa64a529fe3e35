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
