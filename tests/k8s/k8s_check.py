"""make k8s-check's second half (after pytest tests/k8s): the DaemonSet's image,
as make k8s-image packs it, imported and run for real.

  k8s_check.py --image build/k8s/hami-runtime-node-<version>.oci.tar

1. podman load -i (a temp storage: the host's podman store is not touched),
   then the image removed;
2. containerd (its own root, state and socket in a temp dir) imports it with
   ctr images import into a temp namespace;
3. the image's init-container command (deploy/40-daemonset.yaml's, less the
   engine restart and the node label: no systemd or API server here) run as a
   real container by that containerd (ctr run, no network: make install works
   offline) against a host root in a temp dir holding `containerd config
   default`; the drop-in and the imports line it wrote checked;
4. a second containerd started on the config it wrote (root, state, sockets and
   the conf.d import moved into the temp dir, nothing else changed): its merged
   config has the hami handler, its CRI plugin loaded; then, on such a
   containerd, pods through CRI by the hami handler on the simulated GPU (the
   ConfigMap's config names it): a pod that asks for a slice by annotations and
   a container given the device plugin's Allocate answer (cri_check.py);
5. uninstall by the same image: config.toml byte-identical, the host root as
   before.
Everything it made is removed; its last line says what it checked.

podman run is not used: on this machine runc cannot apply the rlimits podman
always sets (no CAP_SYS_RESOURCE); containerd's ctr run sets none.
"""
from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT / "packaging"), str(ROOT)]
import node_engines as engines  # noqa: E402
from tests.k8s import cri_check  # noqa: E402
from tests.k8s.host_root import snapshot  # noqa: E402

CRI = engines.CRI
NAMESPACE = "hami-k8s-check"
DAEMONSET = ROOT / "deploy" / "40-daemonset.yaml"


def say(msg: str) -> None:
    print(f"k8s-check: {msg}", flush=True)


def run(argv, timeout=600, check=True, **kw):
    proc = subprocess.run([str(a) for a in argv], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True, timeout=timeout, **kw)
    if check and proc.returncode != 0:
        raise SystemExit(f"k8s-check: {' '.join(map(str, argv))} failed ({proc.returncode}):\n"
                         f"{proc.stdout[-4000:]}")
    return proc


class Containerd:
    def __init__(self, root: Path, config_text: str, wrap=(), env=None):
        self.root = root
        self.wrap, self.env = list(wrap), env  # a command containerd runs under, its env
        self.socket = root / "containerd.sock"
        self.config = root / "config.toml"
        self.config.write_text(config_text)
        self.log = root / "containerd.log"
        self.proc = None

    @staticmethod
    def minimal(root: Path) -> str:
        return (f'version = 2\nroot = "{root / "root"}"\nstate = "{root / "state"}"\n'
                f'[grpc]\n  address = "{root / "containerd.sock"}"\n'
                f'[ttrpc]\n  address = "{root / "containerd.sock"}.ttrpc"\n'
                '[debug]\n  address = ""\n[metrics]\n  address = ""\n')

    def ctr(self, *args, **kw):
        return run(["ctr", "--address", self.socket, *args], **kw)

    def __enter__(self):
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen([*self.wrap, "containerd", "--config", self.config], stdout=log,
                                         stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         start_new_session=True, env=self.env)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise SystemExit(f"k8s-check: containerd exited:\n{self.log.read_text()[-3000:]}")
            if self.socket.exists() and self.ctr("version", check=False, timeout=10).returncode == 0:
                return self
            time.sleep(0.2)
        raise SystemExit("k8s-check: containerd did not answer in 60s")

    def __exit__(self, *exc):
        for ns in (NAMESPACE, cri_check.K8S_NS):  # the CRI's namespace, where its cleanup failed
            for cid in self.ctr("-n", ns, "containers", "list", "-q", check=False).stdout.split():
                self.ctr("-n", ns, "tasks", "kill", "-s", "SIGKILL", cid, check=False)
                self.ctr("-n", ns, "tasks", "delete", "-f", cid, check=False)
                self.ctr("-n", ns, "containers", "delete", cid, check=False)
            for ref in self.ctr("-n", ns, "images", "list", "-q", check=False).stdout.split():
                self.ctr("-n", ns, "images", "remove", "--sync", ref, check=False)
            self.ctr("namespaces", "remove", ns, check=False)
        os.killpg(self.proc.pid, 15)
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, 9)
            self.proc.wait()
        # shims left (their own sessions) of a failed run: by the socket they serve
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                if f"-address {self.socket} " in Path(f"/proc/{pid}/cmdline").read_text().replace("\0", " "):
                    os.kill(int(pid), 9)
            except OSError:
                pass
        # shims and mounts of the tasks are gone with the tasks; unmount what is left
        for line in reversed(Path("/proc/self/mounts").read_text().splitlines()):
            point = line.split()[1]
            if point.startswith(str(self.root)):
                subprocess.run(["umount", "-l", point], check=False)


def installer_args() -> list[str]:
    """The init container's command from deploy/, as it runs here."""
    text = DAEMONSET.read_text()
    block = text.split("initContainers:", 1)[1].split("env:", 1)[0]
    argv = re.findall(r"^\s+- (\S+)$", block.split("command:", 1)[1], re.M)
    assert argv[:2] == ["python3", "/opt/hami-runtime/packaging/node_installer.py"], argv
    keep = [a for a in argv if a not in ("--restart-engine",) and not a.startswith("--node-name")]
    return [a.replace("$(HAMI_ENGINE)", "containerd") for a in keep]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="k8s_check.py")
    parser.add_argument("--image", required=True)
    args = parser.parse_args(argv)
    image = Path(args.image).resolve()
    for tool in ("podman", "containerd", "ctr"):
        if not shutil.which(tool):
            raise SystemExit(f"k8s-check: {tool} not found")
    checked = []
    tmp = Path(tempfile.mkdtemp(prefix="hami-k8s-check."))
    try:
        # 1. podman
        store = tmp / "podman"
        podman = ["podman", "--root", store / "root", "--runroot", store / "run", "--storage-driver", "vfs",
                  "--events-backend", "file"]
        start = time.monotonic()
        loaded = run([*podman, "load", "-i", image]).stdout
        name = re.search(r"Loaded image(?:\(s\))?: (\S+)", loaded).group(1)
        size = run([*podman, "image", "inspect", "--format", "{{.Size}}", name]).stdout.strip()
        run([*podman, "rmi", name])
        say(f"podman load: {name}, {int(size) / 2**20:.0f} MiB, {time.monotonic() - start:.1f}s; removed")
        checked.append("podman load")
        run([*podman, "system", "reset", "--force"], check=False)
        # 2. containerd import
        engine_dir = tmp / "containerd"
        engine_dir.mkdir()
        with Containerd(engine_dir, Containerd.minimal(engine_dir)) as engine:
            start = time.monotonic()
            out = engine.ctr("-n", NAMESPACE, "images", "import", image).stdout
            ref = re.search(r"unpacking (\S+)", out).group(1)
            say(f"ctr images import: {ref}, {time.monotonic() - start:.1f}s")
            checked.append("ctr images import")
            # 3. the installer, a real container, against a host root
            host = tmp / "host"
            (host / "etc" / "containerd").mkdir(parents=True)
            default = run(["containerd", "config", "default"]).stdout
            original = default.replace("SystemdCgroup = false", "SystemdCgroup = true").encode()
            (host / "etc" / "containerd" / "config.toml").write_bytes(original)
            (host / "usr" / "local").mkdir(parents=True)
            python = os.path.realpath("/usr/bin/python3")  # the image's is the same release's
            (host / python.lstrip("/")).parent.mkdir(parents=True)
            (host / python.lstrip("/")).symlink_to(python)
            node_config = tmp / "hami-node"
            node_config.mkdir()
            (node_config / "config.toml").write_text("# the ConfigMap's config.toml\n" + cri_check.node_config(tmp))
            before = snapshot(host)

            def in_image(cid, *cmd):
                return engine.ctr("-n", NAMESPACE, "run", "--rm",
                                  "--mount", f"type=bind,src={host},dst=/host,options=rbind:rw",
                                  "--mount", f"type=bind,src={node_config},dst=/etc/hami-node,options=rbind:ro",
                                  ref, cid, *cmd, check=False)
            start = time.monotonic()
            up = in_image("hami-k8s-check-make-q", "make", "-q", "-C", "/opt/hami-runtime", "build")
            if up.returncode != 0:
                raise SystemExit(f"k8s-check: the image's tree is not up to date for make ({up.returncode})")
            command = installer_args()
            proc = in_image("hami-k8s-check-install", *command)
            if proc.returncode != 0:
                raise SystemExit(f"k8s-check: install in the image failed:\n{proc.stdout[-4000:]}")
            say(f"install in the image ({' '.join(command[2:])}): {time.monotonic() - start:.0f}s")
            for line in proc.stdout.splitlines():
                if line.startswith("node:"):
                    say(f"  {line}")
            config = (host / "etc/containerd/config.toml").read_text()
            assert engines.CONTAINERD_IMPORT in tomllib.loads(config)["imports"], config[:300]
            dropin = tomllib.loads((host / engines.CONTAINERD_DROPIN.lstrip("/")).read_text())
            hami = dropin["plugins"][CRI]["containerd"]["runtimes"]["hami"]
            binary = hami["options"]["BinaryName"]
            assert binary == "/usr/local/hami/bin/hami-runtime", hami
            assert os.access(host / "usr/local/hami/current/bin/hami-runtime", os.X_OK)
            assert (host / "usr/local/hami/etc/hami/config.toml").read_text().startswith("# the ConfigMap")
            say(f"drop-in {engines.CONTAINERD_DROPIN}: runtimes.hami BinaryName={binary}; "
                f"imports line added to config.toml")
            checked.append("install by the image (drop-in, imports, tree)")
            # 4. containerd on the config written
            def moved(node_dir):
                node_dir.mkdir()
                text = config
                for old, new in ((f'"{engines.CONTAINERD_IMPORT}"', f'"{host}{engines.CONTAINERD_IMPORT}"'),
                                 ('root = "/var/lib/containerd"', f'root = "{node_dir / "root"}"'),
                                 ('state = "/run/containerd"', f'state = "{node_dir / "state"}"'),
                                 ('address = "/run/containerd/containerd.sock"',
                                  f'address = "{node_dir / "containerd.sock"}"')):
                    assert text.count(old) == 1, old
                    text = text.replace(old, new)
                return text
            node_dir = tmp / "node-containerd"
            with Containerd(node_dir, moved(node_dir)) as node:
                merged = tomllib.loads(run(["containerd", "--config", node.config, "config", "dump"]).stdout)
                runtimes = merged["plugins"][CRI]["containerd"]["runtimes"]
                assert runtimes["hami"]["options"]["BinaryName"] == binary, runtimes["hami"]
                assert runtimes["runc"]["options"]["SystemdCgroup"] is True
                plugins = node.ctr("plugins", "ls").stdout
                cri = [line for line in plugins.splitlines() if "io.containerd.grpc.v1" in line
                       and " cri " in f" {line.split()[1]} "]
                assert cri and cri[0].split()[-1] == "ok", plugins
                say(f"containerd on the written config: handlers {sorted(runtimes)}, CRI plugin ok")
                checked.append("containerd started on it has the hami handler")
            # ... and pods through its CRI (on copies that run here: cgroupfs, a local sandbox image)
            dropin_text = (host / engines.CONTAINERD_DROPIN.lstrip("/")).read_text()
            checked += cri_check.check(Containerd, tmp / "node-cri", moved(tmp / "node-cri"), dropin_text,
                                       host, tmp, f"{host}{engines.CONTAINERD_IMPORT}")
            # 5. uninstall by the image
            proc = in_image("hami-k8s-check-uninstall", "python3", "/opt/hami-runtime/packaging/node_installer.py",
                            "uninstall", "--host-root=/host", "--prefix=/usr/local/hami")
            if proc.returncode != 0:
                raise SystemExit(f"k8s-check: uninstall in the image failed:\n{proc.stdout[-4000:]}")
            assert (host / "etc/containerd/config.toml").read_bytes() == original
            after = snapshot(host)
            diff = sorted(k for k in set(before) | set(after) if before.get(k, 0) != after.get(k, 0))
            assert not [d for d in diff if not d.startswith("run")], diff
            say("uninstall in the image: config.toml byte-identical, the host root as before"
                + (f" (left: {', '.join(diff)})" if diff else ""))
            checked.append("uninstall by the image (config.toml byte-identical)")
    finally:
        subprocess.run(["rm", "-rf", "--one-file-system", str(tmp)], check=False)
    say("checked " + "; ".join(checked) + f" — image {image.name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
