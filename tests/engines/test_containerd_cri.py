"""The CRI path, as the kubelet drives it for a Pod with runtimeClassName: hami:
RunPodSandbox with handler "hami" and the Pod example's annotations, then its
containers one by one in the pod's order (init containers run to their end
first; a restart is the same name with the next attempt), on containerd with
the example drop-in. The Pod examples with several containers are used as they
are; a pod scheduled by HAMi carries the decision its scheduler would write.

One line is added to the drop-in here, and only here: `restrict_oom_score_adj`.
The CRI gives the pause container oom_score_adj -998, which this machine's
sandbox (no CAP_SYS_RESOURCE) refuses; the setting clamps it to containerd's own.
"""
import contextlib
import importlib.util
import json
import re

import grpc
import pytest

from tests.conftest import ROOT
from tests.engines.conftest import PROBE, filled_to_the_limit, wait_for
from tests.engines.containerd_engine import pod_containers, pod_example, running_containerd
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


def container_config(cri, name, command, attempt=0, annotations=None):
    m = cri.messages
    return m.ContainerConfig(metadata=m.ContainerMetadata(name=name, attempt=attempt),
                             image=m.ImageSpec(image=IMAGE), command=command[:1], args=command[1:],
                             log_path=f"{name}_{attempt}.log" if attempt else f"{name}.log",
                             annotations=annotations or {})


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
        hami.assert_nothing_allocated(pods_live=True)
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


# ---- pods with several containers ------------------------------------------------------

class KubeletPod:
    """A pod as the kubelet runs it: its sandbox, then each container created and
    started in the pod's order (a restart: the same name, the next attempt)."""

    def __init__(self, containerd, cri, annotations, name):
        self.containerd, self.cri, self.name = containerd, cri, name
        self.config = pod_sandbox_config(cri, annotations, name)
        self.sandbox = cri.call("RunPodSandbox", config=self.config, runtime_handler="hami").pod_sandbox_id
        self.ids = {}

    def start(self, name, command, attempt=0, annotations=None):
        cid = self.cri.call("CreateContainer", pod_sandbox_id=self.sandbox, sandbox_config=self.config,
                            config=container_config(self.cri, name, command, attempt, annotations)
                            ).container_id
        self.cri.call("StartContainer", container_id=cid)
        self.ids[name] = cid
        return cid

    def log(self, name, attempt=0):
        return (self.cri.logs / self.name / (f"{name}_{attempt}.log" if attempt else f"{name}.log")).read_text()

    def spec(self, name):
        """The container's config.json as the runtime left it (its task's bundle)."""
        bundle = self.containerd.daemon.root / "state" / "io.containerd.runtime.v2.task" / "k8s.io"
        return json.loads((bundle / self.ids[name] / "config.json").read_text())

    def remove(self):
        self.cri.call("StopPodSandbox", pod_sandbox_id=self.sandbox)
        self.cri.call("RemovePodSandbox", pod_sandbox_id=self.sandbox)


@contextlib.contextmanager
def kubelet_pod(containerd, cri, annotations, name):
    pod = KubeletPod(containerd, cri, annotations, name)
    try:
        yield pod
    finally:
        pod.remove()


def untouched(spec):
    """A spec the runtime left as the engine wrote it: no allocation, nothing of ours mounted."""
    return "hami.io/allocation" not in spec.get("annotations", {}) and not any(
        m["destination"].startswith("/usr/local/vgpu") for m in spec.get("mounts", []))


def held(hami):
    """container id -> [(uuid, MiB, cores)] held now."""
    return {cid: [(d["uuid"], d["mem_mib"], d["cores"]) for d in entry["devices"]]
            for cid, entry in hami.allocations().items()}


def test_cri_gpu_container_and_a_sidecar(containerd, cri, hami):
    """examples/containerd/pod-sidecar.yaml: the listed container gets the pod's slice
    and is held to it; the sidecar runs untouched, and the runtime's log says so."""
    annotations, containers = pod_containers("pod-sidecar.yaml")
    (app, app_command), (sidecar, sidecar_command) = containers
    with kubelet_pod(containerd, cri, annotations, "vgpu-sidecar") as pod:
        pod.start(sidecar, sidecar_command)   # in either order: the list decides
        cid = pod.start(app, app_command)
        status = wait_exited(cri, cid)
        assert status.exit_code == 0, pod.log(app)
        filled_to_the_limit(pod.log(app), int(annotations["hami.io/gpumem"]))
        assert untouched(pod.spec(sidecar)) and held(hami) == {}
        assert f"(container {sidecar} of pod default/vgpu-sidecar): passed through untouched: no GPU: " \
               f"not named by the pod (hami.io/containers={app})" in hami.log.read_text()
        assert f"{cid} (container {app} of pod default/vgpu-sidecar): allocated GPU " in hami.log.read_text()
    hami.assert_nothing_allocated()


def test_cri_two_gpu_containers_of_different_sizes(containerd, cri, hami):
    """examples/containerd/pod-two-gpus.yaml: each GPU container is held to its own
    slice, the third runs untouched."""
    annotations, containers = pod_containers("pod-two-gpus.yaml")
    sizes = {"trainer": (2048, 60), "evaluator": (1024, 30)}
    with kubelet_pod(containerd, cri, annotations, "vgpu-two") as pod:
        for name, command in containers:
            pod.start(name, command)
        for name, (mib, cores) in sizes.items():
            assert wait_exited(cri, pod.ids[name]).exit_code == 0, pod.log(name)
            filled_to_the_limit(pod.log(name), mib)
            assert re.search(rf"{pod.ids[name]} \(container {name} of pod default/vgpu-two\): allocated "
                             rf"GPU \d {mib}MiB {cores}% \(keys of its own\)", hami.log.read_text())
        assert untouched(pod.spec("metrics"))
    hami.assert_nothing_allocated()


def test_cri_hami_decision_for_three_containers(containerd, cri, hami):
    """HAMi's decision for a pod of an init container and two containers, the last
    without a GPU: each gets the entry at its place in the pod (init containers first)."""
    gpu = hami.gpu_uuids()
    value = f"{gpu[0]},NVIDIA,1024,30:;{gpu[1]},NVIDIA,2048,0:;;"
    with kubelet_pod(containerd, cri, {"hami.io/vgpu-devices-allocated": value}, "hami-scheduled") as pod:
        init = pod.start("init", [PROBE, "fill"])   # the kubelet runs it to its end first
        assert wait_exited(cri, init).exit_code == 0, pod.log("init")
        filled_to_the_limit(pod.log("init"), 1024)
        app = pod.start("app", [PROBE, "hold", "100", "60"])
        pod.start("sidecar", ["/bin/sh", "-c", "while sleep 5; do :; done"])
        wait_for(lambda: held(hami) == {app: [(gpu[1], 2048, 0)]}, 15, "only app to hold its entry")
        assert untouched(pod.spec("sidecar"))
        assert "(container sidecar of pod default/hami-scheduled): passed through untouched: no GPU: " \
               "HAMi's entry 3 of 3 (by creation order) has no device" in hami.log.read_text()
    hami.assert_nothing_allocated()


def test_cri_container_restarted_in_place(containerd, cri, hami):
    """The kubelet restarts a container (same name, same sandbox, the next attempt, a
    new id): it gets the same slice again and the old one is gone; the pod deleted while
    the container waits to restart leaves nothing."""
    annotations = {"hami.io/gpumem": "1536", "hami.io/gpucores": "20", "hami.io/containers": "app"}
    hold = [PROBE, "hold", "100", "60"]
    with kubelet_pod(containerd, cri, annotations, "restarts") as pod:
        first = pod.start("app", hold)
        [slice_before] = held(hami).values()
        assert [(mib, cores) for _, mib, cores in slice_before] == [(1536, 20)]
        cri.call("StopContainer", container_id=first, timeout=0)   # it crashed
        wait_for(lambda: held(hami) == {}, 15, "the stopped container's slice to go")
        second = pod.start("app", hold, attempt=1)
        assert second != first and held(hami) == {second: slice_before}
        [ledger] = hami.pods().values()
        assert ledger["containers"]["app"]["id"] == second
        cri.call("StopContainer", container_id=second, timeout=0)  # crashed again: back-off
        wait_for(lambda: held(hami) == {}, 15, "the stopped container's slice to go")
        assert hami.pods() != {}   # the pod lives on, it remembers its container
    hami.assert_nothing_allocated()  # and with the pod gone, its record too


def test_cri_device_plugin_cdi_annotation_names_the_gpu(containerd, cri, hami):
    """A device plugin's Allocate answer as the kubelet passes it: a CDI annotation on
    the container (through the example's container_annotations) names GPU 1; the pod's
    hami.io/gpumem sizes it."""
    gpu = hami.gpu_uuids()
    plugin = {"cdi.k8s.io/nvidia-device-plugin_uuid": f"nvidia.com/gpu={gpu[1]}"}
    with kubelet_pod(containerd, cri, {"hami.io/gpumem": "1024"}, "cdi-pod") as pod:
        app = pod.start("app", [PROBE, "fill"], annotations=plugin)
        assert wait_exited(cri, app).exit_code == 0, pod.log("app")
        filled_to_the_limit(pod.log("app"), 1024)
        assert re.search(rf"{app} \(container app of pod default/cdi-pod\): allocated GPU 1 1024MiB 0% "
                         r"\(its GPUs named by cdi.k8s.io/nvidia-device-plugin_uuid\)", hami.log.read_text())
    hami.assert_nothing_allocated()
