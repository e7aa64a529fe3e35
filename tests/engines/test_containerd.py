"""containerd with examples/containerd/hami.toml imported as a drop-in; containers
started with `ctr run` through the handler's BinaryName, with the annotations of
examples/containerd/pod.yaml (what the CRI passes through pod_annotations)."""
import re

import pytest

from tests.engines.containerd_engine import pod_example, running_containerd
from tests.engines.conftest import filled_to_the_limit, wait_for

pytestmark = pytest.mark.timeout(600)


@pytest.fixture(scope="module")
def containerd(engines_installed, hami, probe_image, tmp_path_factory):
    root = tmp_path_factory.mktemp("containerd")
    dropin = hami.render("containerd/hami.toml", root / "hami.toml")
    with running_containerd(engines_installed, root, dropin, probe_image) as engine:
        yield engine


def test_dropin_defines_the_hami_handler(containerd, hami):
    plugins = containerd.merged_config()["plugins"]
    handler = plugins["io.containerd.grpc.v1.cri"]["containerd"]["runtimes"]["hami"]
    assert handler["runtime_type"] == "io.containerd.runc.v2"
    assert handler["pod_annotations"] == ["hami.io/*", "nvidia.com/*", "*.hami.io/*"]
    assert handler["container_annotations"] == ["cdi.k8s.io/*"]
    assert handler["options"]["BinaryName"] == str(hami.wrapper)
    assert plugins["io.containerd.grpc.v1.cri"]["containerd"]["default_runtime_name"] == "runc"
    # The CRI plugin took the drop-in (it refuses to load on a bad runtime entry).
    plugins_loaded = containerd.ctr("plugins", "ls", check=True).stdout
    assert re.search(r"io\.containerd\.grpc\.v1\s+cri\s+linux/amd64\s+ok", plugins_loaded), \
        plugins_loaded


def test_pod_annotations_give_the_limits(containerd, hami):
    annotations, command = pod_example()
    result = containerd.run_gpu("hami-ctr-pod", annotations, *command)
    assert result.returncode == 0, result.stderr
    mib = int(annotations["hami.io/gpumem"])
    filled_to_the_limit(result.stdout, mib)
    hami.assert_nothing_allocated()


def test_task_delete_releases(containerd, hami):
    cid = "hami-ctr-delete"
    result = containerd.run_gpu(cid, {"nvidia.com/gpumem": "3000", "hami.io/gpucores": "20"},
                                "sleep", "60", detach=True)
    assert result.returncode == 0, result.stderr
    assert [(d["mem_mib"], d["cores"]) for d in hami.allocations()[cid]["devices"]] == [(3000, 20)]
    containerd.ctr("task", "kill", "--signal", "SIGKILL", cid, check=True, timeout=30)
    wait_for(lambda: "STOPPED" in containerd.ctr("task", "list").stdout, 15, "the task to stop")
    containerd.ctr("task", "delete", cid, check=True, timeout=30)
    wait_for(lambda: hami.allocations() == {}, 10, "the allocation to be released")
    containerd.ctr("container", "delete", cid, check=True, timeout=30)
    hami.assert_nothing_allocated()


def test_bad_request_shows_our_message(containerd, hami):
    cid = "hami-ctr-bad"
    result = containerd.run_gpu(cid, {"hami.io/gpumem": "banana"}, "true")
    assert result.returncode != 0
    assert "OCI runtime create failed" in result.stderr
    assert re.search(r"hami\.io/gpumem.*banana", result.stderr), result.stderr
    containerd.ctr("container", "delete", cid, timeout=30)
    hami.assert_nothing_allocated()
