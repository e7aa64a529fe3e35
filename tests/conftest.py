"""Paths and helpers every test directory shares."""
import functools
import os
import signal
import subprocess
import tempfile
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


def has_children(pid: int) -> bool:
    """The process has a child (a zombie not yet reaped included); False once it is gone."""
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as handle:
            return bool(handle.read().split())
    except OSError:
        return False


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
