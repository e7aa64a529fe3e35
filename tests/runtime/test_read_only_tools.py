"""The read-only tools (hamictl ps, gpus, top, metrics, doctor without
--repair) create nothing and change nothing in the node's state dir: not the
dir itself where there is none, not the allocator's lock or state file, not a
config cache entry. They read the state file without the allocator's lock
(store.snapshot); a dead container's allocation stays until the next create
or delete, or hamictl doctor --repair, frees it (docs/operations.md)."""
import json
import os
import subprocess
import time
import urllib.request

import pytest

from hami_runtime import config_cache
from hami_runtime.lifecycle.node_state import state_layout, store

from .node import HAMICTL, TIMEOUT

GPU = {"hami.io/gpumem": "1000"}
GPU0 = "GPU-453c5d90-9eaf-43fa-be71-c8ae8fc44d65"  # the simulator's first


def listing(root):
    """Every path under root (root included), not following links: its kind,
    mode, size, mtime and, for a file, its bytes; None where root is absent."""
    if not os.path.lexists(root):
        return None
    st = os.lstat(root)
    found = {".": (st.st_mode, st.st_mtime_ns)}
    for here, dirs, files in os.walk(root):
        for name in dirs + files:
            path = os.path.join(here, name)
            st = os.lstat(path)
            data = None
            if os.path.isfile(path) and not os.path.islink(path):
                with open(path, "rb") as handle:
                    data = handle.read()
            elif os.path.islink(path):
                data = os.readlink(path)
            found[os.path.relpath(path, root)] = (st.st_mode, st.st_size, st.st_mtime_ns, data)
    return found


def settled(node):
    """The config as on a node: written seconds ago, so its values would be kept
    in the state dir's config cache by anything that keeps them."""
    wait = config_cache.SETTLED_NS / 1e9 + 0.2 - (time.time() - os.stat(node.config).st_ctime)
    if wait > 0:
        time.sleep(wait)


def metrics(node):
    """One scrape of `hamictl metrics`, then SIGTERM."""
    proc = subprocess.Popen(HAMICTL + ["metrics", "--listen", "127.0.0.1:0"], env=node.env,
                            stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
    try:
        line = proc.stderr.readline()
        assert line.startswith("serving http://127.0.0.1:"), line
        with urllib.request.urlopen(line.split()[1], timeout=TIMEOUT) as response:
            assert response.status == 200
            return response.read().decode()
    finally:
        proc.terminate()
        proc.wait(timeout=TIMEOUT)
        proc.stderr.close()


TOOLS = [
    ("ps",), ("ps", "--json"), ("gpus",), ("gpus", "--json"), ("top", "--interval", "0"),
    ("top", "--json", "--interval", "0"), ("doctor",), ("doctor", "--json"),
]


def absent(node):
    pass


def empty(node):
    node.state_dir.mkdir(mode=0o700)


def live(node):
    assert node.create("live", node.bundle("live", GPU)).returncode == 0


def dead(node):
    """A live container and the entry of one runc no longer has (its state.json
    gone, as after a node crash)."""
    live(node)
    node.leave_dead_entry(GPU0)


def corrupt(node):
    live(node)
    (node.state_dir / store.STATE_FILE).write_text('{"version": 2, "allocations": {"live": ')


def no_state_file(node):
    """A state dir a create made, its state file and lock since removed."""
    live(node)
    for name in (store.STATE_FILE, store.LOCK_FILE):
        (node.state_dir / name).unlink()


NODES = [absent, empty, live, dead, corrupt, no_state_file]


@pytest.mark.parametrize("make", NODES, ids=[m.__name__ for m in NODES])
def test_read_only_tools_leave_the_state_dir_as_it_was(node, make):
    node.write_config(create_server_idle_s=0)  # no server of its own in the state dir
    make(node)
    settled(node)
    before = listing(node.state_dir)
    for command in TOOLS:
        proc = node.hamictl(*command)
        assert "Traceback" not in proc.stderr, (command, proc.stderr)
        assert listing(node.state_dir) == before, command
    assert metrics(node)
    assert listing(node.state_dir) == before, "metrics"
    shown = [r["container"] for r in node.ps()]
    assert shown == ([] if make in (absent, empty) else ["live"])  # dead ones left out, lost ones rebuilt


def test_what_they_show_of_a_dead_allocation(node):
    """ps and gpus leave a dead container's allocation out (the next create frees
    it) while it stays in the file; doctor notes it; doctor --repair frees it."""
    dead(node)
    name = state_layout.alloc_name(str(node.runc_root), "gone")
    assert [r["container"] for r in node.ps()] == ["live"]
    [gpu0] = [g for g in json.loads(node.hamictl("gpus", "--json").stdout) if g["uuid"] == GPU0]
    assert gpu0["slots_used"] == 1 and gpu0["memory_allocated_mib"] == 1000
    shown = json.loads(node.hamictl("doctor", "--json").stdout)
    assert shown["healthy"] and shown["allocations"] == 2
    assert f"entry {name!r}: its container is gone; the next create or delete frees it " \
           "(so does hamictl doctor --repair)" in shown["notes"]
    assert name in node.state()["allocations"]
    assert node.hamictl("doctor", "--repair").returncode == 0
    assert name not in node.state()["allocations"]
    assert list(node.allocations()) == ["live"]


def test_the_next_create_frees_a_dead_allocation(node):
    dead(node)
    name = state_layout.alloc_name(str(node.runc_root), "gone")
    assert node.create("next", node.bundle("next", GPU)).returncode == 0
    assert name not in node.state()["allocations"]
    assert sorted(node.allocations()) == ["live", "next"]


def test_a_corrupt_state_file_is_reported_not_set_aside(node):
    """ps says the file is not one and shows what the running containers hold;
    the file stays as it was, for the next create to set aside."""
    corrupt(node)
    path = node.state_dir / store.STATE_FILE
    proc = node.hamictl("ps", "--json")
    assert proc.returncode == 0, proc.stderr
    assert [r["container"] for r in json.loads(proc.stdout)] == ["live"]
    assert proc.stderr == (f"hamictl: {path}: is not a version {store.VERSION} state file: shown as "
                           "rebuilt from the running containers' bundles (the next create or delete "
                           "sets it aside and rebuilds it; so does `hamictl doctor --repair`)\n")
    assert path.read_text() == '{"version": 2, "allocations": {"live": '
    doctor = node.hamictl("doctor")
    assert doctor.returncode == 1 and f"fault: {path}: not JSON" in doctor.stdout
    assert path.read_text() == '{"version": 2, "allocations": {"live": '


def test_a_read_only_config_load_keeps_nothing(tmp_path, monkeypatch):
    """config.load(keep=False), as the read-only tools load it: no cache key made
    where there is none, no entry written in the state dir or /var/cache/hami;
    an entry a create kept is still used."""
    from hami_runtime import config
    monkeypatch.setattr(config_cache, "KEY_DIR", str(tmp_path / "var-lib-hami"))
    monkeypatch.setattr(config_cache, "PERSISTENT_DIR", str(tmp_path / "var-cache-hami"))
    monkeypatch.setattr(config_cache, "SETTLED_NS", 0)
    state = tmp_path / "state"
    path = tmp_path / "hami.toml"
    path.write_text(f'state_dir = "{state}"\nsplit_count = 4\n')
    assert config.load(str(path), keep=False).split_count == 4
    assert sorted(os.listdir(tmp_path)) == ["hami.toml"]
    config.load(str(path))  # as a create: the key, the entry and its persistent copy
    assert (state / "cache" / "config.json").exists()
    monkeypatch.setattr("hami_runtime.config_model.validate", None)  # a hit reads no model
    (state / "cache" / "config.json").unlink()  # a miss here: found in the persistent copy
    before = listing(tmp_path)
    assert config.load(str(path), keep=False).split_count == 4
    assert listing(tmp_path) == before  # not copied back into the state dir
