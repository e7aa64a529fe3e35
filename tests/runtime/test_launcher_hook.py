"""The launcher's createRuntime hook (hook.c): the host PID as
private/<id>@<root key>/pid, written by a C program inside runc's create."""
import json
import subprocess

import pytest

from hami_runtime.lifecycle import state_layout

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
                                       state_layout.root_key(str(node.runc_root)), "createRuntime"]
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
    from hami_runtime.lifecycle import create
    path = tmp_path / name
    path.write_bytes(b"\x7fELF")
    path.chmod(mode)
    assert create.usable_launcher(str(path)) is usable
