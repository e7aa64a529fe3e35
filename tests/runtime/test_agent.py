"""The node agent (`hamictl agent`) on the simulated GPU, with containers run by
hami-runtime through real runc and a tenant that is root in them: it holds each
container to its slice by the driver's count over the processes of its cgroup,
whatever they loaded. A process past libvgpu (a second copy of the simulated
driver loaded with dlmopen, standing in for a static binary) is killed, its
neighbour runs on; a tenant that forges the pids in its region to make five
processes hold five slices is brought back to one; policy `log` kills nothing;
an agent restarted half-way resumes where it was; SM use beyond the share is
frozen where configured. Each test starts and stops its own agent; every wait
is bounded."""
import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import time

import pytest

from hami_runtime.node import agent_state, region
from hami_runtime.tools import metrics
from tests.conftest import SIM

from .node import CUDA_ALLOC, HAMICTL
from .test_tenant import tenant_bundle

DLMOPEN_ALLOC = SIM / "tests" / "dlmopen_alloc"
pytestmark = pytest.mark.skipif(not (CUDA_ALLOC.exists() and DLMOPEN_ALLOC.exists()),
                                reason="make sim builds the test programs")

MiB = 1 << 20
SLICE = {"hami.io/gpumem": "1024"}
CONTEXT_MIB = 300  # the simulator's context_mib
WAIT = 30


@pytest.fixture(scope="module")
def agent_rootfs(rootfs, tmp_path_factory):
    """The tests' rootfs with dlmopen_alloc, and the loader where a new link-map
    namespace looks for it by its soname (as a Debian image has it)."""
    path = tmp_path_factory.mktemp("agent") / "rootfs"
    shutil.copytree(rootfs, path, symlinks=True)
    shutil.copy2(DLMOPEN_ALLOC, path / "bin" / "dlmopen_alloc")
    loader = path / "lib" / "x86_64-linux-gnu" / "ld-linux-x86-64.so.2"
    if not loader.exists():
        loader.symlink_to("/lib64/ld-linux-x86-64.so.2")
    return path


def unique(prefix):
    """A container id of its own: runc names the container's cgroup after it."""
    return f"{prefix}-{os.urandom(4).hex()}"


def wait_for(what, test, timeout=WAIT, every=0.1):
    deadline = time.monotonic() + timeout
    while True:
        value = test()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"waited {timeout} s for {what}")
        time.sleep(every)


class Run:
    """A container run in the background (`hami-runtime run`); its output in a file."""

    def __init__(self, node, cid, annotations, script, rootfs):
        self.node, self.cid = node, cid
        self.out = node.tmp / f"{cid}.out"
        bundle = tenant_bundle(node, cid, annotations, script, rootfs=rootfs)
        with open(self.out, "wb") as out:
            self.proc = subprocess.Popen(node.runtime_argv("run", "--bundle", str(bundle), cid),
                                         stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                         env=node.env, cwd=node.tmp)

    def text(self):
        return self.out.read_text(errors="replace")

    def lines(self):
        return self.text().splitlines()

    def wait_line(self, pattern, timeout=WAIT):
        return wait_for(f"{pattern!r} from {self.cid} (it said {self.text()!r})",
                        lambda: next((line for line in self.lines() if re.fullmatch(pattern, line)), None),
                        timeout)

    def finish(self, timeout=WAIT):
        assert self.proc.wait(timeout) == 0, self.text()
        return self.lines()

    def stop(self):
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=WAIT)


class Agent:
    """`hamictl agent` on the node, up once it has written its state."""

    def __init__(self, node, config=None):
        self.node = node
        self.err = node.tmp / "agent.err"
        env = {**node.env, "HAMI_CONFIG": str(config or node.config)}
        with open(self.err, "ab") as err:
            self.proc = subprocess.Popen(HAMICTL + ["agent"], env=env, stdin=subprocess.DEVNULL,
                                         stdout=subprocess.DEVNULL, stderr=err)
        wait_for("the agent's first state", lambda: self.state() is not None or self.proc.poll() is not None)
        assert self.proc.poll() is None, self.err.read_text()

    def state(self):
        state = agent_state.read(str(self.node.state_dir))
        return state if state is not None and state.pid == self.proc.pid else None

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            assert self.proc.wait(WAIT) == 0, self.err.read_text()
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait(WAIT)


@contextlib.contextmanager
def agent(node, config=None):
    running = Agent(node, config)
    try:
        yield running
    finally:
        running.stop()


@pytest.fixture
def runs():
    started = []
    yield started
    for run in started:
        run.stop()


def configure(node, **keys):
    node.write_config(log_file=str(node.tmp / "hami.log"), **keys)


def log_lines(node, text):
    path = node.tmp / "hami.log"
    return [line for line in path.read_text().splitlines() if text in line] if path.exists() else []


def record(node, cid):
    state = agent_state.read(str(node.state_dir))
    names = [n for n in (state.containers if state else {}) if n.startswith(cid + "@")]
    return state.containers[names[0]] if names else None


def scrape(node):
    """{(name, labels): value} of the metrics as `hamictl metrics` serves them."""
    from prometheus_client.exposition import generate_latest
    from prometheus_client import CollectorRegistry
    from prometheus_client.parser import text_string_to_metric_families
    registry = CollectorRegistry(auto_describe=False)
    registry.register(metrics.RegionCollector(str(node.state_dir)))
    return {(s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(generate_latest(registry).decode())
            for s in family.samples}


def value(found, name, **labels):
    hits = [v for (n, have), v in found.items() if n == name and set(labels.items()) <= have]
    assert len(hits) == 1, (name, labels, hits)
    return hits[0]


def ps_rows(node, cid):
    return [row for row in node.ps() if row["container"] == cid]


def test_a_process_past_libvgpu_is_killed_its_neighbour_untouched(node, agent_rootfs, runs):
    configure(node, memory_grace_ms=500)
    neighbour, offender = unique("nb"), unique("off")
    go = f"/tmp/{neighbour}-go"
    nb = Run(node, neighbour, SLICE, f"cuda_alloc 600 @{go} @{go}; echo done $?", agent_rootfs)
    runs.append(nb)
    nb.wait_line("alloc 600 0")
    off = Run(node, offender, SLICE, "dlmopen_alloc 1500 @; echo status $?; sleep 60", agent_rootfs)
    runs.append(off)
    off.wait_line("held")
    assert "status" not in off.text()  # libvgpu never saw it: 1800 MiB on a 1024 MiB slice
    with agent(node):
        off.wait_line("status 137")  # SIGKILL
        killed = wait_for("the kill's line", lambda: log_lines(node, "policy kill"))
        assert len(killed) == 1
        assert re.search(rf"agent: container {offender} holds 1800 MiB of GPU-\S+ \(slice 1024 MiB\) for "
                         r"[0-9.]+ s: the driver shows pid \d+ 1800 MiB; policy kill: killed pid \d+$",
                         killed[0]), killed[0]
        wait_for("the record", lambda: (rec := record(node, offender)) and rec.killed == 1)
        assert [r["enforcement"]["flags"] for r in ps_rows(node, offender)] == [["killed 1"]]
        assert [r["enforcement"]["flags"] for r in ps_rows(node, neighbour)] == [[]]
        table = node.hamictl("ps").stdout
        assert re.search(rf"^{offender} .* killed 1$", table, re.M) and "ENFORCED" in table
        found = scrape(node)
        assert value(found, "hami_agent_up") == 1
        assert value(found, "hami_enforcement_actions_total", action="kill") == 1
        assert value(found, "hami_container_enforcement_actions_total", container=offender, action="kill") == 1
        assert value(found, "hami_container_enforcement_actions_total", container=neighbour, action="kill") == 0
        # what the driver shows the neighbour's cgroup holding: its context and its 600 MiB
        assert value(found, "hami_container_driver_memory_bytes", container=neighbour) == (CONTEXT_MIB + 600) * MiB
        assert value(found, "hami_container_memory_excess_bytes", container=neighbour) == 0
    (agent_rootfs / go.lstrip("/")).touch()
    assert nb.finish()[-1] == "done 0"  # held its 900 MiB all along, untouched
    (agent_rootfs / go.lstrip("/")).unlink()


def test_policy_log_kills_nothing_and_says_so_once(node, agent_rootfs, runs):
    configure(node, memory_enforcement="log", memory_grace_ms=300)
    offender = unique("log")
    off = Run(node, offender, SLICE, "dlmopen_alloc 1500 @; echo status $?", agent_rootfs)
    runs.append(off)
    off.wait_line("held")
    before = node.hamictl("ps").stdout
    with agent(node):
        wait_for("the line", lambda: log_lines(node, "policy log"))
        time.sleep(1.0)  # five more ticks: the episode is said once
        lines = log_lines(node, f"agent: container {offender} ")
        assert len(lines) == 1 and lines[0].endswith("policy log: nothing done"), lines
        assert "status" not in off.text()
        rows = ps_rows(node, offender)
        assert rows[0]["enforcement"]["flags"] == ["over slice"]
        assert rows[0]["enforcement"]["memory_excess_bytes"] == (CONTEXT_MIB + 1500 - 1024) * MiB
        assert rows[0]["enforcement"]["actions"] == {"log": 1}
        found = scrape(node)
        assert value(found, "hami_enforcement_actions_total", action="log") == 1
        assert value(found, "hami_enforcement_actions_total", action="kill") == 0
        assert value(found, "hami_container_memory_excess_bytes", container=offender) == 776 * MiB
        view = json.loads(node.hamictl("top", "--json", "--interval", "0").stdout)
        mine = [c for c in view["containers"] if c["id"] == offender]
        assert mine[0]["enforcement"]["flags"] == ["over slice"] and view["agent"]["totals"] == {"log": 1}
        assert re.search(rf"^{offender[:12]} .* over slice$", node.hamictl("top", "--interval", "0").stdout,
                         re.M)
    # no agent: the tables are as they were without one, and the metrics say it is down
    assert node.hamictl("ps").stdout == before
    assert value(scrape(node), "hami_agent_up") == 0


def test_a_restarted_agent_resumes_and_kills_once(node, agent_rootfs, runs):
    grace = 4000
    configure(node, memory_grace_ms=grace)
    offender = unique("rs")
    off = Run(node, offender, SLICE, "dlmopen_alloc 1500 @; echo status $?; sleep 60", agent_rootfs)
    runs.append(off)
    off.wait_line("held")
    uuid = node.allocations()[offender]["devices"][0]["uuid"]
    with agent(node):
        since = wait_for("the excess seen", lambda: (rec := record(node, offender)) and rec.over_since.get(uuid))
    assert "status" not in off.text()  # stopped within its grace: nothing done yet
    with agent(node) as second:
        wait_for("the second agent's state", second.state)
        assert record(node, offender).over_since.get(uuid) == since  # the grace goes on where it was
        off.wait_line("status 137")
        wait_for("the record", lambda: (rec := record(node, offender)) and rec.killed == 1)
    line = log_lines(node, "policy kill")
    assert len(line) == 1
    over = float(re.search(r" for ([0-9.]+) s: ", line[0]).group(1))
    assert over >= grace / 1000
    with agent(node) as third:
        wait_for("the third agent's state", third.state)
        time.sleep(1.0)
        state = third.state()
        assert state.totals.get("kill") == 1 and record(node, offender).killed == 1
        assert [r["enforcement"]["flags"] for r in ps_rows(node, offender)] == [["killed 1"]]
    assert len(log_lines(node, "policy kill")) == 1


def forge(slots=8):
    """Shell (busybox dd) that clears, in the first slots of the container's region,
    the pids libvgpu finds the container's other processes by and their counters."""
    size = region.ffi.sizeof("struct hami_proc_slot")
    base = region.ffi.offsetof("struct hami_region", "procs")
    fields = [(region.ffi.offsetof("struct hami_proc_slot", "pid"), 8),  # pid and host_pid
              (region.ffi.offsetof("struct hami_proc_slot", "mem_used"), 8),
              (region.ffi.offsetof("struct hami_proc_slot", "ctx_used"), 8)]
    return "; ".join(f"dd if=/dev/zero of=/.hami/shared/vgpu.region bs=1 seek={base + i * size + offset} "
                     f"count={count} conv=notrunc 2>/dev/null" for i in range(slots) for offset, count in fields)


def test_forged_pids_five_processes_are_brought_back_to_the_slice(node, agent_rootfs, runs):
    configure(node, memory_grace_ms=300)
    tenant = unique("five")
    tag = f"/tmp/{tenant}"
    start = (f"{forge()}; cuda_alloc 600 @{tag}-go @{tag}-go > {tag}-$i & echo $! > {tag}-pid$i; "
             f"n=0; until grep -q alloc {tag}-$i || [ $n -gt 400 ]; do sleep 0.05; n=$((n+1)); done")
    script = (f"for i in 1 2 3 4 5; do {start}; done; echo held; cat {tag}-1 {tag}-2 {tag}-3 {tag}-4 {tag}-5; "
              f"for i in 1 2 3 4 5; do wait $(cat {tag}-pid$i); echo proc $i status $?; done")
    five = Run(node, tenant, SLICE, script, agent_rootfs)
    runs.append(five)
    five.wait_line("held", timeout=90)
    # each was let past libvgpu by the forged region: five contexts and five 600 MiB
    assert [line for line in five.lines() if line.startswith("alloc ")] == ["alloc 600 0"] * 5, five.text()
    with agent(node):
        rec = wait_for("four kills", lambda: (r := record(node, tenant)) and r.killed >= 4 and r)
        time.sleep(1.0)  # more ticks: within its slice now, nothing more is done
        assert record(node, tenant).killed == 4
        uuid = node.allocations()[tenant]["devices"][0]["uuid"]
        assert rec.held[uuid] == (CONTEXT_MIB + 600) * MiB and rec.excess[uuid] == 0
        lines = log_lines(node, "policy kill")
        assert len(lines) == 1 and f"holds {5 * (CONTEXT_MIB + 600)} MiB" in lines[0]
        assert lines[0].count("killed pid") == 4
    (agent_rootfs / f"{tag.lstrip('/')}-go").touch()
    statuses = [line for line in five.finish() if line.startswith("proc ")]
    # newest first: the last four started, the first one left holding its 900 MiB
    assert statuses == ["proc 1 status 0"] + [f"proc {i} status 137" for i in range(2, 6)], five.text()
    for leftover in agent_rootfs.glob(f"tmp/{tenant}-*"):
        leftover.unlink()


def freezer_state(cid):
    path = f"/sys/fs/cgroup/freezer/{cid}/freezer.state"
    with open(path) as handle:
        return handle.read().strip()


@pytest.mark.skipif(not os.path.isdir("/sys/fs/cgroup/freezer"), reason="runc uses the v1 freezer where it "
                    "is mounted; this host has none")
def test_sm_use_past_the_share_is_frozen_then_thawed(node, agent_rootfs, runs):
    configure(node, memory_enforcement="off", sm_enforcement="freeze", sm_grace_ms=1000)
    spinner = unique("sm")
    sm = Run(node, spinner, {**SLICE, "hami.io/gpucores": "30", "hami.io/core-policy": "force"},
             "dlmopen_alloc 10 spin 12; echo status $?", agent_rootfs)
    runs.append(sm)
    sm.wait_line("alloc 10 0")
    with agent(node):
        line = wait_for("a freeze", lambda: log_lines(node, "policy freeze"))[0]
        seconds = float(re.search(r"frozen for ([0-9.]+) s \(v1 freezer\)", line).group(1))
        # its use was the whole GPU against 30 %: frozen for the window x 70 / 30
        assert 1.5 <= seconds <= 5.0, line
        assert re.search(rf"agent: container {spinner} uses \d+% of the SMs of GPU-\S+ \(share 30%\)", line)
        wait_for("the thaw", lambda: log_lines(node, f"container {spinner}: thawed"), timeout=10)
        assert freezer_state(spinner) == "THAWED"
        assert value(scrape(node), "hami_enforcement_actions_total", action="freeze") >= 1
    assert freezer_state(spinner) == "THAWED"  # the agent leaves nothing frozen
    assert sm.finish(60)[-1] == "status 0"


def test_without_nvml_the_agent_runs_and_says_why(node, agent_rootfs, runs):
    """The agent's NVML cannot be loaded (its own config names a library that is not
    there): it keeps running, says why once, and does nothing."""
    configure(node, memory_grace_ms=0)
    offender = unique("nonvml")
    off = Run(node, offender, SLICE, "dlmopen_alloc 1500 @; echo status $?", agent_rootfs)
    runs.append(off)
    off.wait_line("held")
    broken = node.tmp / "no-nvml.toml"
    broken.write_text(f'nvml_library = "{node.tmp / "missing" / "libnvidia-ml.so.1"}"\n' + "".join(
        line for line in node.config.read_text().splitlines(keepends=True) if not line.startswith("nvml_library")))
    with agent(node, broken) as running:
        wait_for("the line", lambda: log_lines(node, "agent: the driver was not read"))
        time.sleep(1.0)
        assert running.proc.poll() is None and "status" not in off.text()
        assert running.state().driver_error.startswith("NVML: ")
        doctor = node.hamictl("doctor")
        assert f"agent: pid {running.proc.pid}, every 250 ms" in doctor.stdout, doctor.stdout
    assert "agent: not running (hamictl agent)" in node.hamictl("doctor").stdout


def test_one_agent_per_state_dir(node):
    configure(node)
    with agent(node) as first:
        second = subprocess.run(HAMICTL + ["agent"], env=node.env, capture_output=True, text=True, timeout=WAIT)
        assert second.returncode == 1
        assert f"another agent runs on {node.state_dir} (pid {first.proc.pid})" in second.stderr
