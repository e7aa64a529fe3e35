"""An allocation belongs to (runc root, container id): containerd keeps a runc
root per namespace, and two namespaces may hold the same id at once."""
import multiprocessing
import time

import pytest

from .node import LAUNCHER, RUNTIME, TIMEOUT
from .test_lifecycle import _race_one, needs_launcher

ENTRIES = [pytest.param(RUNTIME, id="python"),
           pytest.param([str(LAUNCHER)], id="launcher", marks=needs_launcher)]

GPU = {"hami.io/gpumem": "1000"}


def rows(node):
    return sorted((r["container"], r["runc_root"], r["memory_mib"]) for r in node.ps())


@pytest.mark.parametrize("cmd", ENTRIES)
def test_two_roots_hold_the_same_id(node, cmd):
    other = node.tmp / "runc-other"
    a = node.create("same", node.bundle("a", GPU), cmd=cmd)
    b = node.runtime("--root", str(other), "create", "--bundle", str(node.bundle("b", GPU)), "same",
                     cmd=cmd)
    assert (a.returncode, b.returncode) == (0, 0), a.stderr + b.stderr
    assert rows(node) == sorted([("same", str(node.runc_root), 1000), ("same", str(other), 1000)])
    assert len(list((node.state_dir / "containers").iterdir())) == 2
    # a delete under a third root (no such container there) touches neither
    stranger = node.runtime("--root", str(node.tmp / "runc-third"), "delete", "same", cmd=cmd)
    assert stranger.returncode != 0
    assert len(rows(node)) == 2
    # deleting one frees that root's allocation only
    assert node.runtime("--root", str(other), "delete", "-f", "same", cmd=cmd).returncode == 0
    assert rows(node) == [("same", str(node.runc_root), 1000)]
    assert node.runtime("delete", "-f", "same", cmd=cmd).returncode == 0
    assert rows(node) == []


@needs_launcher
def test_launcher_delete_returns_runc_status_and_frees_after(node):
    """The launcher answers with runc's delete; the detached release frees the
    allocation in the state file without any further command."""
    assert node.create("d", node.bundle("d", GPU), cmd=[str(LAUNCHER)]).returncode == 0
    missing = node.runtime("delete", "nope", cmd=[str(LAUNCHER)])
    assert missing.returncode == 1 and "does not exist" in missing.stderr
    assert node.runtime("delete", "d", cmd=[str(LAUNCHER)]).returncode == 0
    deadline = time.time() + 10
    while node.allocations() and time.time() < deadline:
        time.sleep(0.05)
    assert node.allocations() == {}
    assert list((node.state_dir / "containers").iterdir()) == []


def test_delete_racing_a_create_in_flight_frees_nothing(node):
    """A create that allocated and has not made its runc container yet: a
    delete of the same id (runc has nothing to delete) leaves its allocation."""
    ctx = multiprocessing.get_context("fork")
    results, hold = ctx.Queue(), ctx.Event()
    bundle = node.bundle("flight", GPU)
    proc = ctx.Process(target=_race_one, args=(node.env, str(node.state_dir),
                                               str(node.runc_root), str(bundle), "flight", results, hold))
    proc.start()
    try:
        assert results.get(timeout=TIMEOUT) == ("flight", "ok")
        assert node.runtime("delete", "flight").returncode != 0
        assert node.runtime("delete", "-f", "flight").returncode == 0  # runc: nothing there
        assert [r["container"] for r in node.ps()] == ["flight"]
    finally:
        hold.set()
        proc.join(TIMEOUT)
    assert node.ps() == []  # its creator gone, no container made: freed
