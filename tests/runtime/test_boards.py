"""The boards: every GPU container's activity stamp is linked on the activity
board of each of its GPUs, a high-priority one's also on the priority board, a
low-priority one's not; freeing the allocation unlinks them; the container gets
the boards read-only and its stamps read-write; nothing a caller or a container
names reaches a path unchecked."""
import json
import os
import stat
import time

import pytest

from hami_runtime.errors import HamiError
from hami_runtime.lifecycle.node_state import boards, container_files, state_layout, store

UUID_A = "GPU-453c5d90-9eaf-43fa-be71-c8ae8fc44d65"
UUID_B = "GPU-da942c99-406e-4954-8dfc-5fec34eaffef"
NAME = f"box@{'0' * 16}"


@pytest.fixture
def state_dir(tmp_path):
    state = tmp_path / "state"
    state.mkdir()
    state_layout.make_dirs(str(state), NAME)
    boards.make_stamps(str(state), NAME, [UUID_A, UUID_B])
    return state


def stamp(state, name, uuid):
    return state / "containers" / name / boards.STAMP_DIR / uuid


def entry(state, uuid, name=NAME):
    return state / boards.PRIORITY / uuid / name


def same_file(a, b):
    sa, sb = os.stat(a, follow_symlinks=False), os.stat(b, follow_symlinks=False)
    return (sa.st_dev, sa.st_ino) == (sb.st_dev, sb.st_ino)


def test_stamps_are_zeroed_files_any_container_user_may_write(state_dir):
    for uuid in (UUID_A, UUID_B):
        st = os.stat(stamp(state_dir, NAME, uuid))
        assert stat.S_ISREG(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o666
        assert stamp(state_dir, NAME, uuid).read_bytes() == bytes(boards.STAMP_BYTES)


def test_stamp_size_is_libvgpus():
    header = (boards.__file__.rsplit("/hami_runtime/", 1)[0] + "/libvgpu_src/activity.h")
    with open(header) as handle:
        assert f"#define HAMI_STAMP_BYTES {boards.STAMP_BYTES}\n" in handle.read()


def test_every_container_joins_the_activity_board_of_its_gpus(state_dir):
    boards.join(str(state_dir), NAME, [UUID_A])
    boards.join(str(state_dir), NAME, [UUID_A])   # idempotent
    assert os.listdir(state_dir / "activity" / UUID_A) == [NAME]
    assert same_file(state_dir / "activity" / UUID_A / NAME, stamp(state_dir, NAME, UUID_A))
    assert not (state_dir / "activity" / UUID_B).exists()
    assert not (state_dir / "priority").exists() or os.listdir(state_dir / "priority") == []


def test_high_priority_links_its_stamps_low_unlinks_them(state_dir):
    boards.set_priority(str(state_dir), NAME, [UUID_A, UUID_B], 0)
    for uuid in (UUID_A, UUID_B):
        assert same_file(entry(state_dir, uuid), stamp(state_dir, NAME, uuid))
    boards.set_priority(str(state_dir), NAME, [UUID_A, UUID_B], 0)   # idempotent
    assert sorted(os.listdir(state_dir / "priority" / UUID_A)) == [NAME]
    boards.set_priority(str(state_dir), NAME, [UUID_A, UUID_B], 1)
    assert not entry(state_dir, UUID_A).exists() and not entry(state_dir, UUID_B).exists()
    # the GPU dirs stay: containers have the board mounted and watch them
    assert (state_dir / "priority" / UUID_A).is_dir()


def test_a_replaced_stamp_is_relinked(state_dir):
    boards.set_priority(str(state_dir), NAME, [UUID_A], 0)
    path = stamp(state_dir, NAME, UUID_A)
    path.unlink()
    path.write_bytes(bytes(64))
    boards.set_priority(str(state_dir), NAME, [UUID_A], 0)
    assert same_file(entry(state_dir, UUID_A), path)


def test_a_stamp_that_is_a_symlink_is_never_linked(state_dir, tmp_path):
    outside = tmp_path / "host-file"
    outside.write_bytes(bytes(64))
    path = stamp(state_dir, NAME, UUID_A)
    path.unlink()
    path.symlink_to(outside)
    boards.set_priority(str(state_dir), NAME, [UUID_A], 0)
    assert not os.path.lexists(entry(state_dir, UUID_A))


def test_a_symlinked_activity_dir_is_not_followed(state_dir, tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / UUID_A).write_bytes(bytes(64))
    activity = state_dir / "containers" / NAME / boards.STAMP_DIR
    for child in activity.iterdir():
        child.unlink()
    activity.rmdir()
    activity.symlink_to(elsewhere)
    with pytest.raises(HamiError):
        boards.set_priority(str(state_dir), NAME, [UUID_A], 0)
    assert not os.path.lexists(entry(state_dir, UUID_A))


@pytest.mark.parametrize("name,uuids,priority", [
    ("../escape@0000000000000000", [UUID_A], 0),
    ("box", [UUID_A], 0),                       # no root key
    (f"a/b@{'0' * 16}", [UUID_A], 0),
    (NAME, ["../../etc"], 0),
    (NAME, ["GPU/x"], 0),
    (NAME, [".hidden"], 0),
    (NAME, [""], 0),
    (NAME, [UUID_A], 2),
    (NAME, [UUID_A], True),
])
def test_bad_names_never_reach_a_path(state_dir, name, uuids, priority):
    before = sorted(str(p) for p in state_dir.parent.rglob("*"))
    with pytest.raises(HamiError):
        boards.set_priority(str(state_dir), name, uuids, priority)
    if priority in (0, 1) and not isinstance(priority, bool):   # the name or a UUID is bad
        with pytest.raises(HamiError):
            boards.make_stamps(str(state_dir), name, uuids)
    assert sorted(str(p) for p in state_dir.parent.rglob("*")) == before


def test_release_and_sweep_leave_only_live_entries(state_dir):
    other, gone = f"other@{'1' * 16}", f"gone@{'2' * 16}"
    for name in (other, gone):
        state_layout.make_dirs(str(state_dir), name)
        boards.make_stamps(str(state_dir), name, [UUID_A])
        boards.join(str(state_dir), name, [UUID_A])
    boards.join(str(state_dir), NAME, [UUID_A, UUID_B])
    boards.set_priority(str(state_dir), NAME, [UUID_A, UUID_B], 0)
    boards.set_priority(str(state_dir), other, [UUID_A], 0)
    # the state says `other` is low priority now, NAME holds only UUID_A, `gone` is gone
    allocations = {NAME: {"priority": 0, "devices": [{"uuid": UUID_A}]},
                   other: {"priority": 1, "devices": [{"uuid": UUID_A}]}}
    boards.sweep(str(state_dir), allocations)
    assert os.listdir(state_dir / "priority" / UUID_A) == [NAME]
    assert os.listdir(state_dir / "priority" / UUID_B) == []
    assert sorted(os.listdir(state_dir / "activity" / UUID_A)) == sorted([NAME, other])
    assert os.listdir(state_dir / "activity" / UUID_B) == []
    with store.transaction(str(state_dir), reconcile=False) as state:
        state.release(NAME)
    assert os.listdir(state_dir / "priority" / UUID_A) == []
    assert os.listdir(state_dir / "activity" / UUID_A) == [other]


# ---- through the create path (runc, the simulated GPU) ----

def board_entries(node, board="priority"):
    root = node.state_dir / board
    return {uuid: sorted(os.listdir(root / uuid)) for uuid in os.listdir(root)} if root.exists() else {}


def spec_of(bundle):
    return json.loads((bundle / "config.json").read_text())


@pytest.mark.parametrize("priority,linked", [("0", True), ("1", False), (None, False)])
def test_create_links_only_high_priority_and_delete_unlinks(node, priority, linked):
    request = {"hami.io/gpumem": "1000"}
    if priority is not None:
        request["hami.io/priority"] = priority
    bundle = node.bundle("c", request)
    proc = node.create("c", bundle)
    assert proc.returncode == 0, proc.stderr
    name, alloc = next(iter(node.state()["allocations"].items()))
    uuid = alloc["devices"][0]["uuid"]
    own = node.state_dir / "containers" / name / "activity" / uuid
    assert own.read_bytes() == bytes(64)
    assert board_entries(node, "activity") == {uuid: [name]}
    assert same_file(node.state_dir / "activity" / uuid / name, own)
    if linked:
        assert board_entries(node) == {uuid: [name]}
        assert same_file(node.state_dir / "priority" / uuid / name, own)
    else:
        assert all(name not in names for names in board_entries(node).values())

    spec = spec_of(bundle)
    mounts = {m["destination"]: m for m in spec["mounts"]}
    for board in ("priority", "activity"):
        mounted = mounts[f"/.hami/{board}"]
        assert mounted["source"] == str(node.state_dir / board) and "ro" in mounted["options"]
    assert "rw" in mounts["/.hami/shared"]["options"]

    assert node.runtime("delete", "c").returncode == 0
    for board in ("priority", "activity"):
        assert all(name not in names for names in board_entries(node, board).values())
    assert not (node.state_dir / "containers" / name).exists()


def test_idle_time_comes_from_the_node_config(node):
    node.write_config(priority_idle_ms=50)
    bundle = node.bundle("c", {"hami.io/gpumem": "1000", "hami.io/priority": "0"})
    assert node.create("c", bundle).returncode == 0
    name = state_layout.alloc_name(str(node.runc_root), "c")
    with container_files.open_limits(str(node.state_dir), name) as limits:
        assert limits.priority_idle_ms == 50


def test_a_high_priority_container_sees_the_board_read_only(node):
    """Inside, the board entry is its own stamp (one device and inode, as libvgpu
    compares them), and writing the
    board fails while writing the stamp works."""
    bundle = node.bundle("hi", {"hami.io/gpumem": "1000", "hami.io/priority": "0"}, args=(
        "sh", "-c",
        'u=$(ls /.hami/shared/activity); e=$(ls /.hami/priority/$u); '
        'stat -c %d:%i /.hami/shared/activity/$u /.hami/priority/$u/$e; '
        'echo x > /.hami/priority/$u/$e && echo board-writable; '
        'echo x > /.hami/shared/activity/$u && echo stamp-writable'))
    proc = node.runtime("run", "--bundle", str(bundle), "hi")
    out = (proc.stdout + proc.stderr)
    assert proc.returncode == 0, out
    inodes = [line for line in proc.stdout.splitlines() if line.replace(":", "").isdigit()]
    assert len(inodes) == 2 and inodes[0] == inodes[1], out
    assert "board-writable" not in proc.stdout and "stamp-writable" in proc.stdout, out


@pytest.mark.timeout(300)
def test_low_priority_container_waits_for_a_high_priority_one(node):
    """The whole chain, two containers on one GPU: the low one's kernel loop
    nearly stops while the high one works and goes on after it. Direction only."""
    uuid = json.loads(node.hamictl("gpus", "--json").stdout)[0]["uuid"]
    start_at = time.monotonic_ns() + int(2e9)

    def container(cid, priority, at_s, seconds):
        return node.start_load(cid, {"hami.io/gpumem": "1000", "hami.io/gpu-uuid": uuid,
                                     "hami.io/priority": priority}, seconds, start_at + int(at_s * 1e9))

    low = container("low", "1", 0.0, 5.0)
    time.sleep(max(0.0, (start_at - time.monotonic_ns()) / 1e9 + 1.5))
    high = container("high", "0", 2.0, 1.5)
    results = {cid: node.load_result(cid, proc, 60) for cid, proc in (("high", high), ("low", low))}
    tenths = results["low"]["per_tenth"]
    began = 2.0 + results["high"]["ready_s"]     # the high one launches once it is ready

    def rate(begin, end):
        part = tenths[int(begin * 10):int(end * 10)]
        return sum(part) / max(len(part), 1)

    series = f"high launching from {began:.2f} s; low per tenth: " + " ".join(map(str, tenths))
    alone, during, after = rate(0.3, began - 0.1), rate(began + 0.8, 3.5), rate(4.5, 5.0)
    assert alone >= 5 and during <= 0.25 * alone and after >= 0.6 * alone, series
    assert results["high"]["completed"] >= 0.7 * 150, results["high"]
