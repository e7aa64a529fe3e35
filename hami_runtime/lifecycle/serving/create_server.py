"""The create server: a Python that has loaded the runtime already, so that a
GPU create through the launcher costs a fork instead of an interpreter start
and its imports (on a node, the larger part of a create).

The launcher starts it, detached, from a create that found none answering
(hami_runtime/launcher/server_client.c), handing it the lock
<state_dir>/server/lock already taken, so that one server at most runs per
state dir. It imports every module of the runtime, has the caches a create
reads filled (the config validated; the GPUs and driver files discovered, in a
child of its own: NVML never starts in the process that forks), then listens
on <state_dir>/server/socket (0600, in the host-only state dir).

A request is a launcher's whole command (a create or run, or a delete's
release): its argv, env, cwd, umask and its stdin, stdout and stderr (passed
as fds). Each is served by a child: the *spare*, forked ahead of the request
and set up as a child already (named SPARE_NAME while it waits), to which the
server hands the connection, forking the next spare once it has; or, where
none waits (the spare gone, or a fork refused), one forked for it. (A fork of
this process and its child's start were half of a served create's handoff:
BENCHMARKS.md.) The
child takes on those, runs the command as `python -m hami_runtime` would
(command.run), with the launcher's pid as the create's (the process that becomes
runc), and answers "exec this runtime", "exit with this status" or "do it
yourself" (a request it will not serve: another uid, another mount or pid
namespace or root, another protocol). Before it runs anything, the child says it has taken
the request on and waits for the launcher's go-ahead: a launcher that waited
for that in vain (a stopped server) has run the command itself, and the child
does nothing. The launcher then execs runc itself, so the engine's
child is runc as before. Nothing in a request widens what the launcher could do
alone: the peer is a process of our own uid (SO_PEERCRED) that could run the
same command directly. (The launcher, for its part, sends nothing to a listener
it has not identified as this server: server_client.c.)

A flood costs the server's own service, never the node: a connection is
forked for only once its first bytes have come (one that sends nothing for
IDLE_S is closed), at most MAX_CHILDREN at once (a request beyond that is
declined at once: its launcher runs its own Python), at most MAX_WAITING
connections are held waiting for their first bytes (the rest wait in the
listen backlog, and a launcher that finds it full passes the server by), and a
child gives up on a request not received and taken on within REQUEST_S.

It ends after create_server_idle_s without a request while no GPU container the
state dir allocated lives (while one does, its delete and likely more creates are
to come), when its socket is no longer the one it bound (the state dir removed,
or a newer server), or when a file of its code changed; its socket stays, and
the next create starts a new one (a GPU create after running Python itself).
"""
from __future__ import annotations

import contextlib
import fcntl
import gc
import importlib
import os
import pkgutil
import select
import signal
import socket
import stat
import struct
import sys
import time

from ...files import file_key

PROTOCOL = b"hami-create-1"       # hami_runtime/launcher/server_client.c
SERVER_DIR = "server"
SOCKET_NAME = "socket"
LOCK_NAME = "lock"
LOCK_FD = 3                        # where the launcher hands the lock over
MAX_REQUEST = 4 << 20              # argv and env: above the kernel's exec limit
TICK_S = 1.0
MAX_CHILDREN = 16                  # requests served at once
MAX_WAITING = 64                   # connections accepted, their request not yet come
IDLE_S = 1.0                       # a connection silent this long is closed, unforked
REQUEST_S = 3.0                    # the launcher's wait (2 s) and some: the request received and taken on
TAKEN, GO, DECLINED = b"A", b"G", b"F"
EXEC, EXIT = b"E", b"X"
SPARE_NAME = b"hami-spare"         # the waiting child's name (/proc/<pid>/comm), for tools and tests
PR_SET_NAME = 15                   # prctl's, to set it
HANDED = struct.Struct("<id")      # to the spare, with the connection: its launcher's pid, when accepted


def socket_path(state_dir: str) -> str:
    return os.path.join(state_dir, SERVER_DIR, SOCKET_NAME)


def lock_path(state_dir: str) -> str:
    return os.path.join(state_dir, SERVER_DIR, LOCK_NAME)


def serve() -> int:
    from ... import config
    try:
        cfg = config.load(remember=True)  # its children's, while the file stays as it is
    except Exception:  # the create that needs it reports it
        return 1
    if not cfg.create_server_idle_s or not _holds_lock(cfg.state_dir):
        return 1
    code = _load_everything()
    _warm_caches()
    listener = _listen(socket_path(cfg.state_dir))
    bound = os.stat(socket_path(cfg.state_dir))
    world = _world("self")

    def ended() -> bool:
        return not _still_ours(cfg.state_dir, bound) or _changed(code)
    _normal_priority()
    wake_up, woken = socket.socketpair()  # a child's end (SIGCHLD) wakes the loop
    for end in (wake_up, woken):
        end.setblocking(False)
    signal.set_wakeup_fd(woken.fileno())
    signal.signal(signal.SIGCHLD, lambda *_: None)
    gc.freeze()  # what the imports made stays shared with the children
    gc.enable()  # a long life: its exceptions' cycles are collected
    children: set = set()
    waiting: dict = {}  # connection: (when accepted, its launcher's pid)
    spare = None  # (pid, the socket it waits on)
    last = checked = time.monotonic()
    while True:  # it ends leaving its socket: the next create starts another
        _reap(children)
        now = time.monotonic()
        for conn in [c for c, (since, _) in waiting.items() if now - since >= IDLE_S]:
            del waiting[conn]
            conn.close()
        if spare is None:
            spare = _fork_spare((listener, wake_up, woken, *waiting))
        watched = [wake_up, *waiting] + ([listener] if len(waiting) < MAX_WAITING else [])
        soonest = min((since + IDLE_S - now for since, _ in waiting.values()), default=TICK_S)
        readable = select.select(watched, [], [], max(0.0, min(TICK_S, soonest)))[0]
        now = time.monotonic()
        if now >= checked + TICK_S:  # a flood does not keep it from seeing it should end
            checked = now
            if ended():
                return 0
            if now - last > cfg.create_server_idle_s and not waiting:
                if not _gpu_containers_alive(cfg.state_dir):
                    return 0
                last = now  # their deletes, and likely more creates, are to come: another idle span
        for ready in readable:
            if ready is wake_up:
                with contextlib.suppress(OSError):
                    while wake_up.recv(4096):
                        pass
            elif ready is listener:
                _accept(listener, waiting, world)
            else:
                since, pid = waiting.pop(ready)
                with ready:
                    if not _has_bytes(ready):
                        continue
                    if len(children) >= MAX_CHILDREN:
                        _decline(ready)  # busy: its launcher runs its own Python at once
                        continue
                    last = time.monotonic()
                    if ended():
                        _decline(ready)
                        return 0
                    if spare is not None and _hand_over(spare[1], ready, pid, since):
                        children.add(spare[0])
                    else:
                        child = os.fork()
                        if child == 0:
                            _child(ready, pid, since, (listener, wake_up, woken, *waiting))
                        children.add(child)
                    if spare is not None:
                        spare[1].close()
                        spare = None


def _accept(listener: socket.socket, waiting: dict, world: tuple) -> None:
    """A connection waits for its request; one not of our uid and `world` is
    declined at once."""
    try:
        conn, _ = listener.accept()
    except OSError:  # gone already, or out of fds: the next round
        return
    conn.setblocking(False)
    try:
        pid, uid, _ = struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))
    except OSError:
        pid = uid = -1
    if uid != os.geteuid() or pid <= 0 or _world(pid) != world:
        _decline(conn)
        conn.close()
        return
    waiting[conn] = (time.monotonic(), pid)


def _decline(conn: socket.socket) -> None:
    """Says no: the launcher runs the command itself (one gone needs nothing)."""
    with contextlib.suppress(OSError):
        conn.send(DECLINED)


def _has_bytes(conn: socket.socket) -> bool:
    """Its first bytes have come (not its end): a child is worth forking."""
    try:
        return bool(conn.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT))
    except OSError:
        return False


def _reap(children: set) -> None:
    """Waits for the children that have ended, as they end (so their CPU time
    counts in this process's children's, as a create's would in its engine's)."""
    with contextlib.suppress(ChildProcessError):
        while (pid := os.waitpid(-1, os.WNOHANG)[0]):
            children.discard(pid)


def _holds_lock(state_dir: str) -> bool:
    """fd 3 is the state dir's server lock, taken (the launcher took it)."""
    try:
        held, named = os.fstat(LOCK_FD), os.stat(lock_path(state_dir), follow_symlinks=False)
        fcntl.flock(LOCK_FD, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return False
    return stat.S_ISREG(named.st_mode) and (held.st_dev, held.st_ino) == (named.st_dev, named.st_ino)


def _load_everything() -> list:
    """Imports every module of the runtime (but its tools and its __main__),
    pydantic's model included; returns the identity of their files and of the
    interpreter's."""
    import hami_runtime
    for info in pkgutil.walk_packages(hami_runtime.__path__, "hami_runtime."):
        if not info.name.startswith("hami_runtime.tools") and not info.name.endswith("__main__"):
            importlib.import_module(info.name)
    files = [m.__file__ for name, m in list(sys.modules.items())
             if name.startswith("hami_runtime") and getattr(m, "__file__", None)]
    files.append(sys.executable)  # replaced, launchers no longer know this server for theirs
    return [(path, _identity(path)) for path in files]


def _identity(path: str):
    try:
        return file_key(path, os.stat(path))
    except OSError:
        return None


def _changed(code: list) -> bool:
    return any(_identity(path) != identity for path, identity in code)


def _warm_caches() -> None:
    """The warm-up, in a child: discovery may start NVML, which a process that
    forks must not have started."""
    pid = os.fork()
    if pid == 0:
        from .warm_up import warm_up
        os._exit(warm_up())
    os.waitpid(pid, 0)


def _listen(path: str) -> socket.socket:
    """Bound under a name of its own, then renamed over `path`: a stale socket
    of a server that died is replaced at once."""
    os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
    fresh = f"{path}.{os.getpid()}"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old = os.umask(0o077)
    try:
        listener.bind(fresh)
        listener.listen(128)
        os.rename(fresh, path)
    except OSError:
        with contextlib.suppress(OSError):
            os.unlink(fresh)
        raise
    finally:
        os.umask(old)
    listener.setblocking(False)
    return listener


def _gpu_containers_alive(state_dir: str) -> bool:
    """An allocation of the state dir names a GPU container that lives (its create runs, or
    runc keeps it); a state that cannot be read names none."""
    from ...errors import HamiError
    from ..node_state import store
    try:
        state = store.snapshot(state_dir)
    except HamiError:
        return False
    return bool(set(state.allocations) - set(state.dead()))


def _still_ours(state_dir: str, bound) -> bool:
    try:
        st = os.stat(socket_path(state_dir), follow_symlinks=False)
    except OSError:
        return False
    return (st.st_dev, st.st_ino) == (bound.st_dev, bound.st_ino)


def _normal_priority() -> None:
    """The launcher starts the server idle (behind whatever the node runs);
    serving, it forks at once. Each child then takes on its launcher's."""
    try:
        os.sched_setscheduler(0, os.SCHED_OTHER, os.sched_param(0))
        os.setpriority(os.PRIO_PROCESS, 0, 0)
    except OSError:
        pass  # not allowed: it stays where it was


def _fork_spare(servers: tuple):
    """(pid, socket) of a spare forked now; None where it cannot be (a request is
    then forked for)."""
    try:
        ours, theirs = socket.socketpair()
    except OSError:
        return None
    try:
        pid = os.fork()
    except OSError:
        ours.close()
        theirs.close()
        return None
    if pid == 0:
        ours.close()
        _spare(theirs, servers)
    theirs.close()
    return pid, ours


def _hand_over(channel: socket.socket, conn: socket.socket, pid: int, accepted: float) -> bool:
    """The connection goes to the spare; False if the spare is gone."""
    try:
        return socket.send_fds(channel, [HANDED.pack(pid, accepted)], [conn.fileno()]) == HANDED.size
    except OSError:
        return False


def _spare(channel: socket.socket, servers: tuple) -> None:
    """The spare: set up as a child ahead of any request, it waits for one
    handed over on `channel` and serves it; it ends with the server (`channel`
    closed) without one."""
    name = _comm()
    _set_comm(SPARE_NAME)
    _become_child(servers)
    try:
        message, fds, _, _ = socket.recv_fds(channel, HANDED.size, 1)
    except OSError:
        os._exit(0)
    if len(fds) != 1 or len(message) != HANDED.size:
        os._exit(0)
    channel.close()
    _set_comm(name)
    pid, accepted = HANDED.unpack(message)
    _serve(socket.socket(fileno=fds[0]), pid, accepted)


def _comm() -> bytes:
    with open("/proc/self/comm", "rb") as handle:
        return handle.read().strip()


def _set_comm(name: bytes) -> None:
    import ctypes
    ctypes.CDLL(None).prctl(PR_SET_NAME, ctypes.c_char_p(name[:15]), 0, 0, 0)


def _become_child(servers: tuple) -> None:
    """What a child of the server is rid of: the server's signals, sockets
    (`servers`), lock and collector."""
    gc.disable()
    signal.set_wakeup_fd(-1)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)  # a delete waits for runc
    for other in servers:
        other.close()
    os.close(LOCK_FD)  # the lock is the server's alone


def _child(conn: socket.socket, pid: int, accepted: float, servers: tuple) -> None:
    """A child forked for the request: see _serve. `servers`: the server's
    sockets, not this child's."""
    _become_child(servers)
    _serve(conn, pid, accepted)


def _serve(conn: socket.socket, pid: int, accepted: float) -> None:
    """Serves the request of launcher `pid`, whose connection was accepted at
    `accepted` (time.monotonic), and ends the process. Without an answer (the
    request not received and taken on within REQUEST_S, or this process died
    before it could answer), the launcher runs the command itself."""
    deadline = accepted + REQUEST_S
    try:
        request = _receive(conn, pid, deadline)
        if request is None:
            conn.sendall(DECLINED)
        elif _go_ahead(conn, deadline):
            conn.settimeout(None)  # taken on: the command takes what it takes
            conn.sendall(_run(*request, accepted=accepted))
        conn.shutdown(socket.SHUT_RDWR)  # the launcher reads to the end: now, not once this process is torn down
    except (OSError, ValueError):
        pass  # the launcher gone, or the request broken
    finally:
        os._exit(0)


def _until(conn: socket.socket, deadline: float) -> socket.socket:
    """conn, its next wait bounded by `deadline` (past it: socket.timeout)."""
    left = deadline - time.monotonic()
    if left <= 0:
        raise socket.timeout("the request's deadline passed")
    conn.settimeout(left)
    return conn


def _go_ahead(conn: socket.socket, deadline: float) -> bool:
    """Tells the launcher the request is taken on; true once it says to go on
    (a launcher that gave up waiting has closed, and runs the command itself)."""
    _until(conn, deadline).sendall(TAKEN)
    return _until(conn, deadline).recv(1) == GO


def _receive(conn: socket.socket, pid: int, deadline: float):
    """(pid, fds, cwd, umask, argv, env) of a request of this server's
    protocol, received by `deadline`, or None."""
    data, ancillary, _, _ = _until(conn, deadline).recvmsg(65536, socket.CMSG_SPACE(3 * 4))
    fds = [fd for level, kind, payload in ancillary
           if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS
           for fd in struct.unpack(f"{len(payload) // 4}i", payload[:len(payload) // 4 * 4])]
    if len(fds) != 3 or len(data) < 4:
        return None
    size = struct.unpack("<I", data[:4])[0]
    if size > MAX_REQUEST:
        return None
    parts = [data[4:]]
    received = len(data) - 4
    while received < size:
        chunk = _until(conn, deadline).recv(min(1 << 20, size - received))
        if not chunk:
            return None
        parts.append(chunk)
        received += len(chunk)
    fields = b"".join(parts).split(b"\0")
    if len(fields) < 5 or fields[0] != PROTOCOL or fields[-1] != b"":
        return None
    cwd, umask, argc = fields[1], int(fields[2], 8), int(fields[3])
    if not 1 <= argc <= len(fields) - 5:
        return None
    argv = [os.fsdecode(a) for a in fields[4:4 + argc]]
    env = [e.partition(b"=") for e in fields[4 + argc:-1]]
    return pid, fds, cwd, umask, argv, {k: v for k, sep, v in env if k and sep}


def _world(pid) -> tuple:
    """How a process sees files and pids: its mount and pid namespaces and its
    root (a launcher's pid is what the create records as its creator); () if
    it is gone."""
    try:
        return tuple((st.st_dev, st.st_ino) for st in (os.stat(f"/proc/{pid}/{what}")
                                                       for what in ("ns/mnt", "ns/pid", "root")))
    except OSError:
        return ()


def _run(pid: int, fds: list, cwd: bytes, umask: int, argv: list, env: dict, accepted: float | None = None) -> bytes:
    """Becomes the launcher's command's Python: its stdio, cwd, umask, env and
    scheduling; runs it; the answer for the launcher. `accepted`: when its
    connection was (the create's trace: the launcher's part and the handoff)."""
    from ... import phases
    from . import command
    _scheduling_of(pid)
    os.umask(umask)
    os.chdir(cwd)
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
        os.close(fd)
    os.environb.clear()
    os.environb.update(env)
    started = phases.launcher_started()  # taken out of the env runc gets, as the launcher's path
    if started is not None and accepted is not None:
        trace = phases.begin(started)
        trace.mark("launcher", int(accepted * 1e9))  # its exec, config and spec read, connect
        trace.mark("handoff")  # accepted, forked, the request received, the go-ahead
        phases.note("served by the create server")
    runtime = []
    try:
        status = command.run(argv[1:], pid, lambda path, _argv: runtime.append(path))
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except OSError:
                pass
    if runtime and status == 0:
        return EXEC + os.fsencode(runtime[0])
    return EXIT + str(status).encode()


def _scheduling_of(pid: int) -> None:
    try:
        os.sched_setscheduler(0, os.sched_getscheduler(pid), os.sched_getparam(pid))
        os.setpriority(os.PRIO_PROCESS, 0, os.getpriority(os.PRIO_PROCESS, pid))
    except OSError:
        pass
