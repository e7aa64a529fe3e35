"""containerd started for a test module: its own root, state, sockets, and the
drop-in it is given; images imported; everything removed at the end."""
import contextlib
import re
import sys

import yaml

from tests.conftest import ROOT
from tests.engines.conftest import Daemon, need, run

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib


def pod_example():
    """The Pod example's annotations and command."""
    annotations, containers = pod_containers("pod.yaml")
    return annotations, containers[0][1]


def pod_containers(example):
    """A Pod example's annotations and its containers' (name, command), in the pod's order."""
    pod = yaml.safe_load((ROOT / "examples" / "containerd" / example).read_text())
    return pod["metadata"]["annotations"], [(c["name"], c["command"]) for c in pod["spec"]["containers"]]


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

    def remove(self, cid, namespace="default"):
        for args in (("task", "kill", "--signal", "SIGKILL", cid), ("task", "delete", "--force", cid),
                     ("container", "delete", cid)):
            self.ctr("--namespace", namespace, *args, timeout=30)


@contextlib.contextmanager
def running_containerd(engines_installed, root, dropin, probe_image):
    """containerd with its own root, state and sockets under root, `dropin` imported."""
    binary = need("containerd", engines_installed)
    need("ctr", engines_installed)
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
        for namespace in ("default", "k8s.io"):
            listed = engine.ctr("--namespace", namespace, "container", "list", "--quiet",
                                timeout=30).stdout.split()
            for cid in listed:
                engine.remove(cid, namespace)
        daemon.stop()
