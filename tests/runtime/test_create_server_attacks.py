"""The create server against whoever can reach its socket: a listener renamed
over it gets nothing from a launcher, a stopped server or a full backlog costs a
create its 2 s at most, a flood of connections costs the server's own service
and never the node's memory. Through the real launcher and real runc on the
simulated GPU; each test ends with its own processes gone and the node serving."""
import json
import os
import signal
import socket
import subprocess
import sys
import time

import pytest

from hami_runtime.lifecycle.serving import create_server

from .node import LAUNCHER
from .test_create_server import (GPU, answering, create, ended, no_requests_in_flight, served,  # noqa: F401
                                 server_pids, socket_path)
from tests.conftest import children_of, serving_children

pytestmark = pytest.mark.skipif(not LAUNCHER.exists(), reason="make build builds the launcher")

ACK_S = 2.0  # the launcher's wait for a server to take a create on (server_client.c)

# A listener renamed over the server's socket (as root in a container given a
# hostPath above the state dir can): it takes anything on ("A" at once) and
# records what each connection brought.
FAKE = """
import json, os, socket, sys
path, out, hand_off = sys.argv[1], sys.argv[2], sys.argv[3] == "1"
listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
listener.bind(path + ".fake")
listener.listen(16)
if hand_off and os.fork():
    os._exit(0)  # the process that listened is gone; its socket lives on in its child
os.rename(path + ".fake", path)
open(out + ".ready", "w").close()
got = []
while True:
    conn, _ = listener.accept()
    data, fds = b"", 0
    conn.settimeout(5.0)
    try:
        conn.sendall(b"A")
        while True:
            chunk, ancillary, _, _ = conn.recvmsg(65536, socket.CMSG_SPACE(64))
            fds += sum(len(p) // 4 for level, kind, p in ancillary if kind == socket.SCM_RIGHTS)
            if not chunk:
                break
            data += chunk
    except OSError:
        pass
    got.append({"bytes": len(data), "fds": fds})
    with open(out + ".tmp", "w") as f:
        json.dump(got, f)
    os.rename(out + ".tmp", out)
"""

IMPOSTORS = {  # how the listener is run, whether it hands its socket on, the launcher's reason
    "another mount namespace": (["unshare", "--mount"], False, "another mount namespace"),
    "another pid namespace": (["unshare", "--pid", "--fork"], False, "another pid namespace"),
    "a listener that has ended": ([], True, "ended"),
    "a process without the server lock": ([], False, "not holding the server lock"),
}


def wait_for(predicate, timeout):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return predicate()


def stop_group(proc):
    """Ends a process started with start_new_session and all it started."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait(10)


@pytest.mark.parametrize("who", list(IMPOSTORS))
def test_an_impersonating_listener_gets_nothing(served, tmp_path, who):
    """The launcher sends no argv, env or fd to a listener that is not this
    node's server: the create runs its own Python and succeeds, the runtime's
    log says why, and once the impostor is gone a server serves again."""
    node = served
    [server] = server_pids(node)
    prefix, hand_off, reason = IMPOSTORS[who]
    out = tmp_path / "fake.json"
    fake = subprocess.Popen(prefix + [sys.executable, "-c", FAKE, socket_path(node), str(out),
                                      "1" if hand_off else "0"], start_new_session=True,
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
    try:
        assert wait_for(lambda: os.path.exists(f"{out}.ready"), 30)
        rc, err, launcher, logged = create(node, "victim", node.bundle("victim", GPU, args=("true",)))
        assert rc == 0, err
        assert logged == launcher  # its own Python
        assert "victim" in node.allocations()
        log = (node.tmp / "hami.log").read_text()
        assert f"warning pid={launcher} create server: the listener on {socket_path(node)} " in log, log
        assert f"is not this node's server ({reason}): nothing sent to it" in log, log
        assert wait_for(out.exists, 10)
        assert json.loads(out.read_text()) == [{"bytes": 0, "fds": 0}]
        assert ended([server])  # the real server saw its socket replaced
    finally:
        stop_group(fake)
    assert node.runtime("delete", "victim", cmd=[str(LAUNCHER)]).returncode == 0
    # the impostor gone, the next GPU create starts a server again (where none started yet)
    rc, err, _, _ = create(node, "after", node.bundle("after", GPU, args=("true",)))
    assert rc == 0, err
    assert answering(node)
    rc, err, launcher, logged = create(node, "served", node.bundle("served", GPU, args=("true",)))
    assert rc == 0, err
    assert logged != launcher


def full_backlog(path) -> list:
    """Connections queued on the listener until the next one would not fit
    (EAGAIN): launchers that passed a stopped server by leave as many."""
    queued = []
    while len(queued) < 4096:
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_NONBLOCK)
        try:
            conn.connect(path)
        except BlockingIOError:
            conn.close()
            return queued
        queued.append(conn)
    raise AssertionError("the listener's backlog never filled")


def timed_create(node, cid):
    started = time.monotonic()
    rc, err, launcher, logged = create(node, cid, node.bundle(cid, GPU, args=("true",)))
    return rc, err, launcher, logged, time.monotonic() - started


def test_a_stopped_server_with_a_full_backlog_is_passed_by_at_once(served):
    """A stopped server costs a create the launcher's 2 s wait; once its backlog
    is full (more launchers than it holds have passed it by) a create does not
    wait at all: it runs its own Python at once. Resumed, the server does
    nothing with what it finds queued."""
    node = served
    [pid] = server_pids(node)
    os.kill(pid, signal.SIGSTOP)
    queued = []
    try:
        rc, err, launcher, logged, waited = timed_create(node, "waited")
        assert rc == 0, err
        assert logged == launcher and waited >= ACK_S
        queued = full_backlog(socket_path(node))
        assert len(queued) >= 64  # the listen backlog (128), less the create above
        for cid in ("full-1", "full-2", "full-3"):
            rc, err, launcher, logged, took = timed_create(node, cid)
            assert rc == 0, err
            assert logged == launcher
            assert took < waited + 1.0, (took, waited)  # generous: no wait beyond a passed-by create's
            assert full_backlog(socket_path(node)) == []  # still full: it was skipped, not waited on
    finally:
        for conn in queued:
            conn.close()
        os.kill(pid, signal.SIGCONT)
    assert answering(node) and no_requests_in_flight(node)
    assert sorted(node.allocations()) == ["full-1", "full-2", "full-3", "waited"]  # nothing done twice
    rc, err, launcher, logged = create(node, "served", node.bundle("served", GPU, args=("true",)))
    assert rc == 0, err
    assert logged != launcher


# Keeps `n` connections open to the server for `seconds`, making a new one for
# each the server closes or answers: "silent" ones send nothing; "partial" ones
# send the start of a request (its fds, a length it never reaches) and stall,
# which a server must fork for to read.
FLOOD = """
import array, os, socket, struct, sys, time
path, n, mode, seconds = sys.argv[1], int(sys.argv[2]), sys.argv[3], float(sys.argv[4])
conns, made, end = [], 0, time.monotonic() + seconds
fds = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [0, 1, 2]).tobytes())]
while time.monotonic() < end:
    alive = []
    for conn in conns:
        try:
            conn.recv(4096)  # answered ("F") or closed: done with
            conn.close()
        except BlockingIOError:
            alive.append(conn)
        except OSError:
            conn.close()
    conns = alive
    while len(conns) < n:
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_NONBLOCK)
        try:
            conn.connect(path)
            if mode == "partial":
                conn.sendmsg([struct.pack("<I", 4096) + b"hami-create-1\\0"], fds)
        except OSError:
            conn.close()
            break  # the backlog is full: later
        conns.append(conn)
        made += 1
    time.sleep(0.05)
print(made)
"""

FLOODS = {  # how the flooder is run, what its connections send
    "silent": ([], "silent"),
    "partial requests": ([], "partial"),
    "silent, from another mount namespace": (["unshare", "--mount"], "silent"),
}


def pss_kib(pid) -> int:
    try:
        with open(f"/proc/{pid}/smaps_rollup") as handle:
            return next(int(line.split()[1]) for line in handle if line.startswith("Pss:"))
    except (OSError, StopIteration):
        return 0


@pytest.mark.parametrize("kind", list(FLOODS))
def test_a_flood_of_connections_costs_only_the_servers_service(served, kind):
    """300 connections held open (remade as the server drops them): the
    server's children stay within its bound (none for silent ones), its memory
    stays small, and GPU creates meanwhile succeed within a passed-by create's
    time; after it, the server serves again with no child left."""
    node = served
    [server] = server_pids(node)
    prefix, mode = FLOODS[kind]
    seconds = 6.0
    flood = subprocess.Popen(prefix + [sys.executable, "-c", FLOOD, socket_path(node), "300", mode, str(seconds)],
                             start_new_session=True, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, text=True)
    most_children = most_pss = 0
    try:
        time.sleep(1.0)  # the flood under way
        for cid in ("f1", "f2", "f3"):
            started = time.monotonic()
            with open(node.tmp / f"{cid}.err", "wb") as err:
                proc = subprocess.Popen([str(LAUNCHER), "--root", str(node.runc_root), "create", "--bundle",
                                         str(node.bundle(cid, GPU, args=("true",))), cid],
                                        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                        stderr=err, env=node.env, cwd=node.tmp)
            while proc.poll() is None:
                most_children = max(most_children, len(serving_children(server)))
                most_pss = max(most_pss, pss_kib(server) + sum(pss_kib(c) for c in children_of(server)))
                time.sleep(0.02)
            took = time.monotonic() - started
            assert proc.returncode == 0, (node.tmp / f"{cid}.err").read_text()
            assert took < ACK_S + 8.0, took  # generous: the 2 s wait at most, then its own Python
        made = int(flood.communicate(timeout=seconds + 30)[0])
    finally:
        stop_group(flood)
    assert made >= 300
    assert most_children <= create_server.MAX_CHILDREN
    if mode == "silent":
        assert most_children <= 2  # the creates' own, at most: a silent connection is never forked for
    assert most_pss < 256 * 1024, most_pss  # KiB, the server and its children (its spare too) together
    assert server_pids(node) == [server]
    assert no_requests_in_flight(node, timeout=10)
    assert sorted(node.allocations()) == ["f1", "f2", "f3"]
    rc, err, launcher, logged = create(node, "served", node.bundle("served", GPU, args=("true",)))
    assert rc == 0, err
    assert logged != launcher
