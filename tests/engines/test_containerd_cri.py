"""The CRI path, as the kubelet drives it for a Pod with runtimeClassName: hami:
RunPodSandbox with handler "hami" and the Pod example's annotations, then its
container, on containerd with the example drop-in.

One line is added to the drop-in here, and only here: `restrict_oom_score_adj`.
The CRI gives the pause container oom_score_adj -998, which this machine's
sandbox (no CAP_SYS_RESOURCE) refuses; the setting clamps it to containerd's own.
"""
import importlib.util
import re

import grpc
import pytest

from tests.conftest import ROOT
from tests.engines.conftest import PROBE, wait_for
from tests.engines.containerd_engine import pod_example, running_containerd
from tests.engines.cri import client as cri_client

pytestmark = pytest.mark.timeout(600)
CRI_SECTION = '[plugins."io.containerd.grpc.v1.cri"]'
IMAGE = "docker.io/library/hami-probe:latest"
SANDBOX_IMAGE = "registry.k8s.io/pause:3.6"  # containerd 1.6's default sandbox image


@pytest.fixture(scope="module")
def containerd(engines_installed, hami, probe_image, tmp_path_factory):
    root = tmp_path_factory.mktemp("containerd-cri")
    dropin = hami.render("containerd/hami.toml", root / "hami.toml")
    text = dropin.read_text()
    assert CRI_SECTION not in text
    dropin.write_text(text.replace("version = 2\n", f"version = 2\n\n{CRI_SECTION}\n"
                                   "  restrict_oom_score_adj = true\n", 1))
    with running_containerd(engines_installed, root, dropin, probe_image) as engine:
        yield engine


@pytest.fixture(scope="module")
def cri(containerd, probe_image, tmp_path_factory):
    """A CRI client on the module's containerd, with a local stand-in pause image."""
    spec = importlib.util.spec_from_file_location("build_image",
                                                  ROOT / "scripts/probe/build_image.py")
    build_image = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(build_image)
    out = tmp_path_factory.mktemp("cri")
    pause = out / "pause.tar"
    build_image.write_docker_archive(probe_image / "rootfs.tar", pause, tag=SANDBOX_IMAGE,
                                     cmd=("/bin/sleep", "3600"))
    for archive in (pause, probe_image / "image.tar"):
        containerd.ctr("--namespace", "k8s.io", "image", "import", archive, check=True)
    service = cri_client.RuntimeService(containerd.socket, cri_client.compile_messages(out))
    assert service.call("Version", version="v1").runtime_api_version == "v1"
    service.logs = out / "logs"
    service.logs.mkdir()
    try:
        yield service
    finally:
        service.close()


def pod_sandbox_config(cri, annotations, name):
    m = cri.messages
    return m.PodSandboxConfig(
        metadata=m.PodSandboxMetadata(name=name, uid=f"uid-{name}", namespace="default"),
        log_directory=str(cri.logs / name), annotations=annotations,
        # Host network: this machine has no CNI plugins.
        linux=m.LinuxPodSandboxConfig(security_context=m.LinuxSandboxSecurityContext(
            namespace_options=m.NamespaceOption(network=m.NODE, pid=m.CONTAINER))))


def container_config(cri, name, command):
    m = cri.messages
    return m.ContainerConfig(metadata=m.ContainerMetadata(name=name), image=m.ImageSpec(image=IMAGE),
                             command=command[:1], args=command[1:], log_path=f"{name}.log")


def wait_exited(cri, cid, timeout=60):
    exited = cri.messages.CONTAINER_EXITED
    wait_for(lambda: cri.call("ContainerStatus", container_id=cid).status.state == exited,
             timeout, f"container {cid[:12]} to exit")
    return cri.call("ContainerStatus", container_id=cid).status


def test_cri_runtime_handler_with_pod_annotations(containerd, cri, hami):
    """RunPodSandbox with handler "hami" and the Pod example's annotations, then its
    containers: the limits are inside, only workloads hold allocations (not the
    pause container), and stopping or removing releases them."""
    annotations, command = pod_example()
    mib, cores = int(annotations["hami.io/gpumem"]), int(annotations["hami.io/gpucores"])
    sandbox_config = pod_sandbox_config(cri, annotations, "vgpu-probe")
    sandbox = cri.call("RunPodSandbox", config=sandbox_config, runtime_handler="hami").pod_sandbox_id
    try:
        # The pause container carries the pod annotations too, but is no GPU workload.
        hami.assert_nothing_allocated()
        # The Pod example's own container: allocate until refused.
        cid = cri.call("CreateContainer", pod_sandbox_id=sandbox, sandbox_config=sandbox_config,
                       config=container_config(cri, "probe", command)).container_id
        cri.call("StartContainer", container_id=cid)
        status = wait_exited(cri, cid)
        log = (cri.logs / "vgpu-probe" / "probe.log").read_text()
        assert status.exit_code == 0, log
        assert f"total {mib} MiB" in log
        assert re.search(r"allocated \d+ MiB; the next 1 MiB was refused: "
                         r"CUDA_ERROR_OUT_OF_MEMORY", log), log
        cri.call("RemoveContainer", container_id=cid)
        hami.assert_nothing_allocated()
        # A second container of the pod, held running: its allocation, then its release.
        cid = cri.call("CreateContainer", pod_sandbox_id=sandbox, sandbox_config=sandbox_config,
                       config=container_config(cri, "holder", [PROBE, "hold", "100", "60"])
                       ).container_id
        cri.call("StartContainer", container_id=cid)
        assert [(d["mem_mib"], d["cores"]) for d in hami.allocations()[cid]["devices"]] == [
            (mib, cores)]
        assert hami.region_dirs() == [cid]
        cri.call("StopContainer", container_id=cid, timeout=0)
        wait_for(lambda: hami.allocations() == {}, 15, "the allocation to be released")
        cri.call("RemoveContainer", container_id=cid)
    finally:
        cri.call("StopPodSandbox", pod_sandbox_id=sandbox)
        cri.call("RemovePodSandbox", pod_sandbox_id=sandbox)
    hami.assert_nothing_allocated()


def test_cri_bad_request_is_reported_to_the_kubelet(containerd, cri, hami):
    sandbox_config = pod_sandbox_config(cri, {"hami.io/gpumem": "banana"}, "bad-request")
    sandbox = cri.call("RunPodSandbox", config=sandbox_config, runtime_handler="hami").pod_sandbox_id
    try:
        cid = cri.call("CreateContainer", pod_sandbox_id=sandbox, sandbox_config=sandbox_config,
                       config=container_config(cri, "probe", ["true"])).container_id
        with pytest.raises(grpc.RpcError) as failure:
            cri.call("StartContainer", container_id=cid)
        assert re.search(r"hami\.io/gpumem.*banana", str(failure.value)), failure.value
        cri.call("RemoveContainer", container_id=cid)
    finally:
        cri.call("StopPodSandbox", pod_sandbox_id=sandbox)
        cri.call("RemovePodSandbox", pod_sandbox_id=sandbox)
    hami.assert_nothing_allocated()
