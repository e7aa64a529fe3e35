"""Paths and helpers every test directory shares."""
import contextlib
import fcntl
import functools
import json
import os
import signal
import stat
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
BUILD = ROOT / "build"
SIM = BUILD / "sim"
SIM_LIB = SIM / "lib"
LIBVGPU = BUILD / "libvgpu.so"


@functools.lru_cache(maxsize=None)
def sim_uuids():
    """The simulated cards' UUIDs (the same in every process and run)."""
    with tempfile.TemporaryDirectory() as scratch:
        out = subprocess.run([str(BUILD / "tests" / "vgpu_probe"), "link", "uuids"], check=True,
                             capture_output=True, text=True, timeout=30,
                             env={"LD_LIBRARY_PATH": str(SIM_LIB), "HAMI_SIM_STATE": f"{scratch}/gpu.state"})
    return out.stdout.split()


RUNTIME_MADE = ROOT / "scripts" / "runtime-made.sh"


def runtime_made(limits, region_dir, boards=None, limits_mount="ro"):
    """The argv prefix that runs a program as a process of a runtime-made container
    finds libvgpu's files (scripts/runtime-made.sh: `boards` holds the activity and
    priority boards; `limits_mount` "rw": the limits mounted writable, as no runtime
    mounts them). Needs root, as runc does."""
    return [str(RUNTIME_MADE), str(limits), str(region_dir), str(boards or ""), limits_mount]


class PidService:
    """The simulated driver's host-pid service beside a state file in `directory`
    (tests/simgpu/sim_pid_service.c), which processes in containers ask; it also
    ends with the process that started it."""

    def __init__(self, directory):
        self.proc = subprocess.Popen([str(SIM / "bin" / "hami-sim-pids"), str(Path(directory) / "host-pids.sock")],
                                     stdout=subprocess.PIPE, text=True)
        if self.proc.stdout.readline().strip() != "ready":
            self.stop()
            raise AssertionError("hami-sim-pids did not start")

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
        self.proc.wait(timeout=10)
        self.proc.stdout.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()


def cycles(graph: dict) -> list:
    """The strongly connected parts of more than one node (Tarjan)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(node):
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for other in graph[node]:
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in on_stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            part = set()
            while not part or node not in part:
                part.add(stack.pop())
            on_stack.difference_update(part)
            if len(part) > 1:
                found.append(sorted(part))

    for node in graph:
        if node not in index:
            visit(node)
    return found



def processes_with_env(*entries: bytes) -> list:
    """The live (not zombie) processes whose environment, as they were started
    with it (/proc/<pid>/environ), holds every one of `entries` (b"NAME=value")."""
    found = []
    for pid in (p for p in os.listdir("/proc") if p.isdigit()):
        try:
            with open(f"/proc/{pid}/environ", "rb") as handle:
                env = handle.read().split(b"\0")
            with open(f"/proc/{pid}/stat", "rb") as handle:
                zombie = handle.read().rpartition(b")")[2].split()[0] == b"Z"
        except OSError:
            continue
        if not zombie and all(entry in env for entry in entries):
            found.append(int(pid))
    return found


def is_spare(pid: int) -> bool:
    """A create server's child waiting for a request (create_server.SPARE_NAME)."""
    from hami_runtime.lifecycle.serving.create_server import SPARE_NAME
    try:
        with open(f"/proc/{pid}/comm", "rb") as handle:
            return handle.read().strip() == SPARE_NAME
    except OSError:
        return False


def children_of(pid: int) -> list:
    """The process's children (zombies not yet reaped included); none once it is gone."""
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as handle:
            return [int(child) for child in handle.read().split()]
    except OSError:
        return []


def serving_children(pid: int) -> list:
    """The children of create server `pid` that serve a request: every child but its spare."""
    return [child for child in children_of(pid) if not is_spare(child)]


@pytest.fixture(scope="session", autouse=True)
def no_create_server_left(tmp_path_factory):
    """The create servers the launcher started for this session's nodes end
    (each ends once its socket goes, or idle, too): none is left running."""
    yield
    base = os.fsencode(tmp_path_factory.getbasetemp()) + b"/"
    for pid in processes_with_env(b"HAMI_CREATE_SERVER=1"):
        try:
            with open(f"/proc/{pid}/environ", "rb") as handle:
                if any(e.startswith(b"HAMI_CONFIG=" + base) for e in handle.read().split(b"\0")):
                    os.kill(pid, signal.SIGTERM)
        except OSError:
            continue


# --- What the test session leaves on the host -------------------------------
# Some tests need paths on the host's own disk, outside any tmp dir:
# - /.hami: scripts/runtime-made.sh mounts a tmpfs there in a private mount
#   namespace, but the mount point itself must exist on the real root (no
#   tmpfs can be put over `/` cheaply, and libvgpu's paths are fixed);
# - /usr/local/vgpu: the same, where /usr/local cannot be hidden (see
#   tests/libvgpu/test_runtime_made.py);
# - the runtime, as the tests drive it, keeps its config cache at its real
#   default paths (hami_runtime/config_cache.py): PERSISTENT_DIR
#   (/var/cache/hami), the cache key in KEY_DIR (/var/lib/hami), and the
#   defaults' state dir (/run/hami) when a test runs with no config file.
# The session records, before its first test, which of these exist and what
# they hold, and at its end removes what the tests made there and nothing
# else: files (never followed links, never a dir's contents wholesale) that
# were not there, then dirs that were not there, each with rmdir (so a dir
# someone else filled meanwhile stays). Inside a dir that was there before,
# only files of the cache's own names are removed (a real node's state, in
# /run/hami, is never touched).
# Two sessions may run at once (a second `make test` beside the first): each
# holds HOST_LOCK shared while it runs, and HOST_GUARD is held exclusively
# while a session starts or ends. The first session of a group of
# overlapping ones writes what it found into HOST_RECORD; later ones use that
# record, and only the session that ends last (it can take HOST_LOCK
# exclusively: no other session holds it) cleans up and runs the check
# below, then removes the record. A session that ends while another still
# runs cleans nothing, and says so.
# They live in a dir of ours that no one else may write in (checked), not
# loose in /tmp where another user could plant a link or a record.
HOST_DIR = "/tmp/hami-tests-host"
HOST_GUARD = f"{HOST_DIR}/guard"
HOST_LOCK = f"{HOST_DIR}/lock"
HOST_RECORD = f"{HOST_DIR}/record.json"
HOST_QUIET = 0.5
MADE_BY_TESTS = {  # path -> names a test session may leave in it when it existed before
    "/.hami": (),
    "/usr/local/vgpu": (),
    "/var/cache/hami": ("config-*.json", ".hami-*"),
    "/var/lib/hami": ("cache-key", ".hami-*"),
    "/run/hami": (),
}
# The dirs whose entries must be the same after the session as before it.
WATCHED = ("/", "/usr/local", "/usr/local/lib", "/etc", "/var/cache", "/var/lib", "/run", "/opt")
# What the session may add there: the engines' own state, made when the
# engine tests start dockerd, containerd and podman (and their CNI), which
# live on as any installed engine's would; the package manager's, where a
# test installs what it needs (scripts/install-deps.sh).
ENGINE_STATE = (
    "/var/lib/apt", "/var/lib/dpkg", "/var/cache/apt", "/var/cache/debconf", "/var/lib/ucf",
    "/etc/containerd", "/etc/docker", "/etc/containers", "/etc/cni",
    "/var/lib/containerd", "/var/lib/docker", "/var/lib/containers", "/var/lib/cni",
    "/var/cache/containers",
    "/run/containerd", "/run/docker", "/run/docker.pid", "/run/docker.sock", "/run/containers",
    "/run/libpod", "/run/runc", "/run/crun", "/run/cni", "/run/netns", "/run/user",
    "/opt/containerd", "/opt/cni",
    "/run/mount",  # util-linux's mount table (utab), made by the first `mount` that needs it
)


def _tree(root: str):
    """Every path under root (root included) with whether it is a dir; None when
    root is missing or not a dir (a link is never followed)."""
    try:
        if not stat.S_ISDIR(os.lstat(root).st_mode):
            return None
    except OSError:
        return None
    found = {root: True}
    for top, dirs, files in os.walk(root):
        for name in dirs:  # a link to a dir is listed here, never followed: a file to remove
            found[os.path.join(top, name)] = not os.path.islink(os.path.join(top, name))
        for name in files:
            found[os.path.join(top, name)] = False
    return found


def _listing():
    out = {}
    for d in WATCHED:
        try:
            out[d] = sorted(os.listdir(d))
        except OSError:
            out[d] = []
    return out


def _host_record():
    return {"made": {root: _tree(root) for root in MADE_BY_TESTS}, "listing": _listing()}


def _clean_made(record) -> list:
    """Removes what the tests made under MADE_BY_TESTS (see above); what it removed."""
    from fnmatch import fnmatch
    removed = []
    for root, names in MADE_BY_TESTS.items():
        before, now = record["made"].get(root), _tree(root)
        if now is None:
            continue
        new = [p for p in now if before is None or p not in before]
        if before is not None:  # a dir that was there: only the cache's own files
            new = [p for p in new if not now[p] and os.path.dirname(p) == root
                   and any(fnmatch(os.path.basename(p), n) for n in names)]
        for path in sorted(new, key=len, reverse=True):  # files before the dirs they are in
            try:
                if now[path]:
                    os.rmdir(path)
                elif not stat.S_ISDIR(os.lstat(path).st_mode):
                    os.unlink(path)
                removed.append(path)
            except OSError:
                pass
    return removed


def _new_entries(before) -> list:
    now = _listing()
    new = []
    for d in WATCHED:
        for name in sorted(set(now[d]) - set(before.get(d, []))):
            path = os.path.join(d, name)
            if path == "/tmp" or any(path == e or path.startswith(e + ".") for e in ENGINE_STATE):
                continue
            new.append(path)
    return new


def _write_record(record) -> None:
    temp = f"{HOST_RECORD}.{os.getpid()}"
    with open(temp, "w") as handle:
        json.dump(record, handle)
    os.replace(temp, HOST_RECORD)


def _others_run() -> bool:
    """Whether another session holds HOST_LOCK (call without holding it)."""
    probe = os.open(HOST_LOCK, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(probe, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return False
    except BlockingIOError:
        return True
    finally:
        os.close(probe)


@contextlib.contextmanager
def _guard():
    with contextlib.suppress(FileExistsError):
        os.mkdir(HOST_DIR, 0o700)
    st = os.lstat(HOST_DIR)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o022:
        raise pytest.UsageError(f"{HOST_DIR}: not a dir of ours that only we may write in: remove it")
    fd = os.open(HOST_GUARD, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


@pytest.fixture(scope="session", autouse=True)
def host_left_as_found(request):
    """The session leaves no new path in WATCHED (ENGINE_STATE aside), and
    removes what it made in MADE_BY_TESTS (see the note above). Its name sorts
    before every other autouse fixture's here: set up first, ended last."""
    with _guard():
        record = None
        if _others_run():  # the first of the sessions running recorded the host
            try:
                with open(HOST_RECORD) as handle:
                    record = json.load(handle)
            except (OSError, ValueError):
                pass
        if record is None:  # alone (a record left by a killed session is stale)
            record = _host_record()
            _write_record(record)
        # CLOEXEC: no process the tests start (an engine's daemon) holds it after us
        lock = os.open(HOST_LOCK, os.O_RDWR | os.O_CLOEXEC)
        fcntl.flock(lock, fcntl.LOCK_SH)
    yield
    with _guard():
        os.close(lock)
        if _others_run():
            note = ("note: another test session is running: it removes what the tests made on the "
                    "host and checks that nothing else was left")
            capture = request.config.pluginmanager.get_plugin("capturemanager")
            with capture.global_and_fixture_disabled() if capture else contextlib.nullcontext():
                print(f"\n{note}")
            return
        try:
            with open(HOST_RECORD) as handle:
                record = json.load(handle)
        except (OSError, ValueError):
            pass
        # a process the last test started (a create server, a container's hook)
        # may still load the config, and so write the cache, as the session ends:
        # cleaned until nothing comes back for HOST_QUIET seconds (at most 10 times)
        _clean_made(record)
        for _ in range(10):
            time.sleep(HOST_QUIET)
            if not _clean_made(record):
                break
        left = _new_entries(record["listing"])
        with contextlib.suppress(OSError):
            os.unlink(HOST_RECORD)
    if left:
        pytest.fail("the test session left new paths on the host: " + ", ".join(left), pytrace=False)
