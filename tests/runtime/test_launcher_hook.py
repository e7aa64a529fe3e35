"""The launcher's createRuntime hook (hook.c): the host PID as
private/<id>@<root key>/pid, written by a C program inside runc's create; and the
check of the container's mounts both createRuntime hooks make (hook.c, and
hami_hook through rootfs.mounted_problem), against a process that holds a
rootfs's mounts as runc's init holds them when runc runs the hook."""
import json
import os
import shutil
import subprocess
import sys

import pytest

from hami_runtime.lifecycle.node_state import state_layout
from tests.conftest import ROOT

from .node import LAUNCHER, RUNC, TIMEOUT

pytestmark = pytest.mark.skipif(not LAUNCHER.exists(), reason="make build builds the launcher")


KEY = state_layout.root_key("/run/runc")
NAME = f"c1@{KEY}"


def hook(state_dir, stdin, *args):
    argv = [str(LAUNCHER), "hami-hook", "--state-dir", str(state_dir), "--root-key", KEY] + \
        list(args or ["createRuntime"])
    return subprocess.run(argv, input=stdin, capture_output=True, text=True, timeout=TIMEOUT)


def state_doc(**fields):
    return json.dumps({"ociVersion": "1.0.2", "status": "creating", "bundle": "/b", **fields})


@pytest.mark.parametrize("stdin,pid", [
    (state_doc(id="c1", pid=4242), 4242),
    # an "id" deeper down is not the container's
    (json.dumps({"annotations": {"id": "../x", "n": [{"pid": 1}]}, "id": "c1", "pid": 77}), 77),
    (' {\n "id" : "c1" , "pid" : 0 }\n', 0),
    (state_doc(id="c1"), 0),
])
def test_records_the_pid(tmp_path, stdin, pid):
    (tmp_path / "private" / NAME).mkdir(parents=True)
    proc = hook(tmp_path, stdin)
    assert (proc.returncode, proc.stderr) == (0, "")
    assert (tmp_path / "private" / NAME / "pid").read_text() == f"{pid}\n"
    assert state_layout.host_pid(str(tmp_path), NAME) == pid
    assert sorted(p.name for p in (tmp_path / "private" / NAME).iterdir()) == ["pid"]


@pytest.mark.parametrize("stdin,args,message", [
    ("not json", (), "stdin: not an OCI state document"),
    ('{"id": "c1", "pid": "12"}', (), "stdin: not an OCI state document"),
    ('{"id": "c1", "pid": 12', (), "stdin: not an OCI state document"),
    (state_doc(pid=3), (), "container id: missing container id"),
    (state_doc(id="../c1", pid=3), (), "container id='../c1': must be letters"),
    (state_doc(id="a/b", pid=3), (), "container id='a/b': must be letters"),
    (state_doc(id="c1", pid=3), ("poststop",), "usage"),
    (state_doc(id="c1", pid=3), ("createRuntime", "extra"), "argument not understood: extra"),
])
def test_refusals_are_one_line(tmp_path, stdin, args, message):
    (tmp_path / "private" / NAME).mkdir(parents=True)
    proc = hook(tmp_path, stdin, *args)
    assert proc.returncode == 1
    assert proc.stderr.startswith(f"hami-hook: {message}") and proc.stderr.count("\n") == 1
    assert list((tmp_path / "private" / NAME).iterdir()) == []


@pytest.mark.parametrize("link", ["private", f"private/{NAME}"])
def test_symlinks_in_the_state_dir_are_not_followed(tmp_path, link):
    """A private/ (or private/<name>) that is a link to elsewhere gets nothing written."""
    outside = tmp_path / "outside"
    (outside / NAME).mkdir(parents=True)
    state = tmp_path / "state"
    (state / "private").mkdir(parents=True)
    (state / link).rmdir() if (state / link).exists() else None
    (state / link).symlink_to(outside if link == "private" else outside / NAME)
    proc = hook(state, state_doc(id="c1", pid=5))
    assert proc.returncode == 1 and "symlink is refused" in proc.stderr
    assert list((outside / NAME).iterdir()) == []


@pytest.mark.parametrize("key", ["", "0123", "0123456789ABCDEF", "../../../../tmp/x"])
def test_root_key_checked(tmp_path, key):
    proc = subprocess.run([str(LAUNCHER), "hami-hook", "--state-dir", str(tmp_path), "--root-key",
                           key, "createRuntime"], input=state_doc(id="c1", pid=1),
                          capture_output=True, text=True, timeout=TIMEOUT)
    assert proc.returncode == 1 and "--root-key must be 16 lowercase hex digits" in proc.stderr


def test_no_allocation_nothing_written(tmp_path):
    proc = hook(tmp_path, state_doc(id="c9", pid=5))
    assert proc.returncode == 0 and not (tmp_path / "private").exists()


def test_relative_state_dir_refused(tmp_path):
    proc = subprocess.run([str(LAUNCHER), "hami-hook", "--state-dir", "rel", "--root-key", KEY,
                           "createRuntime"],
                          input=state_doc(id="c1", pid=1), capture_output=True, text=True,
                          timeout=TIMEOUT, cwd=tmp_path)
    assert proc.returncode == 1 and "absolute" in proc.stderr


def test_launcher_create_uses_the_c_hook(node):
    """Through the launcher, runc runs the C hook at createRuntime and there is
    no poststop hook of ours; hamictl ps shows the PID runc reports."""
    bundle = node.bundle("ch", {"hami.io/gpumem": "500"})
    proc = node.create("ch", bundle, cmd=[str(LAUNCHER)])
    assert proc.returncode == 0, proc.stderr
    try:
        hooks = json.loads((bundle / "config.json").read_text())["hooks"]
        [create_hook] = hooks["createRuntime"]
        assert create_hook["args"] == [str(LAUNCHER.resolve()), "hami-hook", "--state-dir",
                                       str(node.state_dir), "--root-key",
                                       state_layout.root_key(str(node.runc_root)),
                                       "--rootfs", os.path.realpath(node.rootfs), "--etc", "bind",
                                       "--libvgpu", str(node.sim_root / "libvgpu.so"), "createRuntime"]
        assert create_hook["path"] == str(LAUNCHER.resolve()) and create_hook["env"]
        assert "poststop" not in hooks
        runc_state = json.loads(subprocess.run(
            [RUNC, "--root", str(node.runc_root), "state", "ch"], capture_output=True, text=True,
            timeout=TIMEOUT, check=True).stdout)
        [row] = node.ps()
        assert row["pid"] == runc_state["pid"] > 0
    finally:
        assert node.runtime("delete", "-f", "ch", cmd=[str(LAUNCHER)]).returncode == 0
    assert node.ps() == []


def test_config_hook_command_keeps_its_hook(node):
    node.write_config(hook_command=["/nonexistent/hami-hook"])
    bundle = node.bundle("hc", {"hami.io/gpumem": "500"})
    proc = node.create("hc", bundle, cmd=[str(LAUNCHER)])
    # runc refuses at createRuntime (the named hook does not exist): the spec shows the choice
    hooks = json.loads((bundle / "config.json").read_text())["hooks"]
    assert hooks["createRuntime"][0]["path"] == "/nonexistent/hami-hook", proc.stderr
    assert proc.returncode != 0
    node.runtime("delete", "-f", "hc", cmd=[str(LAUNCHER)])


@pytest.mark.parametrize("name,mode,usable", [
    ("hami-runtime", 0o755, True),
    ("hami-runtime", 0o775, False),   # group-writable
    ("hami-runtime", 0o757, False),   # world-writable
    ("hami-runtime", 0o644, False),   # not executable
    ("other-tool", 0o755, False),     # not a launcher
])
def test_only_a_safe_launcher_runs_the_hook(tmp_path, name, mode, usable):
    from hami_runtime.lifecycle.commands import create
    path = tmp_path / name
    path.write_bytes(b"\x7fELF")
    path.chmod(mode)
    assert create.usable_launcher(str(path)) is usable


# --- the check of the container's mounts, made by both hooks ---

class Layout:
    """A rootfs, the runtime's private files for container c1 and the node's libvgpu."""

    def __init__(self, tmp):
        tmp = tmp.resolve()
        self.root, self.state = tmp / "rootfs", tmp / "state"
        self.private = self.state / "private" / NAME
        self.private.mkdir(parents=True)
        self.preload, self.limits, self.lib = self.private / "ld.so.preload", self.private / "limits", tmp / "libvgpu.so"
        self.preload.write_text("/.hami/libvgpu.so\n")
        self.limits.write_bytes(b"limits")
        self.lib.write_bytes(b"libvgpu")
        self.region = self.state / "containers" / NAME
        self.boards = [self.state / "activity", self.state / "priority"]
        for d in [self.region] + self.boards:
            d.mkdir(parents=True)
        self.other = tmp / "other"  # a file that is none of them
        self.other.write_bytes(b"other")
        self.host_dir = tmp / "host-dir"  # a dir of the host's, outside the rootfs
        self.host_dir.mkdir()
        for d in ("etc", ".hami", "fake"):
            (self.root / d).mkdir(parents=True)
        (self.root / "etc" / "ld.so.preload").write_text("")  # runc's mount point
        for name in ("libvgpu.so", "limits"):
            (self.root / ".hami" / name).write_text("")
        for name in ("shared", "activity", "priority"):
            (self.root / ".hami" / name).mkdir()
        self.inits = []

    def mounts(self, etc="self", preload=True, hami=True, lib=None, limits=None, region=None):
        """What runc's init has made when the hook runs: the root bound onto itself,
        /etc (bound onto itself, another dir, a tmpfs, or nothing), the preload,
        /.hami's tmpfs and the files and dirs in it."""
        r = self.root
        cmds = [f"mount --bind {r} {r}"]
        if etc == "self":
            cmds.append(f"mount --bind {r}/etc {r}/etc")
        elif etc == "tmpfs":
            cmds += [f"mount -t tmpfs tmpfs {r}/etc", f"touch {r}/etc/ld.so.preload"]
        elif etc:
            cmds.append(f"mount --bind {etc} {r}/etc")
        if preload:  # runc makes the mount point where it is missing (in a host dir bound at /etc too)
            cmds += [f"touch {r}/etc/ld.so.preload", f"mount --bind {self.preload} {r}/etc/ld.so.preload"]
        if hami:
            cmds += [f"mount -t tmpfs -o size=64k tmpfs {r}/.hami", f"touch {r}/.hami/libvgpu.so {r}/.hami/limits",
                     f"mkdir {r}/.hami/shared {r}/.hami/activity {r}/.hami/priority"]
        cmds += [f"mount --bind {lib or self.lib} {r}/.hami/libvgpu.so",
                 f"mount --bind {limits or self.limits} {r}/.hami/limits",
                 f"mount --bind {region or self.region} {r}/.hami/shared"]
        cmds += [f"mount --bind {board} {r}/.hami/{board.name}" for board in self.boards]
        return cmds

    def init(self, cmds) -> int:
        """A process in a mount namespace of its own that made `cmds`: its pid."""
        script = " && ".join(cmds)
        script += "" if cmds[-1].startswith("exec ") else " && echo ready && exec sleep 120"
        proc = subprocess.Popen(["unshare", "-m", "--propagation", "private", "sh", "-c", script],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.inits.append(proc)
        assert proc.stdout.readline() == "ready\n", proc.stderr.read()
        return proc.pid

    def stop(self):
        for proc in self.inits:
            proc.kill()
            proc.wait(TIMEOUT)


@pytest.fixture
def layout(tmp_path):
    made = Layout(tmp_path)
    yield made
    made.stop()


def both_hooks(layout, pid, etc, after_each=lambda: None):
    """The C hook's and the Python hook's answers to the same state: (status, stderr) each
    (`after_each` called after each hook)."""
    state = state_doc(id="c1", pid=pid)
    check = ["--rootfs", str(layout.root), "--etc", etc, "--libvgpu", str(layout.lib), "createRuntime"]
    answers = []
    for argv in ([str(LAUNCHER), "hami-hook", "--state-dir", str(layout.state), "--root-key", KEY],
                 [sys.executable, "-m", "hami_hook", "--state-dir", str(layout.state), "--runc-root", "/run/runc"]):
        proc = subprocess.run(argv + check, input=state, capture_output=True, text=True, timeout=TIMEOUT, cwd=ROOT)
        answers.append((proc.returncode, proc.stderr))
        after_each()
    return answers


def rename_to_link(path, target):
    """What a second container on the same rootfs does after runc's mounts: the
    mount point renamed away (the kernel lets another mount namespace), a link in its place."""
    os.rename(path, f"{path}.moved")
    os.symlink(target, path)


@pytest.mark.parametrize("mounts,etc", [
    ({}, "bind"),                       # a writable root
    ({"etc": None}, "dir"),             # a read-only root: runc binds /etc onto itself after the hook
    ({"etc": "tmpfs"}, "mount"),        # an image without /etc
])
def test_the_mounts_as_the_runtime_meant_them_pass(layout, mounts, etc):
    pid = layout.init(layout.mounts(**mounts))
    recorded = []

    def take_pid():
        recorded.append((layout.private / "pid").read_text())
        (layout.private / "pid").unlink()
    assert both_hooks(layout, pid, etc, take_pid) == [(0, "")] * 2
    assert recorded == [f"{pid}\n"] * 2


# (how the mounts differ, --etc, what is done after the mounts, what the line says, after the rootfs)
MISMATCHES = {
    "/etc swapped with a link": ({}, "bind", lambda L: rename_to_link(L.root / "etc", "fake"),
                                 "/etc is a symbolic link (device "),
    "a host dir bound at /etc": ({"etc": "HOST"}, "bind", None,
                                 "/etc is a directory (device {dev}, inode {host}), not the rootfs's own /etc "
                                 "(a directory (device {dev}, inode {etc}))"),
    "/etc bound elsewhere": ({"etc": None}, "bind", None,
                             "/etc is the rootfs's directory, not a mount point of its own: runc's /etc mount "
                             "went elsewhere"),
    "the spec's /etc mount missing": ({"etc": None}, "mount", None,
                                      "/etc is the rootfs's directory, not a mount point of its own"),
    "a host dir at a read-only root's /etc": ({"etc": "HOST"}, "dir", None,
                                             "/etc is a directory (device {dev}, inode {host}), not the rootfs's own /etc"),
    "no preload": ({"preload": False}, "bind", None,
                   "/etc/ld.so.preload is a regular file (device {dev}, inode {image_preload}), not the "
                   "preload the runtime made for it ({preload})"),
    "/.hami not the runtime's tmpfs": ({"hami": False}, "bind", None,
                                       "/.hami is the rootfs's directory, not the runtime's tmpfs: runc's /.hami "
                                       "mount went elsewhere"),
    "/.hami swapped with a link": ({}, "bind", lambda L: rename_to_link(L.root / ".hami", "fake"),
                                   "/.hami is a symbolic link"),
    "another libvgpu": ({"lib": "OTHER"}, "bind", None, "/.hami/libvgpu.so is a regular file (device {dev}, "
                        "inode {other}), not the node's libvgpu ({lib})"),
    "another container's limits": ({"limits": "OTHER"}, "bind", None, "/.hami/limits is a regular file "
                                   "(device {dev}, inode {other}), not its limits ({limits})"),
    "another region dir": ({"region": "HOST"}, "bind", None, "/.hami/shared is a directory (device {dev}, "
                           "inode {host}), not its region dir ({region})"),
    "no allocation": ({}, "bind", lambda L: [p.unlink() for p in L.private.iterdir()] and L.private.rmdir(),
                      None),
}


@pytest.mark.parametrize("case", MISMATCHES.values(), ids=MISMATCHES.keys())
def test_a_mismatch_fails_the_create_in_one_line(layout, case):
    """Both hooks refuse with the same line, naming the path and what is there; no pid is recorded."""
    mounts, etc, after, says = case
    mounts = {k: {"HOST": layout.host_dir, "OTHER": layout.other}.get(v, v) for k, v in mounts.items()}
    st = lambda p: os.stat(p)
    dev = f"{os.major(st(layout.root).st_dev)}:{os.minor(st(layout.root).st_dev)}"
    values = dict(dev=dev, host=st(layout.host_dir).st_ino, etc=st(layout.root / "etc").st_ino,
                  image_preload=st(layout.root / "etc" / "ld.so.preload").st_ino,
                  other=st(layout.other).st_ino, preload=layout.preload, lib=layout.lib, limits=layout.limits,
                  region=layout.region)
    pid = layout.init(layout.mounts(**mounts))
    if after:
        after(layout)
    (c_status, c_line), (py_status, py_line) = both_hooks(layout, pid, etc)
    assert c_line == py_line and c_status == py_status == 1
    assert c_line.startswith("hami-hook: container c1: ") and c_line.count("\n") == 1, c_line
    assert c_line.endswith("; the create is refused\n"), c_line
    if says is None:
        assert f"{layout.private}: absent: no allocation to check its mounts against" in c_line
    else:
        assert f"{layout.root}{says.format(**values)}" in c_line, c_line
    assert not (layout.private / "pid").exists()


def test_a_runtime_that_pivots_before_the_hook(layout):
    """An init whose root is the rootfs already (pivot_root, or chroot here): the
    tree is its root's."""
    shutil.copy2(shutil.which("busybox") or "/bin/busybox", layout.root / "busybox")
    pid = layout.init(layout.mounts() + [f"exec chroot {layout.root} /busybox sh -c 'echo ready; exec /busybox sleep 120'"])
    assert both_hooks(layout, pid, "bind") == [(0, "")] * 2
    rename_to_link(layout.root / "etc", "fake")
    assert all(status == 1 and "/etc is a symbolic link" in line for status, line in both_hooks(layout, pid, "bind"))


def test_a_process_outside_the_container_is_no_container(layout):
    """The state's pid must be the one whose mount namespace holds the mounts: the
    host's view of the rootfs has none of them."""
    for status, stderr in both_hooks(layout, os.getpid(), "bind"):
        assert status == 1 and "/etc is the rootfs's directory, not a mount point of its own" in stderr


def test_check_arguments_go_together(layout):
    proc = hook(layout.state, state_doc(id="c1", pid=1), "--rootfs", str(layout.root), "createRuntime")
    assert proc.returncode == 1 and "--rootfs, --etc and --libvgpu go together" in proc.stderr
    proc = hook(layout.state, state_doc(id="c1", pid=1), "--rootfs", str(layout.root), "--etc", "other",
                "--libvgpu", str(layout.lib), "createRuntime")
    assert proc.returncode == 1 and "--etc must be bind, dir or mount" in proc.stderr


@pytest.mark.parametrize("has_etc,readonly,mounts,etc", [
    (True, False, [], "bind"),
    (True, True, [], "dir"),
    (False, False, [], "mount"),       # a tmpfs stands for it
    (True, False, [{"destination": "/etc/", "type": "bind", "source": "/srv/etc"}], "mount"),
    (True, False, "OURS", "bind"),     # a spec this runtime edited before
])
def test_what_the_hook_is_to_find_at_etc(tmp_path, has_etc, readonly, mounts, etc):
    from hami_runtime.lifecycle.spec_edit import rootfs
    root = tmp_path / "rootfs"
    (root / "etc" if has_etc else root).mkdir(parents=True)
    if mounts == "OURS":
        mounts = [{"destination": "/etc", "type": "bind", "source": str(root / "etc"), "options": ["bind"]}]
    image = rootfs.image(str(tmp_path), {"root": {"path": "rootfs", "readonly": readonly}, "mounts": mounts})
    assert (image.root, image.etc) == (str(root), etc)
