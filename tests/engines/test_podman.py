"""podman --runtime hami (examples/podman/containers.conf as it is, install path aside)."""
import json
import os
import re
import urllib.request

import pytest

from hami_runtime.tools import metrics
from tests.engines import layout
from tests.engines.conftest import (IMAGE, MiB, PROBE, VENV_BIN, Daemon, filled_to_the_limit, make_hami,
                                    need, run, wait_for)

pytestmark = pytest.mark.timeout(600)


class Podman:
    def __init__(self, binary, root, env):
        self.binary, self.root, self.env = binary, root, env

    def __call__(self, *args, timeout=120, check=False):
        return run([self.binary, "--root", self.root / "storage", "--runroot", self.root / "run",
                    "--tmpdir", self.root / "tmp", *args], timeout=timeout, check=check, env=self.env)

    def gpu_run(self, *args, **kwargs):
        return self("run", "--runtime", "hami", "--network", "none", *args, **kwargs)


@pytest.fixture(scope="module")
def podman(engines_installed, hami, probe_image, tmp_path_factory):
    binary = need("podman", engines_installed)
    root = tmp_path_factory.mktemp("podman")
    conf = hami.render("podman/containers.conf", root / "containers.conf")
    storage = root / "storage.conf"
    storage.write_text(f'[storage]\ndriver = "overlay"\nrunroot = "{root / "run"}"\n'
                       f'graphroot = "{root / "storage"}"\n')
    env = dict(os.environ, CONTAINERS_CONF=str(conf), CONTAINERS_STORAGE_CONF=str(storage))
    engine = Podman(binary, root, env)
    # podman has no daemon; Daemon is used for its cleanup of what conmon leaves.
    leftovers = Daemon("podman", root, [])
    try:
        engine("import", probe_image / "rootfs.tar", IMAGE, check=True)
        yield engine
    finally:
        engine("rm", "--all", "--force", "--time", "0", timeout=120)
        leftovers.stop()


def test_annotation_limits_are_inside(podman, hami):
    result = podman.gpu_run("--rm", "--annotation", "hami.io/gpumem=1024", IMAGE, "/bin/sh", "-c",
                            f"env; {PROBE} fill")
    assert result.returncode == 0, result.stderr
    assert "CUDA_DEVICE_MEMORY_LIMIT_0=1024m" in result.stdout
    assert "total 1024 MiB" in result.stdout
    filled_to_the_limit(result.stdout, 1024)
    hami.assert_nothing_allocated()


def test_rm_releases_the_allocation(podman, hami):
    name = "hami-podman-rm"
    result = podman.gpu_run("-d", "--name", name, "--annotation", "hami.io/gpumem=2048",
                            "--annotation", "hami.io/gpucores=30", IMAGE, "sleep", "60")
    assert result.returncode == 0, result.stderr
    cid = result.stdout.strip()
    allocation = hami.allocations()[cid]
    assert [(d["mem_mib"], d["cores"]) for d in allocation["devices"]] == [(2048, 30)]
    assert hami.region_dirs() == [cid]
    podman("rm", "--force", "--time", "0", name, check=True)
    wait_for(lambda: hami.allocations() == {}, 10, "the allocation to be released")
    hami.assert_nothing_allocated()


def test_bad_request_shows_our_message(podman, hami):
    result = podman.gpu_run("--rm", "--annotation", "hami.io/gpumem=banana", IMAGE, "true")
    assert result.returncode != 0
    assert re.search(r"hami\.io/gpumem.*banana", result.stderr), result.stderr
    hami.assert_nothing_allocated()


def test_live_view_sees_the_container(podman, hami):
    """hamictl top and the metrics endpoint, on the host, see a running container's use."""
    name = "hami-podman-top"
    result = podman.gpu_run("-d", "--name", name, "--annotation", "hami.io/gpumem=1024",
                            "--annotation", "hami.io/gpucores=50", IMAGE, PROBE, "hold", "300", "60")
    assert result.returncode == 0, result.stderr
    cid = result.stdout.strip()
    try:
        wait_for(lambda: "holding 300 MiB" in podman("logs", name).stdout, 30, "the probe to allocate")
        top = run([VENV_BIN / "hamictl", "--config", hami.config, "top", "--json",
                   "--interval", "0.2"], check=True)
        view = next(c for c in json.loads(top.stdout)["containers"] if c["id"] == cid)
        device = view["devices"][0]
        assert (device["mem_limit_bytes"], device["sm_limit_pct"]) == (1024 * MiB, 50)
        [proc] = view["processes"]
        assert proc["mem_used_bytes"][0] - proc["ctx_used_bytes"][0] == 300 * MiB
        assert device["mem_used_bytes"] == proc["mem_used_bytes"][0]
        server, thread = metrics.serve(str(hami.state_dir), "127.0.0.1", 0)
        try:
            url = f"http://127.0.0.1:{server.server_address[1]}/metrics"
            with urllib.request.urlopen(url, timeout=5) as response:
                text = response.read().decode()
        finally:
            server.shutdown()
            server.server_close()
            thread.join(timeout=5)
        line = next(l for l in text.splitlines()
                    if l.startswith("hami_container_memory_used_bytes{") and cid in l)
        assert float(line.rsplit(" ", 1)[1]) == device["mem_used_bytes"]
    finally:
        podman("rm", "--force", "--time", "0", name, check=True)
    wait_for(lambda: hami.allocations() == {}, 10, "the allocation to be released")
    hami.assert_nothing_allocated()
    hami.driver_let_go()  # the tests that fill a slice come next


def test_mig_instances_by_env_and_cdi_annotation(podman, tmp_path):
    """A node whose GPU 1 is in MIG mode (its own runtime config, given by path): an
    instance named in the env or by a device plugin's CDI annotation gets its GPU's
    node and its nvidia-caps nodes, whole; the GPU itself is not given."""
    mig = make_hami(tmp_path, mig="1:4096,1:8192")
    found = {row["name"]: row for row in mig.devices()}
    listing = "ls /dev | grep -E '^nvidia([0-9]+|ctl)$'; ls /dev/nvidia-caps | wc -l"
    for asked in (["--env", "NVIDIA_VISIBLE_DEVICES=1:0"],
                  ["--annotation", f"cdi.k8s.io/nvidia-device-plugin_uuid=nvidia.com/gpu={found['1:1']['uuid']}"]):
        result = podman("run", "--rm", "--runtime", mig.wrapper, "--network", "none", *asked, IMAGE,
                        "/bin/sh", "-c", listing)
        assert result.returncode == 0, result.stderr
        assert result.stdout.split() == ["nvidia1", "nvidiactl", "2"], result.stdout
    log = mig.log.read_text()
    assert "allocated GPU 1:0 4096MiB 0%" in log and "allocated GPU 1:1 8192MiB 0%" in log
    refused = podman("run", "--rm", "--runtime", mig.wrapper, "--network", "none", "--env",
                     "NVIDIA_VISIBLE_DEVICES=1", IMAGE, "true")
    assert refused.returncode != 0 and "GPU 1 is in MIG mode: name one of its MIG instances (1:0, 1:1)" in \
        refused.stderr, refused.stderr
    mig.assert_nothing_allocated()


def test_the_image_as_under_runc_and_the_slice_held(podman, hami):
    """The image's /etc as podman made it, a user added; renaming /etc, /.hami or the
    preload and chroot are refused, and the slice holds (tests/engines/layout.py)."""
    gpu = podman.gpu_run("--rm", "--annotation", "hami.io/gpumem=1024", IMAGE, "/bin/sh", "-c", layout.SCRIPT)
    plain = podman.gpu_run("--rm", IMAGE, "/bin/sh", "-c", layout.IMAGE_WORK)
    layout.check(gpu, plain)
    hami.assert_nothing_allocated()


def test_a_read_only_root_stays_read_only(podman, hami):
    """--read-only: /etc as read-only as without a GPU (its /etc/hosts as podman
    mounts it), and still not renamed; the slice holds."""
    script = "touch /etc/x; echo '10.1.1.1 db' >> /etc/hosts && echo HOSTS-WRITTEN; mv /etc /e; true"
    gpu = podman.gpu_run("--rm", "--read-only", "--annotation", "hami.io/gpumem=1024", IMAGE, "/bin/sh", "-c",
                         f"{script}; {PROBE} fill")
    plain = podman.gpu_run("--rm", "--read-only", IMAGE, "/bin/sh", "-c", script)
    assert gpu.returncode == 0 and plain.returncode == 0, gpu.stderr + plain.stderr
    assert gpu.stderr == plain.stderr and "touch: /etc/x: Read-only file system" in gpu.stderr, gpu.stderr
    assert "mv: can't rename '/etc': Read-only file system" in gpu.stderr.splitlines()
    assert ("HOSTS-WRITTEN" in gpu.stdout) == ("HOSTS-WRITTEN" in plain.stdout)
    filled_to_the_limit(gpu.stdout, 1024)
    hami.assert_nothing_allocated()
