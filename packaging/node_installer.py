"""The node installer that deploy/'s DaemonSet runs: hami-runtime onto a host
mounted at --host-root, its handler registered with containerd or CRI-O.

  node_installer.py install   --host-root /host [--prefix /usr/local/hami] [--engine containerd|crio]
                              [--config FILE] [--version V] [--restart-engine] [--node-name N]
  node_installer.py upgrade   (as install; refused where nothing is installed)
  node_installer.py uninstall --host-root /host [--prefix ...] [--restart-engine] [--node-name N]

On the host (paths under --host-root):
  PREFIX/versions/<v>/  make install's tree (PREFIX=<that dir>, SYSCONFDIR=PREFIX/etc),
                        with its own Python environment; .complete once whole
  PREFIX/current        -> versions/<v>, switched by one rename (an upgrade)
  PREFIX/bin            -> current/bin: engines run PREFIX/bin/hami-runtime
  PREFIX/etc/hami/config.toml  the node config (--config: the ConfigMap's)
  PREFIX/state.json     what install changed outside PREFIX, for uninstall
  the engine's drop-in (node_engines.py) and, for containerd, its imports line

install on an installed node is an upgrade: a new version's tree beside the
old ones, then the switch; the engine config is not touched again, so the
engine is not restarted and running containers keep the files they started
with (the previous version's tree is kept for their hooks; older ones go).
uninstall puts the engine config back byte for byte, removes PREFIX and the
node's config cache, and leaves the allocations of running containers (the
runtime's state dir) alone, saying so.

Every host path is opened a directory at a time without following a link: a
symbolic link planted in the host root is refused, never followed.
"""
from __future__ import annotations

import argparse
import errno
import hashlib
import json
import os
import shutil
import ssl
import stat
import subprocess
import sys
import tomllib
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import node_engines as engines  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_PREFIX = "/usr/local/hami"
STATE_DIR = "/run/hami"  # config_cache.DEFAULT_STATE_DIR: the allocations
LABEL = "hami.io/runtime"
SERVICE_ACCOUNT = "/var/run/secrets/kubernetes.io/serviceaccount"
FLAGS = os.O_CLOEXEC | os.O_NOFOLLOW


class NodeError(Exception):
    def __init__(self, field, value, why):
        super().__init__(f"{field}={value!r}: {why}")


def project_version() -> str:
    for line in (ROOT / "pyproject.toml").read_text().splitlines():
        if line.startswith("version"):
            return line.split("=", 1)[1].strip().strip('"')
    raise NodeError("pyproject.toml", "version", "not found")


class Host:
    """The host's files under root, each reached a directory at a time, never
    through a symbolic link."""

    def __init__(self, root: str):
        self.root = os.path.abspath(root)
        if not os.path.isdir(self.root):
            raise NodeError("--host-root", root, "not a directory")
        self.made = []  # dirs this run made, host paths

    def path(self, host_path: str) -> str:
        return self.root + host_path if self.root != "/" else host_path

    def dir_fd(self, host_dir: str, create=False) -> int:
        fd = os.open(self.root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        walked = ""
        try:
            for name in [p for p in host_dir.split("/") if p]:
                walked += "/" + name
                try:
                    child = os.open(name, os.O_RDONLY | os.O_DIRECTORY | FLAGS, dir_fd=fd)
                except FileNotFoundError:
                    if not create:
                        raise
                    os.mkdir(name, 0o755, dir_fd=fd)
                    self.made.append(walked)
                    child = os.open(name, os.O_RDONLY | os.O_DIRECTORY | FLAGS, dir_fd=fd)
                except OSError as exc:
                    if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                        raise NodeError("host path", walked, "a symbolic link (or not a directory) in the "
                                        "host root: not followed") from None
                    raise
                os.close(fd)
                fd = child
            return fd
        except BaseException:
            os.close(fd)
            raise

    def read(self, host_path: str):
        """The file's bytes, or None where it (or its dir) is missing."""
        try:
            dfd = self.dir_fd(os.path.dirname(host_path))
        except FileNotFoundError:
            return None
        try:
            fd = os.open(os.path.basename(host_path), os.O_RDONLY | os.O_NONBLOCK | FLAGS, dir_fd=dfd)
        except FileNotFoundError:
            return None
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise NodeError("host path", host_path, "a symbolic link in the host root: not followed") \
                    from None
            raise
        finally:
            os.close(dfd)
        with os.fdopen(fd, "rb") as handle:
            if not stat.S_ISREG(os.fstat(handle.fileno()).st_mode):
                raise NodeError("host path", host_path, "not a regular file")
            return handle.read()

    def _kind(self, dfd: int, name: str):
        try:
            return stat.S_IFMT(os.stat(name, dir_fd=dfd, follow_symlinks=False).st_mode)
        except FileNotFoundError:
            return None

    def write(self, host_path: str, data: bytes, mode=0o644) -> None:
        """Atomically: a new file beside it, renamed over it."""
        dfd = self.dir_fd(os.path.dirname(host_path), create=True)
        name = os.path.basename(host_path)
        try:
            if self._kind(dfd, name) not in (None, stat.S_IFREG):
                raise NodeError("host path", host_path, "not a regular file (a symbolic link?): not replaced")
            tmp = f".{name}.hami-{os.getpid()}-{os.urandom(4).hex()}"
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | FLAGS, mode, dir_fd=dfd)
            try:
                with os.fdopen(fd, "wb") as handle:
                    handle.write(data)
                    handle.flush()
                    os.fchmod(handle.fileno(), mode)
                    os.fsync(handle.fileno())
                os.rename(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd)
            except BaseException:
                try:
                    os.unlink(tmp, dir_fd=dfd)
                except OSError:
                    pass
                raise
            os.fsync(dfd)
        finally:
            os.close(dfd)

    def keep_mode(self, host_path: str) -> int:
        """The mode of the file there (0o644 where none)."""
        try:
            dfd = self.dir_fd(os.path.dirname(host_path))
        except FileNotFoundError:
            return 0o644
        try:
            return stat.S_IMODE(os.stat(os.path.basename(host_path), dir_fd=dfd, follow_symlinks=False).st_mode)
        except FileNotFoundError:
            return 0o644
        finally:
            os.close(dfd)

    def link(self, host_path: str, target: str) -> None:
        """host_path -> target, switched by one rename."""
        dfd = self.dir_fd(os.path.dirname(host_path), create=True)
        name = os.path.basename(host_path)
        try:
            if self._kind(dfd, name) not in (None, stat.S_IFLNK):
                raise NodeError("host path", host_path, "not a symbolic link of ours: not replaced")
            tmp = f".{name}.hami-{os.getpid()}-{os.urandom(4).hex()}"
            os.symlink(target, tmp, dir_fd=dfd)
            os.rename(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd)
            os.fsync(dfd)
        finally:
            os.close(dfd)

    def readlink(self, host_path: str):
        try:
            dfd = self.dir_fd(os.path.dirname(host_path))
        except FileNotFoundError:
            return None
        try:
            return os.readlink(os.path.basename(host_path), dir_fd=dfd)
        except (FileNotFoundError, OSError):
            return None
        finally:
            os.close(dfd)

    def unlink(self, host_path: str) -> bool:
        try:
            dfd = self.dir_fd(os.path.dirname(host_path))
        except FileNotFoundError:
            return False
        try:
            os.unlink(os.path.basename(host_path), dir_fd=dfd)
            return True
        except FileNotFoundError:
            return False
        finally:
            os.close(dfd)

    def rmdir_empty(self, host_dir: str) -> None:
        try:
            dfd = self.dir_fd(os.path.dirname(host_dir))
        except FileNotFoundError:
            return
        try:
            os.rmdir(os.path.basename(host_dir), dir_fd=dfd)
        except OSError:
            pass  # not empty, or gone: left as it is
        finally:
            os.close(dfd)

    def rmtree(self, host_dir: str) -> None:
        """The tree, its top reached without a link (rmtree follows none below)."""
        try:
            os.close(self.dir_fd(host_dir))
        except FileNotFoundError:
            return
        shutil.rmtree(self.path(host_dir))


class Node:
    def __init__(self, host: Host, prefix: str):
        if not os.path.isabs(prefix) or any(c in prefix for c in " \"'\\\n"):
            raise NodeError("--prefix", prefix, "must be an absolute path of plain characters")
        self.host, self.prefix = host, os.path.normpath(prefix)
        self.state_path = f"{self.prefix}/state.json"
        self.binary = f"{self.prefix}/bin/hami-runtime"
        self.config = f"{self.prefix}/etc/hami/config.toml"

    def state(self):
        data = self.host.read(self.state_path)
        return None if data is None else json.loads(data)

    def save(self, state: dict) -> None:
        self.host.write(self.state_path, (json.dumps(state, indent=1, sort_keys=True) + "\n").encode())

    # the tree

    def install_tree(self, version: str, make_flags=(), python="python3") -> str:
        """versions/<version>, made by make install (or kept, where whole)."""
        if not version or "/" in version or version.startswith("."):
            raise NodeError("--version", version, "must be a plain name")
        vdir = f"{self.prefix}/versions/{version}"
        if self.host.read(f"{vdir}/.complete") is not None:
            print(f"node: {vdir} is there already")
            return vdir
        self.host.rmtree(vdir)  # an interrupted install's
        os.close(self.host.dir_fd(vdir, create=True))
        argv = ["make", "--no-print-directory", "-C", str(ROOT), *make_flags, "install",
                f"PREFIX={vdir}", f"SYSCONFDIR={self.prefix}/etc", f"PYTHON={python}"]
        if self.host.root != "/":
            argv.append(f"DESTDIR={self.host.root}")
        proc = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        if proc.returncode != 0:
            sys.stderr.write(proc.stdout[-4000:])
            raise NodeError("make install", vdir, f"exit status {proc.returncode} (its output is above)")
        self.python_on_host(vdir)
        self.host.write(f"{vdir}/.complete", f"{version}\n".encode())
        return vdir

    def python_on_host(self, vdir: str) -> None:
        """The interpreter the tree's environment names must be the host's too."""
        cfg = (self.host.read(f"{vdir}/lib/hami/venv/pyvenv.cfg") or b"").decode()
        found = [line.split("=", 1)[1].strip() for line in cfg.splitlines() if line.startswith("executable")]
        if found and not os.path.exists(self.host.path(found[0])):
            self.host.rmtree(vdir)
            raise NodeError("--python", found[0], "not on the host: the tree's Python environment runs it "
                            "(install with a Python the host has at that path)")

    def switch(self, version: str) -> str:
        """current -> versions/<version> in one rename; the version it replaced."""
        old = self.host.readlink(f"{self.prefix}/current")
        self.host.link(f"{self.prefix}/current", f"versions/{version}")
        if self.host.readlink(f"{self.prefix}/bin") != "current/bin":
            self.host.link(f"{self.prefix}/bin", "current/bin")
        return old and os.path.basename(old)

    def prune(self, keep: set) -> None:
        try:
            dfd = self.host.dir_fd(f"{self.prefix}/versions")
        except FileNotFoundError:
            return
        try:
            names = os.listdir(dfd)
        finally:
            os.close(dfd)
        for name in sorted(set(names) - keep):
            self.host.rmtree(f"{self.prefix}/versions/{name}")
            print(f"node: removed {self.prefix}/versions/{name} (two versions back)")

    # the engine

    def register(self, engine: str, dry=False) -> dict:
        """The engine's drop-in (and containerd's import): what uninstall undoes.
        dry: only computed (a refusal before anything is written)."""
        record = {"engine": engine, "made_dirs": []}
        if engine == "crio":
            text = engines.crio_dropin(self.binary)
            record["dropin"] = engines.CRIO_DROPIN
        else:
            main = self.host.read(engines.CONTAINERD_CONFIG)
            main_text = (main or b"version = 2\n").decode()
            for glob in engines.imported(main_text):
                self.refuse_other_cri(glob)
            text = engines.containerd_dropin(main_text, self.binary)
            new_main, edit = engines.imports_edit(main_text)
            record.update(dropin=engines.CONTAINERD_DROPIN, imports=edit, created_config=main is None)
        self.host.made = []
        if self.host.read(record["dropin"]) is not None:
            raise NodeError("host path", record["dropin"], "there already, not ours: move it away first")
        if dry:
            return record
        self.host.write(record["dropin"], text.encode())
        if engine == "containerd" and (edit is not None or main is None):
            self.host.write(engines.CONTAINERD_CONFIG, new_main.encode(),
                            self.host.keep_mode(engines.CONTAINERD_CONFIG))
        record["made_dirs"] = list(self.host.made)
        record["dropin_sha256"] = hashlib.sha256(text.encode()).hexdigest()
        print(f"node: {engine} runs handler {engines.HANDLER!r} by {self.binary} ({record['dropin']}"
              + (", and an import of it in config.toml" if record.get("imports") else "") + ")")
        return record

    def refuse_other_cri(self, glob: str) -> None:
        """Another imported file with a CRI section: one of the two would replace the other."""
        import fnmatch
        directory, pattern = os.path.split(glob)
        try:
            dfd = self.host.dir_fd(directory)
        except FileNotFoundError:
            return
        try:
            names = [n for n in os.listdir(dfd) if fnmatch.fnmatchcase(n, pattern)]
        finally:
            os.close(dfd)
        for name in names:
            path = f"{directory}/{name}"
            if path == engines.CONTAINERD_DROPIN:
                continue
            try:
                data = tomllib.loads((self.host.read(path) or b"").decode())
            except (tomllib.TOMLDecodeError, UnicodeDecodeError):
                continue  # containerd refuses it itself
            if engines.CRI in data.get("plugins", {}):
                raise NodeError("host path", path, f"an import that sets plugins.{engines.CRI!r} too: containerd "
                                "1.x would let one replace the other; move its settings into config.toml")

    def unregister(self, record: dict) -> list:
        """The engine's config as it was: what could not be put back, one line each."""
        left = []
        dropin = record["dropin"]
        data = self.host.read(dropin)
        if data is not None and hashlib.sha256(data).hexdigest() != record["dropin_sha256"]:
            left.append(f"left {dropin}: changed since install")
        elif data is not None:
            self.host.unlink(dropin)
        if record["engine"] == "containerd":
            if record.get("created_config"):
                current = self.host.read(engines.CONTAINERD_CONFIG)
                new, _ = engines.imports_edit("version = 2\n")
                if current == new.encode():
                    self.host.unlink(engines.CONTAINERD_CONFIG)
                else:
                    left.append(f"left {engines.CONTAINERD_CONFIG}: changed since install made it")
            elif record.get("imports"):
                current = self.host.read(engines.CONTAINERD_CONFIG)
                try:
                    restored = engines.undo_imports((current or b"").decode(), record["imports"])
                    self.host.write(engines.CONTAINERD_CONFIG, restored.encode(),
                                    self.host.keep_mode(engines.CONTAINERD_CONFIG))
                except engines.EngineConfigError as exc:
                    left.append(f"left {engines.CONTAINERD_CONFIG}: {exc}")
        for made in reversed(record.get("made_dirs", [])):
            self.host.rmdir_empty(made)
        return left


def restart_engine(host: Host, engine: str) -> None:
    """systemctl restart of the engine, in the host's root (its systemd)."""
    unit = "crio" if engine == "crio" else "containerd"
    argv = ["systemctl", "restart", unit]
    if host.root != "/":
        argv = ["chroot", host.root] + argv
    proc = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if proc.returncode != 0:
        raise NodeError("restart", unit, f"{' '.join(argv)} failed: {proc.stdout.strip()[-300:]}")
    print(f"node: restarted {unit}")


def label_request(node: str, value):
    """(path, body) of the API server's merge patch setting (None: removing) the label."""
    return f"/api/v1/nodes/{node}", json.dumps({"metadata": {"labels": {LABEL: value}}}).encode()


def label_node(node: str, value) -> None:
    """The label, by the pod's service account (in-cluster), or a note where there is none."""
    host, port = os.environ.get("KUBERNETES_SERVICE_HOST"), os.environ.get("KUBERNETES_SERVICE_PORT", "443")
    if not host:
        print(f"node: no API server (not in a pod): label {LABEL} left as it is")
        return
    path, body = label_request(node, value)
    token = Path(SERVICE_ACCOUNT, "token").read_text().strip()
    request = urllib.request.Request(
        f"https://{host}:{port}{path}", data=body, method="PATCH",
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/merge-patch+json"})
    context = ssl.create_default_context(cafile=f"{SERVICE_ACCOUNT}/ca.crt")
    with urllib.request.urlopen(request, context=context, timeout=30):
        pass
    print(f"node: {node} labelled {LABEL}={value}" if value else f"node: label {LABEL} removed from {node}")


def install(args, upgrade=False) -> None:
    host = Host(args.host_root)
    node = Node(host, args.prefix)
    state = node.state()
    if upgrade and state is None:
        raise NodeError("--prefix", args.prefix, "nothing installed there to upgrade")
    if state is not None and state["engine"]["engine"] != args.engine:
        raise NodeError("--engine", args.engine, f"installed for {state['engine']['engine']}: uninstall first")
    config = None
    if args.config:
        config = Path(args.config).read_bytes()
        try:
            tomllib.loads(config.decode())
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
            raise NodeError("--config", args.config, f"not TOML ({exc})") from None
    if state is None:
        node.register(args.engine, dry=True)
    host.made = []
    os.close(host.dir_fd(node.prefix, create=True))
    made_prefix = list(host.made)
    version = args.version or project_version()
    node.install_tree(version, args.make_flag, args.python)
    if config is not None:
        host.write(node.config, config)
    old = node.switch(version)
    if state is None:
        state = {"prefix_made_dirs": made_prefix, "engine": node.register(args.engine), "versions": []}
    state["versions"] = [v for v in state["versions"] if v != version][-1:] + [version]
    node.save(state)
    node.prune(set(state["versions"]))
    print(f"node: {node.prefix}/current -> versions/{version}"
          + (f" (was {old}; running containers keep its files)" if old and old != version else ""))
    if args.restart_engine and old is None:
        restart_engine(host, args.engine)
    if args.node_name:
        label_node(args.node_name, "ready")


def uninstall(args) -> None:
    host = Host(args.host_root)
    node = Node(host, args.prefix)
    state = node.state()
    if state is None:
        print(f"node: nothing installed under {node.prefix}")
        return
    if args.node_name:
        label_node(args.node_name, None)
    for line in node.unregister(state["engine"]):
        print(f"node: {line}")
    if args.restart_engine:
        restart_engine(host, state["engine"]["engine"])
    host.rmtree(node.prefix)
    for made in reversed(state.get("prefix_made_dirs", [])):
        host.rmdir_empty(made)
    sys.path.insert(0, str(ROOT / "packaging"))
    from install import remove_node_cache  # the node's config cache, as make uninstall removes it
    for line in remove_node_cache(host.root if host.root != "/" else ""):
        print(f"node: {line}")
    count = 0
    try:
        fd = host.dir_fd(f"{STATE_DIR}/containers")
        count = len(os.listdir(fd))
        os.close(fd)
    except (FileNotFoundError, NodeError):
        pass
    print(f"node: removed {node.prefix}; left {STATE_DIR} (allocations of {count} running "
          "container(s): they keep their GPUs until they stop)")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="node_installer.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("command", choices=("install", "upgrade", "uninstall"))
    parser.add_argument("--host-root", required=True)
    parser.add_argument("--prefix", default=DEFAULT_PREFIX)
    parser.add_argument("--engine", choices=("containerd", "crio"), default="containerd")
    parser.add_argument("--config", help="the node config to install (the ConfigMap's config.toml)")
    parser.add_argument("--version", help="the version dir's name (default: the project's version)")
    parser.add_argument("--python", default="python3", help="the Python the tree's environment is made with")
    parser.add_argument("--make-flag", action="append", default=[], help="an extra flag for make install")
    parser.add_argument("--restart-engine", action="store_true",
                        help="restart the engine where its config changed (systemctl, in the host root)")
    parser.add_argument("--node-name", default="", help="label this node (in a pod: $NODE_NAME)")
    args = parser.parse_args(argv)
    try:
        if args.command == "uninstall":
            uninstall(args)
        else:
            install(args, upgrade=args.command == "upgrade")
    except (NodeError, engines.EngineConfigError, OSError) as exc:
        print(f"node_installer: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
