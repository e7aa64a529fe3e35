"""The create server (hami_runtime/lifecycle/serving/create_server.py): started by the
launcher, it serves later GPU creates as their own Python would, to the
launcher's process (its pid, stdio, cwd, env), and steps aside whenever it
cannot: through the real launcher and real runc on the simulated GPU."""
import json
import os
import re
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time

import pytest

from hami_runtime.lifecycle.serving import create_server
from tests.conftest import children_of, is_spare, processes_with_env, serving_children

from .node import LAUNCHER
from .test_launcher_fastpath import holders, settled, warmed

pytestmark = pytest.mark.skipif(not LAUNCHER.exists(), reason="make build builds the launcher")

GPU = {"hami.io/gpumem": "100", "hami.io/gpucores": "30"}


def configure(node, **keys):
    """The node's config with its log (whose lines name the pid that wrote
    them) and `keys`, old enough for the config cache."""
    node.write_config(log_file=str(node.tmp / "hami.log"), **keys)
    settled(node)


def server_pids(node) -> list:
    """The create servers this node's launcher started (their env names its config), and the
    children serving a request (forked from them, the same env); not a spare."""
    return [pid for pid in processes_with_env(b"HAMI_CREATE_SERVER=1", f"HAMI_CONFIG={node.config}".encode())
            if not is_spare(pid)]


def no_requests_in_flight(node, timeout=30.0) -> bool:
    """Waits until the node's servers have no child serving a request."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not any(serving_children(pid) for pid in server_pids(node)):
            return True
        time.sleep(0.02)
    return False


def settled_server_pids(node, timeout=15.0) -> list:
    """server_pids where one server is expected, once no request is in flight and a spare just
    forked has named itself (until it does it bears the server's name)."""
    assert no_requests_in_flight(node, timeout)
    deadline = time.monotonic() + timeout
    pids = server_pids(node)
    while len(pids) > 1 and time.monotonic() < deadline:
        time.sleep(0.02)
        pids = server_pids(node)
    return pids


def socket_path(node):
    return create_server.socket_path(str(node.state_dir))


def answering(node, timeout=60.0) -> bool:
    """Waits until the node's server accepts connections."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
            try:
                probe.connect(socket_path(node))
                return True
            except OSError:
                time.sleep(0.05)
    return False


def ended(pids, timeout=10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not any(os.path.exists(f"/proc/{pid}") and
                   open(f"/proc/{pid}/stat", "rb").read().rpartition(b")")[2].split()[0] != b"Z"
                   for pid in pids if os.path.exists(f"/proc/{pid}")):
            return True
        time.sleep(0.05)
    return False


def create(node, cid, bundle, *flags, cwd=None):
    """A create through the launcher: (returncode, stderr, the launcher's pid, the
    pid in the log line its Python wrote)."""
    log_file = node.tmp / "hami.log"
    before = log_file.read_text() if log_file.exists() else ""
    err = node.tmp / f"{cid}.err"
    with open(err, "wb") as errors:
        proc = subprocess.Popen([str(LAUNCHER), "--root", str(node.runc_root), *flags, "create", "--bundle",
                                 str(bundle), cid], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                stderr=errors, env=node.env, cwd=cwd or node.tmp)
        rc = proc.wait(60)
    logged = log_file.read_text()[len(before):] if log_file.exists() else ""
    pids = re.findall(r" pid=(\d+) " + re.escape(cid) + ":", logged)
    return rc, err.read_text(), proc.pid, int(pids[-1]) if pids else None


@pytest.fixture
def served(node):
    """A node whose server answers (a first GPU create started it)."""
    configure(node)
    rc, err, _, _ = create(node, "first", node.bundle("first", GPU, args=("true",)))
    assert rc == 0, err
    assert answering(node)
    node.runtime("delete", "-f", "first", cmd=[str(LAUNCHER)])
    assert released(node)
    assert no_requests_in_flight(node)  # the release's child gone: server_pids is the server alone
    return node


def released(node, timeout=10.0) -> bool:
    """Waits until the detached release after a delete has freed every allocation."""
    deadline = time.monotonic() + timeout
    while node.allocations() and time.monotonic() < deadline:
        time.sleep(0.05)
    return node.allocations() == {}


def test_a_gpu_create_is_served_once_a_server_runs(node):
    """The first GPU create runs its own Python and starts the server; the next
    is served: by another process than the launcher, with the launcher's pid as
    the allocation's creator (it becomes runc), and the same spec."""
    configure(node)
    specs = {}
    for round_ in ("alone", "served"):
        bundle = node.bundle(f"c-{round_}", GPU, args=("true",))
        rc, err, pid, logged_pid = create(node, "c", bundle)
        assert rc == 0, err
        assert (logged_pid == pid) == (round_ == "alone")
        assert node.allocations()["c"]["creator"]["pid"] == pid
        specs[round_] = re.sub(r'created_at\\*": [0-9.e+]+', "", (bundle / "config.json").read_text())
        assert node.runtime("delete", "c", cmd=[str(LAUNCHER)]).returncode == 0
        assert answering(node)
        assert released(node)
    assert specs["served"] == specs["alone"]
    assert len(settled_server_pids(node)) == 1  # the last release's child (it has the server's env) gone


def spare_of(server: int, timeout=10.0):
    """The server's spare once one waits (None past the timeout)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        spares = [child for child in children_of(server) if is_spare(child)]
        if spares:
            return spares[0]
        time.sleep(0.02)
    return None


def test_a_quiet_server_serves_the_next_create_from_its_spare(served):
    """Once quiet, the server has a child forked ahead, set up, waiting for a request (named
    create_server.SPARE_NAME): the next create is served by that process, with no fork on its
    path, and a new spare waits after it."""
    node = served
    [server] = settled_server_pids(node)
    spare = spare_of(server)
    assert spare is not None
    rc, err, launcher, logged = create(node, "spared", node.bundle("spared", GPU, args=("true",)))
    assert rc == 0, err
    assert logged == spare and node.allocations()["spared"]["creator"]["pid"] == launcher
    assert node.runtime("delete", "-f", "spared", cmd=[str(LAUNCHER)]).returncode == 0
    assert released(node) and no_requests_in_flight(node)
    assert spare_of(server) not in (None, spare)


REFUSALS = [
    ("too-big", {"hami.io/gpumem": "99999999"}, ()),
    ("bad-core-policy", {**GPU, "hami.io/core-policy": "fastest"}, ()),
    ("json-log", {"hami.io/gpumem": "99999999"}, ("--log-format", "json")),
]


@pytest.mark.parametrize("name,annotations,flags", REFUSALS, ids=[r[0] for r in REFUSALS])
def test_a_served_refusal_is_the_one_python_gives(served, name, annotations, flags):
    """The same line on the launcher's stderr, the same exit status and the same
    line in the engine's --log as without the server; nothing allocated."""
    node = served
    answers = {}
    for how in ("served", "alone"):
        if how == "alone":
            configure(node, create_server_idle_s=0)
        log = node.tmp / f"{name}-{how}.log"
        rc, err, _, _ = create(node, f"{name}-{how}", node.bundle(f"{name}-{how}", annotations),
                               "--log", str(log), *flags)
        entry = log.read_text().strip() if log.exists() else ""
        entry = json.loads(entry)["msg"] if "json" in flags else re.sub(r'time="[^"]*" ', "", entry)
        answers[how] = (rc, err.replace(f"{name}-{how}", "ID"), entry.replace(f"{name}-{how}", "ID"))
        assert node.allocations() == {}
    assert answers["served"] == answers["alone"]
    assert answers["served"][0] == 1 and answers["served"][1].startswith("hami-runtime: ")


# What a served create adds to what its server loaded: the server's imports, then
# creates as its children run them (command.run, the launcher's path in the env); the
# first fills the caches for this env (the test's differs from the fixture's).
SERVED_CREATES = """
import json, os, re, sys
from hami_runtime.lifecycle.serving import command, create_server
create_server._load_everything()
root, bundle = sys.argv[1:]

def served(cid):
    readable, writable = os.pipe()
    pid = os.fork()
    if pid == 0:
        modules, patterns = set(sys.modules), set(re._cache)
        status = command.run(["--root", root, "create", "--bundle", bundle, cid], os.getpid(),
                             lambda path, argv: None)
        os.write(writable, json.dumps({"status": status, "modules": sorted(set(sys.modules) - modules),
                                       "patterns": [key[1] for key in set(re._cache) - patterns]}).encode())
        os._exit(0)
    os.close(writable)
    with os.fdopen(readable, "rb") as answer:
        seen = answer.read()
    os.waitpid(pid, 0)
    return json.loads(seen)

served("probe-1")
print(json.dumps(served("probe-2")))
"""


def test_a_served_create_imports_and_compiles_nothing(served):
    """Whatever a create needs is loaded in the server once, before it forks: a child
    that imported a module or compiled a pattern would pay it in every create (a
    codec's import and four patterns were ~2 ms of a warm create)."""
    node = served
    bundle = node.bundle("probe", GPU, args=("true",))
    out = subprocess.run([sys.executable, "-c", SERVED_CREATES, str(node.runc_root), str(bundle)],
                         env={**node.env, "HAMI_LAUNCHER": str(LAUNCHER)}, stdin=subprocess.DEVNULL,
                         capture_output=True, text=True, timeout=60, cwd=node.tmp)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == {"status": 0, "modules": [], "patterns": []}
    for cid in ("probe-1", "probe-2"):  # no container: their allocations go
        node.runtime("delete", "-f", cid, cmd=[str(LAUNCHER)])
    assert released(node)


def test_a_relative_bundle_is_the_launchers_cwd(served):
    node = served
    bundle = node.bundle("rel", GPU, args=("true",))
    rc, err, pid, logged_pid = create(node, "rel", os.path.relpath(bundle, node.tmp / "bundles"),
                                      cwd=node.tmp / "bundles")
    assert rc == 0, err
    assert logged_pid != pid
    assert "CUDA_DEVICE_MEMORY_LIMIT_0=100m" in (bundle / "config.json").read_text()


def test_the_server_holds_none_of_the_engines_fds(served):
    """A pipe the engine passes the create (fd 3 here) or gives as its stdout is
    not kept by the server once the create returned."""
    node = served
    read_end, write_end = os.pipe()
    inode = os.readlink(f"/proc/self/fd/{write_end}")
    try:
        proc = subprocess.run([str(LAUNCHER), "--root", str(node.runc_root), "create", "--bundle",
                               str(node.bundle("fds", GPU, args=("true",))), "fds"],
                              stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                              env=node.env, pass_fds=(write_end,), timeout=60)
        assert proc.returncode == 0
        assert not holders(inode) & set(server_pids(node))
        deadline = time.monotonic() + 10
        while holders(inode) and time.monotonic() < deadline:  # the served child's exit
            time.sleep(0.05)
        assert holders(inode) == set()
    finally:
        os.close(read_end)
        os.close(write_end)


def request(argv, env, fds=(0, 1, 2)) -> bytes:
    """A request as the launcher makes it (server_client.c)."""
    fields = [create_server.PROTOCOL, os.getcwd().encode(), b"22", str(len(argv)).encode()]
    fields += [a.encode() for a in argv] + [f"{k}={v}".encode() for k, v in env.items()]
    payload = b"".join(f + b"\0" for f in fields)
    return struct.pack("<I", len(payload)) + payload, list(fds)


CLIENT = """
import os, socket, sys
path, data, uid = sys.argv[1], bytes.fromhex(sys.argv[2]), int(sys.argv[3])
if uid:
    os.setgid(uid); os.setuid(uid)
with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
    s.connect(path)
    try:  # a stranger is declined as soon as it is accepted: its request may find the server gone
        s.sendmsg([data], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, bytes(memoryview(__import__('array').array('i', [0, 1, 2]))))])
    except BrokenPipeError:
        pass
    answer = b""
    try:
        while chunk := s.recv(4096):
            answer += chunk
    except ConnectionResetError:  # closed with our request unread
        pass
print(answer.decode())
"""


ELSEWHERE = {"another mount namespace": ["unshare", "--mount"],
             "another pid namespace": ["unshare", "--pid", "--fork"]}


@pytest.mark.parametrize("who", ["another uid"] + list(ELSEWHERE))
def test_the_server_serves_only_its_own_kind(served, who):
    """A process of another uid (were the socket's mode widened), or in another
    mount or pid namespace, gets "F" and nothing is done for it."""
    node = served
    bundle = node.bundle("stranger", GPU, args=("true",))
    data, _ = request([str(LAUNCHER), "--root", str(node.runc_root), "create", "--bundle", str(bundle), "x"],
                      node.env)
    argv = [sys.executable, "-c", CLIENT, socket_path(node), data.hex(), "0"]
    with tempfile.TemporaryDirectory(dir="/tmp") as public:
        if who == "another uid":  # a link to the socket where anyone may connect
            os.chmod(public, 0o755)
            os.link(socket_path(node), os.path.join(public, "socket"))
            os.chmod(socket_path(node), 0o666)
            argv[3], argv[-1] = os.path.join(public, "socket"), "65534"
        else:
            argv = ELSEWHERE[who] + argv
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "F"
    assert node.allocations() == {}
    assert "CUDA_DEVICE" not in (bundle / "config.json").read_text()


def test_a_request_of_another_protocol_is_declined(served):
    node = served
    data, _ = request(["x", "create"], {})
    data = data.replace(create_server.PROTOCOL, b"hami-create-0")
    proc = subprocess.run([sys.executable, "-c", CLIENT, socket_path(node), data.hex(), "0"],
                          capture_output=True, text=True, timeout=60)
    assert proc.stdout.strip() == "F"


@pytest.mark.parametrize("how", ["state dir removed", "killed"])
def test_creates_go_on_when_the_server_is_gone(served, how):
    """Its state dir removed, the server ends; killed, its socket is stale: the
    next GPU create runs its own Python, and starts a server again."""
    node = served
    pids = settled_server_pids(node)
    if how == "killed":
        for pid in pids:
            os.kill(pid, signal.SIGKILL)
    else:
        for name in os.listdir(node.state_dir / "server"):
            os.unlink(node.state_dir / "server" / name)
    assert ended(pids)
    rc, err, pid, logged_pid = create(node, "after", node.bundle("after", GPU, args=("true",)))
    assert rc == 0, err
    assert logged_pid == pid
    assert answering(node)
    assert len(settled_server_pids(node)) == 1 and not set(server_pids(node)) & set(pids)


def test_a_stopped_server_is_passed_by(served):
    """A server that does not take a request on within the launcher's wait
    (here: stopped) is passed by: the create runs its own Python; resumed, the
    server finds the launcher gone and does nothing with the request."""
    node = served
    [pid] = settled_server_pids(node)
    os.kill(pid, signal.SIGSTOP)
    try:
        rc, err, launcher, logged = create(node, "stopped", node.bundle("stopped", GPU, args=("true",)))
        assert rc == 0, err
        assert logged == launcher
    finally:
        os.kill(pid, signal.SIGCONT)
    assert answering(node) and no_requests_in_flight(node)
    assert list(node.allocations()) == ["stopped"]


@pytest.mark.parametrize("first", ["without request", "GPU"])
def test_an_idle_server_ends_and_the_next_create_starts_it_again(node, first):
    """create_server_idle_s: the server ends that long after its last request, its
    socket left behind. The next create starts it again: one without request (a pod's
    sandbox) has it serve the GPU create after it; a GPU create runs its own Python."""
    configure(node, create_server_idle_s=1)
    assert create(node, "g1", node.bundle("g1", GPU, args=("true",)))[0] == 0
    assert answering(node)
    assert node.runtime("delete", "-f", "g1", cmd=[str(LAUNCHER)]).returncode == 0
    assert released(node)
    pids = settled_server_pids(node)
    assert len(pids) == 1 and ended(pids, timeout=15)
    assert os.path.exists(socket_path(node))
    configure(node, create_server_idle_s=60)  # the next server stays for the GPU create, however slow the box
    if first == "without request":
        assert node.create("plain", node.bundle("plain", args=("true",)), cmd=[str(LAUNCHER)]).returncode == 0
        assert answering(node)
    rc, err, launcher, logged = create(node, "g2", node.bundle("g2", GPU, args=("true",)))
    assert rc == 0, err
    assert (logged == launcher) == (first == "GPU")
    assert answering(node)
    assert not set(settled_server_pids(node)) & set(pids)


def test_an_idle_server_stays_while_a_gpu_container_lives(node):
    """Past create_server_idle_s without a request, the server stays while a GPU container
    the state dir allocated lives (its delete, and likely more creates, are to come), and
    ends that long after its delete."""
    configure(node, create_server_idle_s=1)
    assert create(node, "held", node.bundle("held", GPU, args=("true",)))[0] == 0
    assert answering(node)
    [server] = settled_server_pids(node)
    time.sleep(3.5)  # past the idle span and the server's look at it (once a second)
    assert server in server_pids(node)
    assert node.runtime("delete", "-f", "held", cmd=[str(LAUNCHER)]).returncode == 0
    assert released(node)
    assert ended([server], timeout=15)


def test_no_server_where_the_config_says_none(node):
    """create_server_idle_s = 0: every create runs its own Python, none starts a
    server; a create without request on a fresh state dir starts the warm-up."""
    configure(node, create_server_idle_s=0)
    assert node.create("plain", node.bundle("plain", args=("true",)), cmd=[str(LAUNCHER)]).returncode == 0
    assert warmed(node)
    for cid in ("g1", "g2"):
        rc, err, pid, logged_pid = create(node, cid, node.bundle(cid, GPU, args=("true",)))
        assert rc == 0, err
        assert logged_pid == pid
    time.sleep(2.5)
    assert server_pids(node) == []
    assert not os.path.exists(socket_path(node))


def test_racing_served_creates_never_overcommit(served):
    """Ten creates served at once for 2000 MiB each of one 16384 MiB GPU:
    exactly 8 get it, the rest are refused."""
    node = served
    uuid = json.loads(node.hamictl("gpus", "--json").stdout)[0]["uuid"]
    procs = []
    for i in range(10):  # stderr a file: a created container holds its stdio
        with open(node.tmp / f"r{i}.err", "wb") as err:
            procs.append(subprocess.Popen(
                [str(LAUNCHER), "--root", str(node.runc_root), "create", "--bundle", str(node.bundle(
                    f"r{i}", {"hami.io/gpumem": "2000", "hami.io/gpu-uuid": uuid}, args=("true",))), f"r{i}"],
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err, env=node.env, cwd=node.tmp))
    outcomes = {f"r{i}": (p.wait(120), (node.tmp / f"r{i}.err").read_text()) for i, p in enumerate(procs)}
    granted = sorted(cid for cid, (rc, _) in outcomes.items() if rc == 0)
    assert len(granted) == 8
    assert sorted(node.allocations()) == granted
    assert all("room" in err for rc, err in outcomes.values() if rc != 0)


@pytest.mark.parametrize("delay", [0.005, 0.02, 0.06, 0.3])
def test_a_served_create_killed_anywhere_leaks_nothing(served, tmp_path, delay):
    """The launcher SIGKILLed while its create is served (or once it became a
    slow runc): after the next operation, no allocation is left."""
    node = served
    slow = tmp_path / "slow-runc"
    slow.write_text("#!/bin/sh\nsleep 5\nexit 1\n")
    slow.chmod(0o755)
    configure(node, runtime=[str(slow)])
    assert answering(node)
    proc = subprocess.Popen([str(LAUNCHER), "--root", str(node.runc_root), "create", "--bundle",
                             str(node.bundle("k", GPU)), "k"], stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=node.env,
                            start_new_session=True)
    time.sleep(delay)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(10)
    assert no_requests_in_flight(node)  # a served child finishes what it began
    assert node.ps() == []
    node.reconcile()
    assert node.allocations() == {}


def test_doctor_names_the_server(served):
    node = served
    [pid] = settled_server_pids(node)
    assert f"create server: pid {pid}, at {socket_path(node)}" in node.hamictl("doctor").stdout
    configure(node, create_server_idle_s=0)
    assert "create server: off" in node.hamictl("doctor").stdout


def test_a_served_tenant_cannot_reach_the_server(served):
    """Root in a served GPU container finds no socket and no mount of the
    server's dir, nor of the persistent config cache: only what the slice mounts."""
    node = served
    bundle = node.bundle("tenant", GPU, args=("sh", "-c", "find / -xdev -type s 2>/dev/null; "
                                                       "cat /proc/self/mountinfo"))
    out, log = node.tmp / "tenant.out", node.tmp / "hami.log"
    with open(out, "wb") as sink:
        proc = subprocess.Popen([str(LAUNCHER), "--root", str(node.runc_root), "run", "--bundle", str(bundle),
                                 "tenant"], stdin=subprocess.DEVNULL, stdout=sink, stderr=subprocess.STDOUT,
                                env=node.env, cwd=node.tmp)
        assert proc.wait(60) == 0, out.read_text()
    assert f" pid={proc.pid} tenant:" not in log.read_text()  # served, not its own Python
    seen = out.read_text()
    assert "CUDA" not in seen and "/.hami/limits" in seen, seen
    for hidden in (create_server.SERVER_DIR + "/", "/var/cache/hami", str(node.state_dir) + "/cache"):
        assert hidden not in seen, seen
    sockets = [line for line in seen.splitlines() if line.startswith("/") and " " not in line]
    assert all(path.startswith("/run/hami-sim/") for path in sockets), sockets  # the simulator's pid service only
