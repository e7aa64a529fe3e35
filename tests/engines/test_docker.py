"""dockerd with examples/docker/daemon.json (install path aside): dockerd hands
no annotations to a runtime, so the request is in the env; and docker-compose
(through pytest-docker) runs examples/docker/docker-compose.yml as it is."""
import os
import re

import pytest
from pytest_docker.plugin import get_docker_services

from tests.conftest import ROOT
from tests.engines import layout
from tests.engines.conftest import IMAGE, PROBE, Daemon, filled_to_the_limit, need, run, wait_for

pytestmark = pytest.mark.timeout(600)
DOCKER = "/usr/bin/docker"  # the docker.io client, matching the daemon


class Docker:
    def __init__(self, socket):
        self.host = f"unix://{socket}"

    def __call__(self, *args, timeout=120, check=False):
        return run([DOCKER, "-H", self.host, *args], timeout=timeout, check=check)

    def gpu_run(self, *args, **kwargs):
        return self("run", "--runtime", "hami", "--network", "none", *args, **kwargs)


@pytest.fixture(scope="module")
def docker(engines_installed, hami, probe_image, tmp_path_factory):
    dockerd = need("dockerd", engines_installed)
    need("docker", engines_installed)
    root = tmp_path_factory.mktemp("docker")
    config = hami.render("docker/daemon.json", root / "daemon.json")
    socket = root / "docker.sock"
    # make install's nvidia-container-runtime-hook on dockerd's PATH: --gpus is offered
    path = f"{ROOT / 'packaging' / 'bin'}:{os.environ['PATH']}"
    daemon = Daemon("dockerd", root, [
        dockerd, "--config-file", config, "--data-root", root / "data", "--exec-root",
        root / "exec", "--pidfile", root / "docker.pid", "--host", f"unix://{socket}",
        "--bridge", "none", "--iptables=false", "--ip-masq=false", "--ip6tables=false"],
        env={**os.environ, "PATH": path})
    engine = Docker(socket)
    daemon.start(lambda: socket.exists() and engine("version", timeout=10).returncode == 0,
                 timeout=90)
    try:
        engine("load", "--input", probe_image / "image.tar", check=True)
        yield engine
    finally:
        ids = engine("ps", "--all", "--quiet", timeout=30).stdout.split()
        if ids:
            engine("rm", "--force", *ids, timeout=120)
        daemon.stop()


def test_daemon_has_the_hami_runtime(docker, hami):
    runtimes = docker("info", "--format", "{{json .Runtimes}}", check=True).stdout
    assert f'"hami":{{"path":"{hami.wrapper}"}}' in runtimes.replace(" ", "")


def test_env_request_gives_the_limits(docker, hami):
    result = docker.gpu_run("--rm", "-e", "NVIDIA_VISIBLE_DEVICES=0", "-e", "HAMI_GPUMEM=1024",
                            IMAGE, "/bin/sh", "-c", f"env; {PROBE} fill")
    assert result.returncode == 0, result.stderr
    assert "CUDA_DEVICE_MEMORY_LIMIT_0=1024m" in result.stdout
    filled_to_the_limit(result.stdout, 1024)
    hami.assert_nothing_allocated()


def test_rm_releases_the_allocation(docker, hami):
    result = docker.gpu_run("-d", "-e", "NVIDIA_VISIBLE_DEVICES=0", "-e", "HAMI_GPUMEM=2048",
                            "-e", "HAMI_GPUCORES=25", IMAGE, "sleep", "60")
    assert result.returncode == 0, result.stderr
    cid = result.stdout.strip()
    assert [(d["mem_mib"], d["cores"]) for d in hami.allocations()[cid]["devices"]] == [(2048, 25)]
    docker("rm", "--force", cid, check=True)
    wait_for(lambda: hami.allocations() == {}, 10, "the allocation to be released")
    hami.assert_nothing_allocated()


def test_bad_request_shows_our_message(docker, hami):
    result = docker.gpu_run("--rm", "-e", "NVIDIA_VISIBLE_DEVICES=0", "-e", "HAMI_GPUMEM=banana",
                            IMAGE, "true")
    assert result.returncode != 0
    assert "OCI runtime create failed" in result.stderr
    assert re.search(r"HAMI_GPUMEM.*banana", result.stderr), result.stderr
    hami.assert_nothing_allocated()


def test_compose_example_through_pytest_docker(docker, hami):
    compose_file = ROOT / "examples" / "docker" / "docker-compose.yml"
    # pytest-docker drives docker-compose v1 against this test's own daemon.
    command = f"env DOCKER_HOST={docker.host} docker-compose"
    with get_docker_services(command, str(compose_file), "hamicompose", ["up -d"], ["down -v"]):
        cid = run(["env", f"DOCKER_HOST={docker.host}", "docker-compose", "-f", compose_file,
                   "-p", "hamicompose", "ps", "-q", "vgpu-probe"], check=True).stdout.strip()
        assert docker("wait", cid, timeout=120, check=True).stdout.strip() == "0"
        logs = docker("logs", cid, check=True).stdout
    assert "total 1024 MiB" in logs
    assert re.search(r"allocated \d+ MiB; the next 1 MiB was refused: CUDA_ERROR_OUT_OF_MEMORY",
                     logs), logs
    hami.assert_nothing_allocated()


@pytest.mark.parametrize("gpus,env,devices", [
    ("all", [], [(0, 1638), (1, 1638)]),                    # no size: the node's default slice
    ("1", ["-e", "HAMI_GPUMEM=1024"], [(0, 1024)]),
    ('"device=1"', ["-e", "HAMI_GPUMEM=2048", "-e", "HAMI_GPUCORES=30"], [(1, 2048)]),
    ("all,capabilities=utility", ["-e", "HAMI_GPUMEM=1024"], [(0, 1024), (1, 1024)]),
], ids=["all", "count", "device", "capabilities"])
def test_gpus_flag_is_served_by_the_runtime(docker, hami, gpus, env, devices):
    """dockerd writes --gpus as NVIDIA_VISIBLE_DEVICES (and NVIDIA_DRIVER_CAPABILITIES)
    and a prestart hook; the runtime serves the request and removes the hook (ours
    would refuse the container if it ran)."""
    result = docker.gpu_run("-d", "--gpus", gpus, *env, IMAGE, "sleep", "60")
    assert result.returncode == 0, result.stderr
    cid = result.stdout.strip()
    try:
        assert [(d["index"], d["mem_mib"]) for d in hami.allocations()[cid]["devices"]] == devices
        # the container's own env (docker exec's is docker's, not the spec's)
        seen = docker("exec", cid, "sh", "-c", "tr '\\0' '\\n' < /proc/1/environ", check=True).stdout
        assert f"CUDA_DEVICE_MEMORY_LIMIT_0={devices[0][1]}m" in seen
        if "capabilities" in gpus:
            assert "NVIDIA_DRIVER_CAPABILITIES=utility" in seen
    finally:
        docker("rm", "--force", cid, check=True)
    wait_for(lambda: hami.allocations() == {}, 10, "the allocation to be released")
    hami.assert_nothing_allocated()


def test_gpus_flag_under_runc_is_refused_by_our_hook(docker, hami):
    """Without --runtime hami, runc runs the hook dockerd wrote: ours refuses the
    container instead of letting it start without its GPUs."""
    result = docker("run", "--rm", "--network", "none", "--gpus", "all", IMAGE, "true")
    assert result.returncode != 0
    assert "this node's GPUs are served by hami-runtime: run the container with --runtime hami" \
        in result.stderr, result.stderr
    hami.assert_nothing_allocated()


def test_the_image_as_under_runc_and_the_slice_held(docker, hami):
    """The image's /etc as dockerd made it, a user added; renaming /etc, /.hami or the
    preload and chroot are refused, and the slice holds (tests/engines/layout.py)."""
    gpu = docker.gpu_run("--rm", "-e", "NVIDIA_VISIBLE_DEVICES=0", "-e", "HAMI_GPUMEM=1024", IMAGE,
                         "/bin/sh", "-c", layout.SCRIPT)
    plain = docker.gpu_run("--rm", IMAGE, "/bin/sh", "-c", layout.IMAGE_WORK)
    layout.check(gpu, plain)
    hami.assert_nothing_allocated()
