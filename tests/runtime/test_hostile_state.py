"""The state dir as an attacker or a confused operator leaves it: files that are
not files, forged entries, links out of the state dir, half-made containers.
Each is one clear line naming the path (no hang, the lock released), never
free capacity, never a deletion outside the state dir."""
import json
import os
import subprocess
import time

import pytest

from hami_runtime.lifecycle.node_state import state_layout, store
from hami_runtime.files import process_start

from .node import RUNC, TIMEOUT

GPU = {"hami.io/gpumem": "1000"}


def plant_fifo(path):
    os.mkfifo(path)


def plant_zero_link(path):
    os.symlink("/dev/zero", path)


def plant_zero_node(path):
    os.mknod(path, 0o600 | 0o020000, os.makedev(1, 5))  # a character device, as /dev/zero


def plant_dir(path):
    os.mkdir(path)


def plant_huge(path):
    with open(path, "wb") as handle:
        handle.truncate(store.MAX_STATE_BYTES + 1)


def plant_foreign(path):
    path.write_text('{"version": 2, "allocations": {}}\n')
    os.chown(path, 4242, 4242)


HOSTILE = [
    ("allocations.json", plant_fifo, "is a FIFO"),
    ("allocations.json", plant_zero_link, "is a symbolic link"),
    ("allocations.json", plant_zero_node, "is a character device"),
    ("allocations.json", plant_dir, "is a directory"),
    ("allocations.json", plant_huge, "is larger than"),
    ("allocations.json", plant_foreign, "is owned by uid 4242"),
    ("allocations.lock", plant_fifo, "is a FIFO"),
    ("allocations.lock", plant_zero_link, "is a symbolic link"),
]


@pytest.mark.parametrize("name,plant,message", HOSTILE,
                         ids=[f"{n}-{p.__name__[6:]}" for n, p, _ in HOSTILE])
def test_hostile_state_file_is_one_line_and_no_hang(node, name, plant, message):
    node.state_dir.mkdir()
    path = node.state_dir / name
    plant(path)
    for _ in range(2):  # the second finds the lock free again
        proc = node.create("c", node.bundle(f"c{_}", GPU), log_format="json", timeout=20)
        assert proc.returncode == 1
        assert proc.stderr.startswith(f"hami-runtime: {path}: {message}"), proc.stderr
        assert proc.stderr.count("\n") == 1 and "c" not in node.containers()
        [logged] = (node.tmp / "runc.log").read_text().splitlines()[-1:]
        assert json.loads(logged)["level"] == "error" and str(path) in json.loads(logged)["msg"]
    ps = node.hamictl("ps")
    assert ps.returncode == 1 and str(path) in ps.stderr and message in ps.stderr
    # the operator's doctor names it, and --repair moves it aside
    doctor = node.hamictl("doctor")
    assert doctor.returncode == 1 and f"{path}: {message}" in doctor.stdout
    assert node.hamictl("doctor", "--repair").returncode == 0
    assert not os.path.lexists(path) or os.path.isfile(path) and not os.path.islink(path)
    proc = node.create("after", node.bundle("after", GPU))
    assert proc.returncode == 0, proc.stderr


def write_state(node, entries):
    node.state_dir.mkdir(exist_ok=True)
    (node.state_dir / "allocations.json").write_text(json.dumps(
        {"version": store.VERSION, "allocations": entries}))


def forged(node, uuid, cid="forged", **device):
    """An entry whose creator is alive (this test), so that no reconcile drops it."""
    entry = {"id": cid, "runc_root": str(node.runc_root), "bundle": "/nowhere",
             "devices": [{"index": 0, "uuid": uuid, "mem_mib": 1000, "cores": 0, **device}],
             "core_policy": "default", "priority": 1, "pid": 0,
             "creator": {"pid": os.getpid(), "start": process_start(os.getpid())}}
    return {state_layout.alloc_name(str(node.runc_root), cid): entry}


def gpu_uuid(node, index=0):
    return json.loads(node.hamictl("gpus", "--json").stdout)[index]["uuid"]


@pytest.mark.parametrize("device,reason", [
    ({"mem_mib": -16384}, "mem_mib=-16384 is not a whole number"),
    ({"cores": -100}, "cores=-100 is not a whole number"),
    ({"mem_mib": "1000"}, "mem_mib='1000' is not a whole number"),
    ({"mem_mib": True}, "mem_mib=True is not a whole number"),
    ({"extra": 1}, "must have exactly index, uuid, mem_mib, cores"),
])
def test_forged_entry_is_reported_and_never_free(node, device, reason):
    uuid = gpu_uuid(node)
    write_state(node, forged(node, uuid, **device))
    request = {"hami.io/gpumem": "100", "hami.io/gpu-uuid": uuid}
    proc = node.create("c", node.bundle("c", request))
    assert proc.returncode == 1 and "invalid state entry" in proc.stderr and "hamictl doctor" in proc.stderr
    ps = node.hamictl("ps", "--json")
    assert ps.returncode == 0 and json.loads(ps.stdout) == []
    assert "invalid state entry 'forged@" in ps.stderr and reason in ps.stderr
    gpus = json.loads(node.hamictl("gpus", "--json").stdout)
    assert gpus[0]["blocked"] and not gpus[1]["blocked"]
    doctor = node.hamictl("doctor")
    assert doctor.returncode == 1 and reason in doctor.stdout
    repaired = node.hamictl("doctor", "--repair")
    assert repaired.returncode == 0 and "dropped" in repaired.stdout
    assert node.hamictl("doctor").stdout.endswith("state is sound, 0 allocation(s)\n")
    proc = node.create("c2", node.bundle("c2", request))
    assert proc.returncode == 0, proc.stderr


def test_entry_larger_than_its_gpu_holds_the_gpu(node):
    uuid = gpu_uuid(node)
    write_state(node, forged(node, uuid, mem_mib=10 ** 6))
    proc = node.create("c", node.bundle("c", {"hami.io/gpumem": "100", "hami.io/gpu-uuid": uuid}))
    assert proc.returncode == 1 and "holds 1000000 MiB" in proc.stderr
    doctor = node.hamictl("doctor")
    assert doctor.returncode == 1 and "holds 1000000 MiB of GPU" in doctor.stdout


@pytest.mark.parametrize("sub", state_layout.SUBDIRS)
def test_symlinked_subdir_is_refused_and_nothing_outside_is_deleted(node, tmp_path, sub):
    outside = tmp_path / "outside"
    (outside / "victim").mkdir(parents=True)
    (outside / "victim" / "data").write_text("keep me")
    node.state_dir.mkdir()
    (node.state_dir / sub).symlink_to(outside)
    proc = node.create("c", node.bundle("c", GPU))
    assert proc.returncode == 1 and f"{node.state_dir / sub}: is a symbolic link" in proc.stderr
    assert node.hamictl("ps").returncode == 1
    assert (outside / "victim" / "data").read_text() == "keep me"
    assert node.hamictl("doctor", "--repair").returncode == 0
    assert (outside / "victim" / "data").read_text() == "keep me"
    assert node.create("c", node.bundle("c2", GPU)).returncode == 0


def test_link_inside_a_subdir_is_removed_not_followed(node, tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "data").write_text("keep me")
    (node.state_dir / "containers").mkdir(parents=True)
    (node.state_dir / "containers" / "x@0123456789abcdef").symlink_to(outside)
    assert node.create("c", node.bundle("c", GPU)).returncode == 0
    assert (outside / "data").read_text() == "keep me"
    assert not os.path.lexists(node.state_dir / "containers" / "x@0123456789abcdef")


def test_half_made_container_is_freed_at_the_next_transaction(tmp_path):
    """A runc dir without state.json whose creator is gone is a create killed
    half-way: freed. One with state.json is a container runc made: kept."""
    root = tmp_path / "runc"
    dead = subprocess.Popen(["true"])
    dead.wait()
    entries = {}
    for cid, made in (("half", False), ("made", True)):
        (root / cid).mkdir(parents=True)
        if made:
            (root / cid / "state.json").write_text("{}")
        entries[state_layout.alloc_name(str(root), cid)] = {
            "id": cid, "runc_root": str(root), "bundle": "/b", "core_policy": "default",
            "priority": 1, "pid": 0, "creator": {"pid": dead.pid, "start": 1},
            "devices": [{"index": 0, "uuid": "GPU-0", "mem_mib": 1, "cores": 0}]}
    state_dir = tmp_path / "state"
    state_dir.mkdir()
    (state_dir / "allocations.json").write_text(json.dumps({"version": 2, "allocations": entries}))
    with store.transaction(str(state_dir)) as state:
        assert [e["id"] for e in state.allocations.values()] == ["made"]
        assert [state_layout.id_of(n) for n in state.freed] == ["half"]


def test_create_killed_inside_runc_is_freed_without_a_delete(node):
    """runc killed while it runs a createRuntime hook of the spec's own (the
    container half-made): the next transaction frees the GPU."""
    bundle = node.bundle("k", GPU)
    spec = json.loads((bundle / "config.json").read_text())
    spec["hooks"] = {"createRuntime": [{"path": "/bin/sleep", "args": ["sleep", "30"]}]}
    (bundle / "config.json").write_text(json.dumps(spec))
    with open(node.tmp / "k.out", "wb") as out:
        proc = subprocess.Popen(["/bin/sh", "-c", 'exec "$@"', "sh"] + node.runtime_argv(
            "create", "--bundle", str(bundle), "k"), stdin=subprocess.DEVNULL, stdout=out,
            stderr=out, env=node.env, start_new_session=True)
    deadline = time.time() + TIMEOUT
    while not (node.runc_root / "k").exists() and time.time() < deadline:
        time.sleep(0.05)
    time.sleep(0.5)
    assert list(node.allocations()) == ["k"]
    os.killpg(proc.pid, 9)
    proc.wait(TIMEOUT)
    assert node.ps() == []  # dead: not shown, and left for the next transaction (ps makes none)
    with store.transaction(str(node.state_dir)):
        pass
    assert node.allocations() == {}
    subprocess.run([RUNC, "--root", str(node.runc_root), "delete", "-f", "k"], capture_output=True,
                   timeout=TIMEOUT)


@pytest.mark.parametrize("entry", [
    {"id": "../../etc", "runc_root": "/", "creator": "not an object"},
    {"id": "x", "runc_root": "relative/root", "creator": {"pid": "1", "start": []}},
    {"id": 7, "runc_root": None},
    ["not", "an", "object"],
])
def test_garbage_entries_are_invalid_and_never_crash(tmp_path, entry):
    state_dir = tmp_path / "state"
    state_dir.mkdir()
    (state_dir / "allocations.json").write_text(json.dumps(
        {"version": 2, "allocations": {"g@0123456789abcdef": entry}}))
    with store.transaction(str(state_dir)) as state:
        assert state.allocations == {}
        kept = "g@0123456789abcdef" in state.invalid
    # an entry that names a root and an id whose container is gone is dropped;
    # one that names none is kept for the operator (hamictl doctor)
    assert kept is not (isinstance(entry, dict) and isinstance(entry.get("id"), str)
                        and isinstance(entry.get("runc_root"), str))


def test_state_from_before_runc_roots_is_taken_over(node):
    """A node upgraded with a GPU container running: the version 1 state file
    (keyed by id, dirs named by id) is rebuilt with the container accounted,
    its mounted dirs kept while it lives and removed by doctor --repair after."""
    assert node.create("old", node.bundle("old", GPU)).returncode == 0
    [name] = node.state()["allocations"]
    entry = node.state()["allocations"][name]
    for sub in state_layout.SUBDIRS:
        (node.state_dir / sub / name).rename(node.state_dir / sub / "old")
    (node.state_dir / "allocations.json").write_text(json.dumps(
        {"version": 1, "allocations": {"old": entry}}))
    assert [(r["container"], r["memory_mib"]) for r in node.ps()] == [("old", 1000)]  # as rebuilt
    with store.transaction(str(node.state_dir)):
        pass  # the next create or delete rebuilds it (ps writes nothing)
    assert [e["id"] for e in node.state()["allocations"].values()] == ["old"]
    assert (node.state_dir / "containers" / "old").is_dir()
    assert "still there" in node.hamictl("doctor").stdout
    assert node.runtime("delete", "-f", "old").returncode == 0
    assert node.ps() == [] and (node.state_dir / "containers" / "old").is_dir()
    repaired = node.hamictl("doctor", "--repair")
    assert repaired.returncode == 0 and "removed" in repaired.stdout
    assert list((node.state_dir / "containers").iterdir()) == []
    assert list((node.state_dir / "private").iterdir()) == []


@pytest.mark.parametrize("length", [state_layout.MAX_ID + 1, 1000])
def test_an_id_too_long_to_name_the_state_is_refused_and_leaves_nothing(node, length):
    """runc takes ids its own state dir can hold; ours are named <id>@<root key>:
    such an id is refused before anything is written, and the node goes on."""
    cid = "x" * length
    proc = node.create(cid, node.bundle("long", GPU), log_format="json")
    assert proc.returncode == 1
    assert proc.stderr.count("\n") == 1 and "container id=" in proc.stderr \
        and f"at most {state_layout.MAX_ID}" in proc.stderr, proc.stderr
    logged = json.loads((node.tmp / "runc.log").read_text().splitlines()[-1])
    assert logged["level"] == "error" and f"at most {state_layout.MAX_ID}" in logged["msg"]
    assert node.allocations() == {} and cid not in node.containers()
    assert all(not os.listdir(node.state_dir / sub) for sub in state_layout.SUBDIRS
               if (node.state_dir / sub).exists())
    assert node.create("after", node.bundle("after", GPU)).returncode == 0
    for command in (("ps",), ("gpus",), ("doctor",)):
        done = node.hamictl(*command)
        assert done.returncode == 0 and "Traceback" not in done.stderr, (command, done.stderr)


def test_an_entry_that_cannot_be_cleaned_never_blocks_a_create(node):
    """A state file holding an entry whose files cannot be named (as one written by an
    older version for such an id): it is kept apart as invalid, every command still
    answers, and other containers are created."""
    node.state_dir.mkdir()
    cid = "y" * 1000
    long_name = f"{cid}@{state_layout.root_key(str(node.runc_root))}"
    entry = {"id": cid, "runc_root": str(node.runc_root), "bundle": "/nowhere",
             "devices": [{"index": 0, "uuid": "GPU-453c5d90-9eaf-43fa-be71-c8ae8fc44d65",
                          "mem_mib": 1000, "cores": 0}],
             "core_policy": "default", "priority": 1, "pid": 0,
             "creator": {"pid": os.getpid(), "start": process_start(os.getpid())}}
    (node.state_dir / "allocations.json").write_text(json.dumps(
        {"version": 2, "allocations": {long_name: entry}}))
    assert node.create("after", node.bundle("after", GPU)).returncode == 0
    for command in (("ps",), ("gpus",), ("doctor",), ("top", "--interval", "0")):
        done = node.hamictl(*command)
        assert "Traceback" not in done.stderr + done.stdout, (command, done.stderr)
    assert "at most" in node.hamictl("doctor").stdout  # named, for the operator
    assert node.hamictl("doctor", "--repair").returncode == 0
    assert long_name not in json.dumps(node.state())


def test_a_corrupt_state_file_is_set_aside_with_one_line(node):
    """A state file that is not one is kept for the operator beside its name and
    rebuilt from the live containers' bundles by the next create; the one line
    on stderr says so. hamictl ps, which writes nothing, only reports it
    (tests/runtime/test_read_only_tools.py)."""
    assert node.create("kept", node.bundle("kept", GPU)).returncode == 0
    path = node.state_dir / store.STATE_FILE
    path.write_text('{"version": 2, "allocations": {"kept": ')
    proc = node.create("next", node.bundle("next", GPU))
    assert proc.returncode == 0, proc.stderr
    [aside] = [p for p in node.state_dir.iterdir() if p.name.startswith(f"{store.STATE_FILE}.corrupt-")]
    assert aside.read_text() == '{"version": 2, "allocations": {"kept": '
    assert proc.stderr == (f"hami-runtime: {path}: not a state file; set aside as {aside}, "
                           "rebuilt from the running containers' bundles\n"), proc.stderr
    again = node.hamictl("ps", "--json")  # rebuilt and written back: nothing more to say
    assert again.returncode == 0 and again.stderr == "", again.stderr
    assert [r["container"] for r in json.loads(again.stdout)] == ["kept", "next"]
    assert node.runtime("delete", "kept").returncode == 0
