"""containerd with examples/containerd/hami.toml imported as a drop-in; containers
started with `ctr run` through the handler's BinaryName, with the annotations of
examples/containerd/pod.yaml (what the CRI passes through pod_annotations)."""
import re
import sys

import pytest
import yaml

from tests.conftest import ROOT
from tests.engines.conftest import MiB, Daemon, need, run, wait_for

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

pytestmark = pytest.mark.timeout(600)


class Containerd:
    def __init__(self, daemon, config, socket):
        self.daemon, self.config, self.socket = daemon, config, socket
        self.binary_name = ""
        self.image = ""

    def ctr(self, *args, timeout=120, check=False):
        return run(["ctr", "--address", self.socket, *args], timeout=timeout, check=check)

    def run_gpu(self, cid, annotations, *args, detach=False, timeout=120):
        notes = [a for k, v in annotations.items() for a in ("--annotation", f"{k}={v}")]
        return self.ctr("run", *(["-d"] if detach else ["--rm"]), "--runc-binary",
                        self.binary_name, *notes, self.image, cid, *args, timeout=timeout)

    def merged_config(self):
        dumped = run([self.daemon.argv[0], "--config", self.config, "config", "dump"],
                     check=True, timeout=60)
        return tomllib.loads(dumped.stdout)

    def remove(self, cid):
        self.ctr("task", "kill", "--signal", "SIGKILL", cid, timeout=30)
        self.ctr("task", "delete", "--force", cid, timeout=30)
        self.ctr("container", "delete", cid, timeout=30)


@pytest.fixture(scope="module")
def containerd(engines_installed, hami, probe_image, tmp_path_factory):
    binary = need("containerd", engines_installed)
    need("ctr", engines_installed)
    root = tmp_path_factory.mktemp("containerd")
    dropin = hami.render("containerd/hami.toml", root / "hami.toml")
    socket = root / "containerd.sock"
    config = root / "config.toml"
    config.write_text(f'''version = 2
root = "{root / "root"}"
state = "{root / "state"}"
imports = ["{dropin}"]
[grpc]
  address = "{socket}"
[ttrpc]
  address = "{socket}.ttrpc"
[debug]
  address = ""
[metrics]
  address = ""
''')
    daemon = Daemon("containerd", root, [binary, "--config", config])
    engine = Containerd(daemon, config, socket)
    daemon.start(lambda: socket.exists() and engine.ctr("version", timeout=10).returncode == 0)
    try:
        imported = engine.ctr("image", "import", probe_image / "image.tar", check=True)
        engine.image = re.search(r"unpacking (\S+)", imported.stdout).group(1)
        # ctr run goes through the runtime the way the handler would: its BinaryName.
        plugins = engine.merged_config()["plugins"]
        engine.binary_name = plugins["io.containerd.grpc.v1.cri"]["containerd"]["runtimes"][
            "hami"]["options"]["BinaryName"]
        yield engine
    finally:
        listed = engine.ctr("container", "list", "--quiet", timeout=30).stdout.split()
        for cid in listed:
            engine.remove(cid)
        daemon.stop()


def test_dropin_defines_the_hami_handler(containerd, hami):
    plugins = containerd.merged_config()["plugins"]
    handler = plugins["io.containerd.grpc.v1.cri"]["containerd"]["runtimes"]["hami"]
    assert handler["runtime_type"] == "io.containerd.runc.v2"
    assert handler["pod_annotations"] == ["hami.io/*", "nvidia.com/*"]
    assert handler["options"]["BinaryName"] == str(hami.wrapper)
    assert plugins["io.containerd.grpc.v1.cri"]["containerd"]["default_runtime_name"] == "runc"
    # The CRI plugin took the drop-in (it refuses to load on a bad runtime entry).
    plugins_loaded = containerd.ctr("plugins", "ls", check=True).stdout
    assert re.search(r"io\.containerd\.grpc\.v1\s+cri\s+linux/amd64\s+ok", plugins_loaded), \
        plugins_loaded


def pod_example():
    pod = yaml.safe_load((ROOT / "examples" / "containerd" / "pod.yaml").read_text())
    return pod["metadata"]["annotations"], pod["spec"]["containers"][0]["command"]


def test_pod_annotations_give_the_limits(containerd, hami):
    annotations, command = pod_example()
    result = containerd.run_gpu("hami-ctr-pod", annotations, *command)
    assert result.returncode == 0, result.stderr
    mib = int(annotations["hami.io/gpumem"])
    free = int(re.search(rf"total {mib} MiB, free (\d+) MiB before filling", result.stdout).group(1))
    got = int(re.search(r"allocated (\d+) MiB; the next 1 MiB was refused: "
                        r"CUDA_ERROR_OUT_OF_MEMORY", result.stdout).group(1))
    assert free - 2 <= got <= free
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
