"""k8s_check.py's step 4, through CRI: pods on the containerd started on the
config the DaemonSet image wrote, run by its hami handler on the simulated GPU.

- two tiny images built here (busybox and glibc; no registry) and imported
  with ctr into k8s.io: one the CRI sandbox image, one for the GPU containers;
- a pod (host network: no CNI) whose annotations ask hami.io/gpumem=1000,
  hami.io/gpucores=30: its container's nvidia-smi must show 1000 MiB, its env
  the SM limit 30, in the container's CRI log;
- a pod whose container's env and annotations are what `hamictl device-plugin`
  answered to a stand-in kubelet's Allocate (a vGPU slot and 4 memory blocks):
  its nvidia-smi must show that many MiB;
- containers, sandboxes and images removed through CRI, then nothing left: no
  container, snapshot or image in k8s.io, no shim, no process in containerd's
  mount namespace (so none of its mounts), no file on the host outside the
  temp dir.

containerd runs in a mount namespace of its own (unshare) where tmpfs copies
of /usr/local, /run, /var/lib and /var/cache hold their entries bound back plus
what only this node has: /usr/local/hami is the temp host root's (the handler's
BinaryName and the tree were built for that path), and the runtime's
/run/hami, /var/lib/hami and /var/cache/hami, and the shims' /run/containerd,
live and die with that namespace.

It starts containerd on a copy of the written config whose imports read a copy
of the drop-in: there runc's SystemdCgroup is false (no systemd here),
restrict_oom_score_adj is true (no CAP_SYS_RESOURCE here for the sandbox's
-998) and the sandbox image is the one built here; the files the installer
wrote are not changed.

  cri_check.py shadow SPEC -- COMMAND...   (run by unshare: the mounts, then COMMAND)
"""
from __future__ import annotations

import importlib.util
import io
import json
import os
import queue
import re
import subprocess
import sys
import tarfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SIM = ROOT / "build" / "sim"
K8S_NS = "k8s.io"
PAUSE_REF = "docker.io/hami-k8s-check/pause:1"
GPU_REF = "docker.io/hami-k8s-check/gpu:1"
WAIT = 60
GPUMEM, GPUCORES = 1000, 30
BLOCK_MIB, BLOCKS = 256, 4
SMI = "nvidia-smi --query-gpu=index,memory.total --format=csv,noheader; env | grep '^CUDA_DEVICE_SM_LIMIT='; true"


def say(msg: str) -> None:
    print(f"k8s-check: {msg}", flush=True)


# ---- the node config (the ConfigMap's) on the simulated GPU

def node_config(tmp: Path) -> str:
    """The config the ConfigMap carries: the simulated driver root (a copy in
    tmp, as make install SIM=1 makes one), its state shared with the containers,
    the runtime's state in tmp."""
    import install_sim  # packaging/ is on the path: k8s_check.py
    sim = tmp / "sim"
    install_sim.copy_driver(SIM, sim)
    (sim / "shared").mkdir()
    return (f'state_dir = "{tmp / "hami-state"}"\n'
            + install_sim.driver_keys(sim)
            + "split_count = 10\n"
            "\n[extra_env]\n"
            'HAMI_SIM_STATE = "/run/hami-sim/gpu.state"\n'
            "\n[[extra_mounts]]\n"
            f'source = "{sim}/shared"\n'
            'destination = "/run/hami-sim"\n')


def sim_env(tmp: Path) -> dict:
    """The simulated driver's state for host processes (the runtime, the plugin)."""
    return {**os.environ, "HAMI_SIM_STATE": str(tmp / "sim" / "shared" / "gpu.state")}


# ---- images, written as image archives with no registry

def _rootfs_tar() -> bytes:
    """busybox, its applets used here and glibc (for the driver's nvidia-smi)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        def entry(name, kind=tarfile.DIRTYPE, mode=0o755, data=b"", link=""):
            info = tarfile.TarInfo(name)
            info.type, info.mode, info.mtime, info.linkname = kind, mode, 0, link
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data) if kind == tarfile.REGTYPE else None)
        for d in ("bin", "dev", "etc", "lib", "lib64", "lib/x86_64-linux-gnu", "proc", "sys", "run"):
            entry(d)
        entry("tmp", mode=0o1777)
        entry("bin/busybox", tarfile.REGTYPE, data=Path("/bin/busybox").read_bytes())
        for applet in ("sh", "sleep", "env", "grep", "cat", "true"):
            entry(f"bin/{applet}", tarfile.SYMTYPE, link="busybox")
        for lib in ("/lib/x86_64-linux-gnu/libc.so.6", "/lib64/ld-linux-x86-64.so.2"):
            entry(lib.lstrip("/"), tarfile.REGTYPE, data=Path(os.path.realpath(lib)).read_bytes())
    return buf.getvalue()


def write_image(path: Path, ref: str, layer: bytes, cmd: tuple) -> None:
    """An image archive of one layer that ctr images import names `ref` (the probe image's
    writer, scripts/probe/build_image.py)."""
    layer_tar = path.with_suffix(".layer.tar")
    layer_tar.write_bytes(layer)
    build_image().write_docker_archive(layer_tar, path, tag=ref, cmd=cmd)
    layer_tar.unlink()


def build_image():
    spec = importlib.util.spec_from_file_location("build_image", ROOT / "scripts" / "probe" / "build_image.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# ---- the mount namespace containerd runs in

def shadow_spec(tmp: Path, host: Path) -> dict:
    return {"keep": str(tmp / "ns-keep"),
            "dirs": {"/usr/local": {"hami": str(host / "usr/local/hami")},
                     "/run": {"hami": None, "containerd": None},
                     "/var/lib": {"hami": None}, "/var/cache": {"hami": None}}}


def added_paths(spec: dict) -> list:
    return [f"{directory}/{name}" for directory, added in spec["dirs"].items() for name in added]


def _mount(*args) -> None:
    subprocess.run(["mount", "-n", *args], check=True)  # -n: no utab written under the new /run


def shadow(spec: dict) -> None:
    """(in the new mount namespace) each dir a tmpfs holding its entries, bound
    back from a bind of the original kept aside, and the added ones."""
    for n, (directory, added) in enumerate(spec["dirs"].items()):
        keep = os.path.join(spec["keep"], str(n))
        os.makedirs(keep)
        _mount("--rbind", directory, keep)
        _mount("-t", "tmpfs", "-o", "mode=0755", "tmpfs", directory)
        for name in os.listdir(keep):
            if name in added:
                continue
            src, dst = os.path.join(keep, name), os.path.join(directory, name)
            if os.path.islink(src):
                os.symlink(os.readlink(src), dst)
                continue
            if os.path.isdir(src):
                os.makedirs(dst, exist_ok=True)
            elif not os.path.exists(dst):
                open(dst, "w").close()
            _mount("--rbind", src, dst)
        for name, src in added.items():
            os.mkdir(os.path.join(directory, name), 0o755)
            if src:
                _mount("--rbind", src, os.path.join(directory, name))


def namespaced(spec: dict) -> list:
    """The argv prefix that runs a command in its own mount namespace, shadowed."""
    return ["unshare", "--mount", "--propagation", "private", sys.executable, __file__, "shadow",
            json.dumps(spec), "--"]


def run_config(text: str, dropin: str, node_dir: Path, host_import: str) -> str:
    """The copies containerd starts on: the main config importing node_dir's
    conf.d, the drop-in with cgroupfs for runc, the sandbox image built here and
    oom_score_adj kept within what this process may set."""
    conf_d = node_dir / "conf.d"
    assert text.count(f'"{host_import}"') == 1, host_import
    main = text.replace(f'"{host_import}"', f'"{conf_d}/*.toml"')
    assert dropin.count("SystemdCgroup = true") >= 1 and dropin.count("sandbox_image = ") == 1
    copy = dropin.replace("SystemdCgroup = true", "SystemdCgroup = false")
    copy = re.sub(r'sandbox_image = "[^"]*"', f'sandbox_image = "{PAUSE_REF}"', copy)
    # no CAP_SYS_RESOURCE here: the sandbox's oom_score_adj (-998) could not be set
    assert copy.count("restrict_oom_score_adj = false") == 1
    copy = copy.replace("restrict_oom_score_adj = false", "restrict_oom_score_adj = true")
    conf_d.mkdir()
    (conf_d / "hami.toml").write_text(copy)
    return main


# ---- CRI

class Cri:
    """The kubelet's side: the engine tests' CRI client, and what it made here."""

    def __init__(self, socket: Path, tmp: Path):
        from tests.engines.cri import client as cri_client  # ROOT is on the path: k8s_check.py
        out = tmp / "cri-proto"
        out.mkdir()
        self.service = cri_client.RuntimeService(socket, cri_client.compile_messages(out), timeout=WAIT)
        self.pb = self.service.messages
        self.call = self.service.call
        self.logs = tmp / "pods"
        self.sandboxes, self.containers = [], []

    def sandbox(self, name: str, annotations: dict):
        pb = self.pb
        logs = self.logs / name
        logs.mkdir(parents=True)
        config = pb.PodSandboxConfig(
            metadata=pb.PodSandboxMetadata(name=name, uid=f"uid-{name}", namespace="default"),
            log_directory=str(logs), annotations=annotations,  # no hostname: the host's UTS namespace
            linux=pb.LinuxPodSandboxConfig(security_context=pb.LinuxSandboxSecurityContext(
                namespace_options=pb.NamespaceOption(network=pb.NODE))))
        sid = self.call("RunPodSandbox", config=config, runtime_handler="hami").pod_sandbox_id
        self.sandboxes.append(sid)
        return sid, config

    def run(self, sandbox, name: str, env: dict, annotations: dict) -> str:
        """A container of `sandbox` that runs SMI to its end: its CRI log."""
        sid, sandbox_config = sandbox
        pb = self.pb
        config = pb.ContainerConfig(
            metadata=pb.ContainerMetadata(name=name), image=pb.ImageSpec(image=GPU_REF),
            command=["sh", "-c", SMI], envs=[pb.KeyValue(key=k, value=v) for k, v in env.items()],
            annotations=annotations, log_path=f"{name}.log")
        cid = self.call("CreateContainer", pod_sandbox_id=sid, config=config,
                        sandbox_config=sandbox_config).container_id
        self.containers.append(cid)
        self.call("StartContainer", container_id=cid)
        deadline = time.monotonic() + WAIT
        while True:
            status = self.call("ContainerStatus", container_id=cid).status
            if status.state == pb.CONTAINER_EXITED:
                break
            assert time.monotonic() < deadline, f"container {name} still {status.state} after {WAIT}s"
            time.sleep(0.2)
        log = Path(status.log_path).read_text()
        assert status.exit_code == 0, (status.exit_code, status.reason, status.message, log)
        # CRI log lines: <time> <stream> <tag> <text>
        return "\n".join(line.split(" ", 3)[3] for line in log.splitlines() if line.count(" ") >= 3)

    def remove_all(self) -> None:
        for cid in self.containers:
            self.call("StopContainer", container_id=cid, timeout=10)
            self.call("RemoveContainer", container_id=cid)
        self.containers.clear()
        for sid in self.sandboxes:
            self.call("StopPodSandbox", pod_sandbox_id=sid)
            self.call("RemovePodSandbox", pod_sandbox_id=sid)
        self.sandboxes.clear()
        for ref in (GPU_REF, PAUSE_REF):
            self.call("RemoveImage", service="ImageService", image=self.pb.ImageSpec(image=ref))

    def close(self) -> None:
        self.service.close()


# ---- the device plugin's Allocate, as the kubelet gets it

HAMICTL = [sys.executable, "-c", "import sys; from hami_runtime.tools.hamictl import main; sys.exit(main())"]


def device_plugin_allocation(tmp: Path, config: Path) -> tuple[dict, dict, str]:
    """`hamictl device-plugin` against the stand-in kubelet: one hami.io/vgpu slot
    and BLOCKS hami.io/vgpu-memory blocks of one GPU allocated. (env, annotations, uuid)."""
    from tests.k8s.kubelet import Kubelet  # ROOT is on the path: k8s_check.py
    directory = tmp / "device-plugins"
    directory.mkdir()
    kubelet = Kubelet(directory)
    kubelet.start()
    log = tmp / "device-plugin.log"
    with open(log, "wb") as out:
        plugin = subprocess.Popen([*HAMICTL, "--config", str(config), "device-plugin", "--plugin-dir",
                                   str(directory), "--memory-block", str(BLOCK_MIB)],
                                  cwd=ROOT, env=sim_env(tmp), stdin=subprocess.DEVNULL, stdout=out,
                                  stderr=subprocess.STDOUT)
    try:
        try:
            registered = kubelet.registrations()
        except queue.Empty:
            raise SystemExit(f"k8s-check: the device plugin did not register:\n{log.read_text()[-3000:]}")
        slots, memory = registered["hami.io/vgpu"], registered["hami.io/vgpu-memory"]
        slot = next(iter(kubelet.listing(slots)))
        uuid = slot.rsplit("-", 1)[0]
        blocks = [d for d in kubelet.listing(memory) if d.startswith(f"{uuid}-mem-")][:BLOCKS]
        answers = [kubelet.allocate(slots, [slot]), kubelet.allocate(memory, blocks)]
    finally:
        plugin.terminate()
        try:
            plugin.wait(timeout=WAIT)
        except subprocess.TimeoutExpired:
            plugin.kill()
            plugin.wait()
        kubelet.stop()
    env = {k: v for a in answers for k, v in a.envs.items()}
    annotations = {k: v for a in answers for k, v in a.annotations.items()}
    return env, annotations, uuid


# ---- the check

def gone(node, spec: dict, had: set, mnt_ns: str, before_mounts: str) -> list:
    """What is left of the pods after containerd stopped: one line each."""
    left = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if os.readlink(f"/proc/{pid}/ns/mnt") == mnt_ns:
                what = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                left.append(f"process {pid} in containerd's mount namespace: {what[:200]}")
            elif str(node.socket) in Path(f"/proc/{pid}/cmdline").read_text(errors="replace"):
                left.append(f"process {pid} for {node.socket}")
        except OSError:
            continue
    left += [f"{path} on the host" for path in added_paths(spec) if os.path.lexists(path) and path not in had]
    # mounts on the host under the temp dir or the paths only the node's namespace has
    # (others' mounts elsewhere on this machine are theirs)
    ours = [spec["keep"], str(node.root), *added_paths(spec)]
    new = set(Path("/proc/self/mounts").read_text().splitlines()) - set(before_mounts.splitlines())
    left += [f"mount {line.split()[1]} on the host" for line in new
             if any(line.split()[1] == p or line.split()[1].startswith(p + "/") for p in ours)]
    return left


def check(engine_cls, node_dir: Path, text: str, dropin: str, host: Path, tmp: Path, host_import: str):
    """Step 4's pods; returns the lines for the check's summary."""
    spec = shadow_spec(tmp, host)
    had = {path for path in added_paths(spec) if os.path.lexists(path)}  # the host's own (/run/containerd)
    main = run_config(text, dropin, node_dir, host_import)
    layer = _rootfs_tar()
    images = tmp / "images"
    images.mkdir()
    write_image(images / "pause.tar", PAUSE_REF, layer, ("/bin/sleep", "2147483647"))
    write_image(images / "gpu.tar", GPU_REF, layer, ("/bin/sh",))
    before_mounts = Path("/proc/self/mounts").read_text()
    config = host / "usr/local/hami/etc/hami/config.toml"  # the installed one: the ConfigMap's
    node = engine_cls(node_dir, main, wrap=namespaced(spec), env=sim_env(tmp))
    cri = None
    with node:
        mnt_ns = os.readlink(f"/proc/{node.proc.pid}/ns/mnt")
        deadline = time.monotonic() + 10
        # unshare execs the helper, which execs containerd: its namespace is the one to watch
        while mnt_ns == os.readlink("/proc/self/ns/mnt") and time.monotonic() < deadline:
            time.sleep(0.05)
            mnt_ns = os.readlink(f"/proc/{node.proc.pid}/ns/mnt")
        assert mnt_ns != os.readlink("/proc/self/ns/mnt")
        for archive in ("pause.tar", "gpu.tar"):
            node.ctr("-n", K8S_NS, "images", "import", images / archive)
        cri = Cri(node.socket, tmp)
        try:
            version = cri.call("Version", version="v1")
            start = time.monotonic()
            pod = cri.sandbox("gpu-pod", {"hami.io/gpumem": str(GPUMEM), "hami.io/gpucores": str(GPUCORES)})
            out = cri.run(pod, "gpu", {}, {})
            assert f"0, {GPUMEM} MiB" in out.splitlines(), out
            assert f"CUDA_DEVICE_SM_LIMIT={GPUCORES}" in out.splitlines(), out
            say(f"CRI ({version.runtime_name} {version.runtime_version}, {version.runtime_api_version}): "
                f"pod with hami.io/gpumem={GPUMEM}, gpucores={GPUCORES} by the hami handler: nvidia-smi "
                f"saw {GPUMEM} MiB, SM limit {GPUCORES} ({time.monotonic() - start:.1f}s)")
            env, annotations, uuid = device_plugin_allocation(tmp, config)
            mib = BLOCK_MIB * BLOCKS
            assert env == {"NVIDIA_VISIBLE_DEVICES": uuid, "HAMI_GPUMEM": str(mib)}, env
            start = time.monotonic()
            out = cri.run(cri.sandbox("dp-pod", {}), "dp", env, annotations)
            assert f"0, {mib} MiB" in out.splitlines(), out
            answer = ", ".join(f"{k}={v}" for k, v in env.items())
            say(f"CRI: container with the device plugin's Allocate answer ({answer}): "
                f"nvidia-smi saw {mib} MiB ({time.monotonic() - start:.1f}s)")
            cri.remove_all()
            for what in ("containers", "images", "snapshots"):
                listed = node.ctr("-n", K8S_NS, what, "ls").stdout.splitlines()[1:]  # under a header
                assert not listed, f"{what} left in {K8S_NS}: {listed}"
        finally:
            try:
                if cri.containers or cri.sandboxes:
                    cri.remove_all()
            except Exception as exc:  # the engine's own cleanup follows
                say(f"CRI cleanup: {exc}")
            cri.close()
    # the runtime's create server outlives containerd until it is idle, or until
    # its socket is gone (create_server.py): remove it, then a bounded wait
    (tmp / "hami-state" / "server" / "socket").unlink(missing_ok=True)
    deadline = time.monotonic() + 20
    while (left := gone(node, spec, had, mnt_ns, before_mounts)) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not left, left
    say("CRI: containers, sandboxes and images removed; no shim, mount or host file left")
    return [f"a pod sandbox and a GPU container through CRI by the hami handler ({GPUMEM} MiB seen)",
            f"a container with the device plugin's Allocate env through CRI ({mib} MiB seen)"]


def main(argv) -> int:
    if argv[:1] == ["shadow"] and argv[2:3] == ["--"]:
        shadow(json.loads(argv[1]))
        os.execvp(argv[3], argv[3:])
    raise SystemExit("usage: cri_check.py shadow SPEC -- COMMAND...")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
