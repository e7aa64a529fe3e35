"""The host side, tried as an unprivileged host user would: nothing in the state
dir is theirs to write (the regions and activity stamps that every user of a
container may write reach it by bind mounts, not through the host's
permissions), and a state dir that such a user could replace, or reach through
a dir of theirs, is refused at create and by doctor."""
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from hami_runtime import config_cache
from hami_runtime.lifecycle.node_state import state_layout
from tests.runtime.node import LAUNCHER, RUNC
from tests.runtime.test_config_cache import settle

GPU = {"hami.io/gpumem": "1000", "hami.io/priority": "0"}
NOBODY = 65534

# What the user tries on each file of a live container: open it to write.
PROBE = r"""
import json, os, sys
out = {}
for path in sys.argv[1:]:
    try:
        os.close(os.open(path, os.O_WRONLY))
        out[path] = "opened"
    except OSError as exc:
        out[path] = exc.strerror
print(json.dumps(out))
"""


def as_nobody(*paths):
    proc = subprocess.run(["/usr/bin/python3", "-I", "-c", PROBE, *map(str, paths)], capture_output=True,
                          text=True, user=NOBODY, group=NOBODY, extra_groups=[], timeout=30)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


@pytest.fixture
def run_dir(node):
    """A dir under /run, as the default state dir's, that every user may walk to;
    removed once the node's containers are gone (their poststop hooks use it)."""
    path = Path(tempfile.mkdtemp(prefix="hami-trust-", dir="/run"))
    path.chmod(0o755)
    yield path
    node.cleanup()
    shutil.rmtree(path)


def test_no_host_user_reaches_a_live_containers_files(node, run_dir):
    node.state_dir = run_dir / "state"
    node.write_config()
    bundle = node.bundle("victim", GPU)
    assert node.create("victim", bundle).returncode == 0
    name = state_layout.alloc_name(str(node.runc_root), "victim")
    uuid = node.allocations()["victim"]["devices"][0]["uuid"]
    state = node.state_dir
    targets = [state / "allocations.json", state / "allocations.lock",
               state / "containers" / name / "vgpu.region", state / "containers" / name / "activity" / uuid,
               state / "activity" / uuid / name, state / "priority" / uuid / name,
               state / "private" / name / "limits"]
    assert [p for p in targets if not p.exists()] == []
    assert os.stat(state).st_mode & 0o777 == 0o700
    assert as_nobody(*targets) == {str(p): "Permission denied" for p in targets}
    # The container's own users still open them to write, through its mounts.
    proc = subprocess.run([RUNC, "--root", str(node.runc_root), "exec", "--user", "1000:1000", "victim",
                           "sh", "-c", f": >> /.hami/shared/vgpu.region && : >> /.hami/shared/activity/{uuid} "
                           "&& echo stamped >&2"],
                          capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
    assert "stamped" in proc.stderr, proc.stderr


def test_an_older_state_dir_is_made_host_only(node):
    node.state_dir.mkdir(mode=0o755)
    node.state_dir.chmod(0o755)
    doctor = node.hamictl("doctor")
    assert "lets other users reach the containers' regions" in doctor.stdout, doctor.stdout
    assert node.create("c", node.bundle("c", GPU)).returncode == 0
    assert os.stat(node.state_dir).st_mode & 0o777 == 0o700


def _sticky(base):
    base.chmod(0o1777)


def _user_made(base):
    """A user pre-created the state dir in a world-writable, sticky dir."""
    _sticky(base)
    (base / "state").mkdir()
    os.chown(base / "state", NOBODY, NOBODY)
    return base / "state", f"{base} is writable by group or others, who could replace {base}/state"


def _users_parent(base):
    (base / "theirs").mkdir()
    os.chown(base / "theirs", NOBODY, NOBODY)
    return base / "theirs" / "state", f"{base}/theirs is owned by uid {NOBODY}, not root"


def _group_writable_parent(base):
    base.chmod(0o775)
    return base / "state", f"{base} is writable by group or others, who could replace {base}/state"


def _world_writable_parent(base):
    base.chmod(0o777)
    (base / "state").mkdir()
    return base / "state", f"{base} is writable by group or others, who could replace {base}/state"


def _users_link(base):
    """A link a user planted in a sticky dir, to a dir of root's."""
    _sticky(base)
    (base / "real").mkdir(mode=0o755)
    (base / "link").symlink_to(base / "real")
    os.lchown(base / "link", NOBODY, NOBODY)
    return base / "link" / "state", f"{base} is writable by group or others, who could replace {base}/link"


def _roots_dir_in_sticky_parent(base):
    _sticky(base)
    (base / "state").mkdir(mode=0o755)
    return base / "state", ""


def _roots_link(base):
    (base / "real").mkdir(mode=0o755)
    (base / "link").symlink_to("real")
    return base / "link" / "state", ""


STATE_DIRS = [
    # (case, how the state dir and the dirs above it are laid out -> (state dir, the problem or ''))
    ("made-by-a-user-in-tmp", _user_made),
    ("parent-a-users", _users_parent),
    ("parent-group-writable", _group_writable_parent),
    ("parent-world-writable", _world_writable_parent),
    ("link-a-users", _users_link),
    ("roots-in-a-sticky-dir", _roots_dir_in_sticky_parent),
    ("through-roots-link", _roots_link),
]


@pytest.mark.parametrize("case,layout", STATE_DIRS, ids=[c[0] for c in STATE_DIRS])
def test_a_state_dir_others_could_replace_is_refused(node, case, layout):
    base = Path(tempfile.mkdtemp(prefix="hami-trust-", dir="/tmp"))
    try:
        node.state_dir, problem = layout(base)
        node.write_config()
        before = sorted(os.listdir(base))
        proc = node.create("c", node.bundle("c", GPU))
        doctor = node.hamictl("doctor")
        if not problem:
            assert proc.returncode == 0, proc.stderr
            assert doctor.returncode == 0, doctor.stdout
            assert "c" in node.allocations()
            return
        assert proc.returncode == 1
        line = (f"config state_dir='{node.state_dir}': {problem}: a user other than root could replace "
                "the node's state")
        assert proc.stderr.startswith(f"hami-runtime: {line}") and proc.stderr.count("\n") == 1, proc.stderr
        assert line in (node.tmp / "runc.log").read_text()
        assert doctor.returncode == 1 and f"{node.state_dir}: {problem}" in doctor.stdout, doctor.stdout
        assert sorted(os.listdir(base)) == before, list(os.walk(base))
        assert node.containers() == []
        if node.state_dir.is_dir():
            assert os.listdir(node.state_dir) == []
    finally:
        node.cleanup()
        shutil.rmtree(base, ignore_errors=True)


def test_a_link_planted_at_the_logs_name_is_not_followed(node):
    """A log_file in a dir others may write: a link a user planted there at its
    name is never written through; doctor names the dir."""
    logs = node.tmp / "logs"
    logs.mkdir(mode=0o1777)
    logs.chmod(0o1777)
    victim = node.tmp / "victim"
    victim.write_text("root's file\n")
    (logs / "hami.log").symlink_to(victim)
    os.lchown(logs / "hami.log", NOBODY, NOBODY)
    node.write_config(log_file=str(logs / "hami.log"), log_level="debug")
    assert node.create("c", node.bundle("c", GPU)).returncode == 0
    assert victim.read_text() == "root's file\n"
    doctor = node.hamictl("doctor")
    assert doctor.returncode == 1
    assert (f"config log_file='{logs}/hami.log': {logs} is writable by group or others: a user other "
            "than root could replace the log") in doctor.stdout, doctor.stdout


@pytest.mark.skipif(not LAUNCHER.exists(), reason="make build builds the launcher")
def test_a_container_with_a_hostpath_of_var_cache_cannot_choose_what_a_create_runs(node):
    """A container given /var/cache read-write (root in it) writes a program
    there and points the node's persistent config entry's `runtime` at it; after
    a reboot-like empty state dir, the next GPU create runs runc, never that
    program, and the runtime's log says the entry was refused."""
    log, marker = node.tmp / "hami.log", node.tmp / "marker"
    evil = Path("/var/cache/hami-test-evil-runc")
    node.write_config(log_file=str(log), create_server_idle_s=0)
    settle(node.config)
    subprocess.run([sys.executable, "-c", "from hami_runtime import config; config.load()"],
                   env=node.env, check=True, timeout=60)  # validated and kept, as a create would
    entry = Path(config_cache.persistent_path(str(node.config)))
    attack = (f"printf '#!/bin/sh\\ntouch {marker}\\nexec {RUNC} \"$@\"\\n' > /host/{evil.name} && "
              f"chmod 755 /host/{evil.name} && "
              f"sed -i 's#\"runtime\":\\[[^]]*\\]#\"runtime\":[\"{evil}\"]#' /host/hami/{entry.name}")
    bundle = node.bundle("attacker", args=("sh", "-c", attack))
    spec = json.loads((bundle / "config.json").read_text())
    spec["mounts"].append({"destination": "/host", "type": "bind", "source": "/var/cache",
                           "options": ["rbind", "rw"]})
    (bundle / "config.json").write_text(json.dumps(spec))
    try:
        ran = node.runtime("run", "--bundle", str(bundle), "attacker")
        assert ran.returncode == 0, ran.stderr
        assert f'"runtime":["{evil}"]' in entry.read_text()  # the entry is the container's to write
        shutil.rmtree(node.state_dir)
        created = node.create("gpu", node.bundle("gpu", GPU, args=("true",)), cmd=[str(LAUNCHER)])
        assert created.returncode == 0, created.stderr
    finally:
        node.runtime("delete", "-f", "gpu", cmd=[str(LAUNCHER)])
        evil.unlink(missing_ok=True)
    assert not marker.exists()
    assert f"config cache: refused {entry}: " in log.read_text()
