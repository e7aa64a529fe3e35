"""hamictl top and the Prometheus endpoint, over regions with known counters."""
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request

import pytest
from click.testing import CliRunner

from hami_runtime.lifecycle.node_state.state_layout import alloc_name, root_key
from hami_runtime.tools import metrics, top
from hami_runtime.node import region
from hami_runtime.node.region import DeviceLimit
from tests.conftest import ROOT
from tests.region.fakes import add_busy, add_sm, collect, fake_process, make_container

MiB = 1024 * 1024
CID_A = "a" * 64
CID_B = "bbbbbbbbbbbbbbbbcontainer"
ROOT_K8S = "/run/containerd/runc/k8s.io"
ROOT_MOBY = "/run/docker/runtime-runc/moby"
NAME_A = alloc_name(ROOT_K8S, CID_A)
NAME_B = alloc_name(ROOT_MOBY, CID_B)


def owner_of(pid_in_container, host_pid):
    return (pid_in_container << 32) | (region.process_start_ticks(host_pid) & 0xFFFFFFFF)


def gone_pid():
    child = subprocess.Popen(["true"])
    child.wait(timeout=10)
    return child.pid


def write_state(state_dir, roots):
    """The allocator state as far as top reads it: {name: runc root}."""
    entries = {name: {"id": name.rpartition("@")[0], "runc_root": root} for name, root in roots.items()}
    (state_dir / "allocations.json").write_text(json.dumps({"version": 2, "allocations": entries}))


def region_of(state_dir, name):
    return state_dir / "containers" / name / region.REGION_FILE_NAME


@pytest.fixture(scope="module")
def host_pids():
    """Two processes in a pid namespace of their own, as a container's are (pids 1
    and 2 there): {pid in the namespace: pid on the host}."""
    outer = subprocess.Popen(["unshare", "--pid", "--fork", "--kill-child", "sh", "-c",
                              "sleep 600 & exec sleep 601"])
    deadline, found = time.monotonic() + 10, {}
    while len(found) < 2 and time.monotonic() < deadline:
        time.sleep(0.02)
        first = subprocess.run(["pgrep", "-P", str(outer.pid)], capture_output=True, text=True).stdout.split()
        second = subprocess.run(["pgrep", "-P", first[0]], capture_output=True, text=True).stdout.split() \
            if first else []
        found = {1: int(first[0]), 2: int(second[0])} if second else {}
    yield found
    outer.kill()
    outer.wait(timeout=10)


@pytest.fixture(autouse=True)
def no_driver(tmp_path_factory, monkeypatch):
    """top reads the driver too (the GPUs below the containers): these tests are about
    the containers, so the driver is one that cannot be loaded, on any machine."""
    config = tmp_path_factory.mktemp("config") / "hami.toml"
    config.write_text('nvml_library = "/nonexistent/libnvidia-ml.so.1"\n')
    monkeypatch.setenv("HAMI_CONFIG", str(config))


@pytest.fixture
def state_dir(tmp_path, host_pids):
    """Two GPU containers: A (force, high priority) with two processes on one device
    (the host knows its first process, as the createRuntime hook records it; the
    second process's slot has no owner the host can match), B (default, low) with
    two devices."""
    a = make_container(tmp_path, NAME_A, [DeviceLimit("GPU-a", 1024 * MiB, 30)],
                       core_policy="force", priority=0)
    (tmp_path / "private" / NAME_A / "pid").write_text(f"{host_pids[1]}\n")
    fake_process(a, 0, pid=1, host_pid=4242, owner=owner_of(1, host_pids[1]),  # 4242: the container's word
                 usage={0: (300 * MiB, 100 * MiB, 0, 40)})
    fake_process(a, 7, pid=2, owner=owner_of(2, host_pids[2]), usage={0: (212 * MiB, 100 * MiB, 0, 2)})
    b = make_container(tmp_path, NAME_B, [DeviceLimit("GPU-b0", 2048 * MiB, 0),
                                          DeviceLimit("GPU-b1", 0, 60)])
    fake_process(b, 1, pid=9, usage={1: (64 * MiB, 64 * MiB, 0, 1)})
    (tmp_path / "containers" / "no-region-yet").mkdir()
    write_state(tmp_path, {NAME_A: ROOT_K8S, NAME_B: ROOT_MOBY})
    return tmp_path


class FakeTime:
    """Stands in for top's clock and sleep: a sleep advances the clock by the
    interval and runs what the test wants to happen meanwhile."""

    def __init__(self, during_sleep=lambda: None):
        self.now_ns, self.sleeps, self.during_sleep = 10**12, [], during_sleep

    def monotonic_ns(self):
        return self.now_ns

    def sleep(self, seconds):
        self.sleeps.append(seconds)
        self.during_sleep()
        self.now_ns += int(seconds * 1e9)


@pytest.fixture
def fake_time(monkeypatch):
    clock = FakeTime()
    monkeypatch.setattr(top, "time", clock)
    return clock


def test_read_all_reports_limits_and_summed_usage(state_dir, host_pids):
    views = {c.id: c for c in top.read_all(str(state_dir))}
    assert sorted(views) == sorted([CID_A, CID_B])
    a, b = views[CID_A], views[CID_B]
    assert (a.name, a.root_key, a.runc_root) == (NAME_A, root_key(ROOT_K8S), ROOT_K8S)
    assert (a.core_policy, a.priority, b.core_policy, b.priority) == ("force", 0, "default", 1)
    assert [(d.uuid, d.mem_used_bytes, d.mem_limit_bytes, d.sm_limit_pct) for d in a.devices] == [
        ("GPU-a", 512 * MiB, 1024 * MiB, 30)]
    assert [(p.pid, p.host_pid, p.mem_used_bytes) for p in a.processes] == [
        (1, host_pids[1], [300 * MiB]), (2, host_pids[2], [212 * MiB])]
    assert [p.alive for p in a.processes] == [True, True]
    assert [(d.mem_used_bytes, d.mem_limit_bytes, d.sm_limit_pct) for d in b.devices] == [
        (0, 2048 * MiB, 0), (64 * MiB, 0, 60)]


@pytest.mark.parametrize("busy_ns,elapsed_ns,expected", [
    (250_000_000, 1_000_000_000, 25.0),
    (0, 1_000_000_000, 0.0),
    (1_000_000_000, 2_000_000_000, 50.0),
])
def test_sm_use_is_busy_time_over_the_interval(state_dir, busy_ns, elapsed_ns, expected):
    path = region_of(state_dir, NAME_A)
    before = top.read_all(str(state_dir))
    add_busy(path, 0, busy_ns, slot=0)
    after = top.read_all(str(state_dir))
    top.add_rates(before, after, elapsed_ns)
    a = next(c for c in after if c.id == CID_A)
    assert a.devices[0].sm_use_pct == expected
    assert a.processes[0].sm_use_pct == [expected]
    assert a.processes[1].sm_use_pct == [0.0]


def test_table_shows_each_container_device_and_process(state_dir, host_pids):
    result = CliRunner().invoke(top.top_command, ["--state-dir", str(state_dir), "--interval", "0"])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[0].split() == ["CONTAINER", "ROOT", "DEV", "UUID", "POLICY", "PRIO", "MEMORY", "MiB",
                                "(used", "/", "limit)", "SM", "(use", "/", "limit)", "HELD", "PROCS", "POD"]
    # --interval 0: no interval, so neither SM use nor holding is known
    assert re.search(rf"^aaaaaaaaaaaa\s+{ROOT_K8S}\s+0\s+GPU-a\s+force\s+high\s+512 / 1024\s+"
                     r"\? / 30%\s+\?\s+2\s+-$", result.output, re.M), result.output
    assert re.search(rf"^  pid 1 \(host {host_pids[1]}\)\s+0\s+300 \(context 100\)\s+\?\s+40 launches$",
                     result.output, re.M)
    assert re.search(rf"^  pid 2 \(host {host_pids[2]}\)\s+0\s+212 \(context 100\)", result.output, re.M)
    # B: its first process is not known to the host, so neither are its host pids
    assert re.search(r"^  pid 9 \(host \?\)", result.output, re.M), result.output
    # no SM limit: launches are not timed, so there is no use to show
    assert re.search(rf"^bbbbbbbbbbbb\s+{ROOT_MOBY}\s+0\s+GPU-b0\s+default\s+low\s+0 / 2048\s+"
                     r"- / -\s+\?\s+0\s+-$", result.output, re.M)
    assert re.search(rf"^bbbbbbbbbbbb\s+{ROOT_MOBY}\s+1\s+GPU-b1\s+default\s+low\s+64 / -\s+"
                     r"\? / 60%\s+\?\s+1\s+-$", result.output, re.M)


def test_exited_process_is_marked_and_not_counted(state_dir, host_pids):
    """A slot whose process is gone still counts against the limit until a process of
    the container reclaims it; top says so and counts only live processes."""
    path = region_of(state_dir, NAME_A)
    fake_process(path, 9, pid=4, host_pid=gone_pid(), owner=owner_of(4, host_pids[1]),  # no pid 4 there
                 usage={0: (24 * MiB, 24 * MiB, 0, 0)})
    result = CliRunner().invoke(top.top_command, ["--state-dir", str(state_dir), "--interval", "0"])
    assert re.search(r"^aaaaaaaaaaaa\s+\S+\s+0\s+GPU-a\s+force\s+high\s+536 / 1024\s+\? / 30%\s+\?\s+2\s+-$",
                     result.output, re.M), result.output
    assert re.search(r"^  pid 4 \(host \?, exited\)\s+0\s+24 \(context 24\)", result.output,
                     re.M), result.output


def test_json_output(state_dir, fake_time):
    fake_time.during_sleep = lambda: add_sm(region_of(state_dir, NAME_A), 0, busy_ns=150_000_000,
                                            throttled_ns=350_000_000)
    result = CliRunner().invoke(top.top_command, ["--state-dir", str(state_dir), "--json"])
    assert result.exit_code == 0, result.output
    assert fake_time.sleeps == [top.ONE_SHOT_INTERVAL]
    data = json.loads(result.output)
    assert data["interval_s"] == top.ONE_SHOT_INTERVAL
    a = next(c for c in data["containers"] if c["id"] == CID_A)
    assert {k: a[k] for k in ("name", "root_key", "runc_root", "core_policy", "priority")} == {
        "name": NAME_A, "root_key": root_key(ROOT_K8S), "runc_root": ROOT_K8S,
        "core_policy": "force", "priority": 0}
    dev = a["devices"][0]
    assert dev["mem_used_bytes"] == 512 * MiB
    assert {k: dev[k] for k in ("sm_busy_ns", "sm_throttled_ns", "sm_paused_ns", "sm_use_pct",
                                "throttled_now", "paused_now")} == {
        "sm_busy_ns": 150_000_000, "sm_throttled_ns": 350_000_000, "sm_paused_ns": 0,
        "sm_use_pct": 30.0, "throttled_now": True, "paused_now": False}
    assert [p["pid"] for p in a["processes"]] == [1, 2]


# (busy, throttled, paused) added during one 0.5 s interval -> what top shows for A's device
@pytest.mark.parametrize("added,use,held", [
    ((0, 0, 0), "0% / 30%", "-"),                                      # idle
    ((125_000_000, 0, 0), "25% / 30%", "-"),                           # under its share
    ((150_000_000, 350_000_000, 0), "30% / 30%", "throttled"),         # held to its share
    ((0, 0, 500_000_000), "0% / 30%", "paused"),                       # high-priority work ran
    ((20_000_000, 100_000_000, 300_000_000), "4% / 30%", "paused,throttled"),
    ((0, 1, 0), "0% / 30%", "throttled"),                              # any wait counts
])
def test_held_and_share_over_the_interval(state_dir, fake_time, added, use, held):
    busy, throttled, paused = added
    fake_time.during_sleep = lambda: add_sm(region_of(state_dir, NAME_A), 0, busy, throttled, paused)
    result = CliRunner().invoke(top.top_command, ["--state-dir", str(state_dir)])
    assert result.exit_code == 0, result.output
    row = next(line for line in result.output.splitlines() if line.startswith("aaaaaaaaaaaa"))
    assert re.search(rf"\s{re.escape(use)}\s+{held}\s+2\s+-$", row), row
    # B saw nothing happen
    assert all(re.search(r"\s-\s+\d+\s+-$", line) for line in result.output.splitlines()
               if line.startswith("bbbbbbbbbbbb")), result.output


# SM use is measured only where a limit is in force (libvgpu times no other launch)
@pytest.mark.parametrize("sm_limit,policy,use", [
    (30, "force", "25% / 30%"), (30, "default", "25% / 30%"), (30, "disable", "- / 30%"),
    (0, "force", "- / -"), (100, "default", "- / -"),
])
def test_sm_use_only_where_measured(tmp_path, fake_time, sm_limit, policy, use):
    path = make_container(tmp_path, NAME_A, [DeviceLimit("GPU-a", 0, sm_limit)], core_policy=policy)
    fake_time.during_sleep = lambda: add_sm(path, 0, busy_ns=125_000_000)
    table = CliRunner().invoke(top.top_command, ["--state-dir", str(tmp_path)]).output
    assert f"  {use}  " in table.splitlines()[1], table
    data = json.loads(CliRunner().invoke(top.top_command, ["--state-dir", str(tmp_path), "--json"]).output)
    assert data["containers"][0]["devices"][0]["sm_use_pct"] == (None if use[0] == "-" else 25.0)


def test_watch_measures_each_refresh_since_the_last(state_dir, fake_time):
    """Each refresh is one interval after the one before (default 1 s with --watch),
    and its share and holding cover only that interval."""
    steps = iter([(400_000_000, 600_000_000), (100_000_000, 0)])
    fake_time.during_sleep = lambda: add_sm(region_of(state_dir, NAME_A), 0, *next(steps))
    result = CliRunner().invoke(top.top_command, ["--state-dir", str(state_dir), "--json", "--watch",
                                                  "--count", "2"])
    assert result.exit_code == 0, result.output
    assert fake_time.sleeps == [top.WATCH_INTERVAL] * 2
    frames = [json.loads(frame) for frame in re.split(r"(?<=\n})\n(?={)", result.output.strip())]
    dev = [next(c for c in f["containers"] if c["id"] == CID_A)["devices"][0] for f in frames]
    assert [(d["sm_use_pct"], d["throttled_now"]) for d in dev] == [(40.0, True), (10.0, False)]


def test_one_id_in_two_runc_roots_is_two_containers(state_dir):
    """containerd keeps a runc root per namespace: the same id in two of them is two
    containers, told apart by their root in top and in every metric."""
    other = alloc_name("/run/containerd/runc/default", CID_A)
    make_container(state_dir, other, [DeviceLimit("GPU-b0", 256 * MiB, 0)])
    write_state(state_dir, {NAME_A: ROOT_K8S, NAME_B: ROOT_MOBY,
                            other: "/run/containerd/runc/default"})
    result = CliRunner().invoke(top.top_command, ["--state-dir", str(state_dir), "--interval", "0"])
    rows = sorted(line.split()[:4] for line in result.output.splitlines()
                  if line.startswith("aaaaaaaaaaaa"))
    assert rows == [["aaaaaaaaaaaa", "/run/containerd/runc/default", "0", "GPU-b0"],
                    ["aaaaaaaaaaaa", ROOT_K8S, "0", "GPU-a"]]
    text = collect(state_dir)
    assert sample_value(text, "hami_container_memory_limit_bytes", container=CID_A,
                        root=root_key(ROOT_K8S)) == 1024 * MiB
    assert sample_value(text, "hami_container_memory_limit_bytes", container=CID_A,
                        root=root_key("/run/containerd/runc/default")) == 256 * MiB


# what the ROOT column shows, by what the allocator state says of the container
@pytest.mark.parametrize("name,state,shown", [
    (NAME_A, {NAME_A: ROOT_K8S}, ROOT_K8S),
    (NAME_A, None, root_key(ROOT_K8S)),                                  # no state file
    (NAME_A, {NAME_A: "/run/elsewhere"}, root_key(ROOT_K8S)),            # a root that is not its key's
    (NAME_A, {NAME_A: "relative/root"}, root_key(ROOT_K8S)),
])
def test_root_column(tmp_path, name, state, shown):
    make_container(tmp_path, name, [DeviceLimit("GPU-a", 0, 0)])
    if state is not None:
        write_state(tmp_path, state)
    result = CliRunner().invoke(top.top_command, ["--state-dir", str(tmp_path), "--interval", "0"])
    row = result.output.splitlines()[1].split()
    assert row[:3] == [split_id(name)[:12], shown, "0"], result.output


def split_id(name):
    cid, _, key = name.rpartition("@")
    return cid if re.fullmatch(r"[0-9a-f]{16}", key) else name


def test_unreadable_region_is_shown_not_fatal(state_dir):
    path = region_of(state_dir, NAME_B)
    os.truncate(path, 10)
    result = CliRunner().invoke(top.top_command, ["--state-dir", str(state_dir), "--interval", "0"])
    assert result.exit_code == 0
    assert re.search(rf"^bbbbbbbbbbbb\s+{ROOT_MOBY}\s+-\s+-\s+region .*10 bytes, expected", result.output,
                     re.M)
    assert "aaaaaaaaaaaa" in result.output


def test_empty_state_dir(tmp_path):
    result = CliRunner().invoke(top.top_command, ["--state-dir", str(tmp_path), "--interval", "0"])
    assert (result.exit_code, result.output) == (0, "no GPU containers\n")


def scrape(port):
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        return response.read().decode()


def sample_value(text, name, **labels):
    for line in text.splitlines():
        if line.startswith(name + "{") and all(f'{k}="{v}"' in line for k, v in labels.items()):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name} {labels} not in scrape")


def test_metrics_read_at_scrape_time(state_dir):
    server, thread = metrics.serve(str(state_dir), "127.0.0.1", 0)
    try:
        port = server.server_address[1]
        text = scrape(port)
        dev_a = dict(container=CID_A, root=root_key(ROOT_K8S), device="0", uuid="GPU-a")
        assert sample_value(text, "hami_container_memory_used_bytes", **dev_a) == 512 * MiB
        assert sample_value(text, "hami_container_memory_limit_bytes", **dev_a) == 1024 * MiB
        assert sample_value(text, "hami_container_sm_limit_percent", **dev_a) == 30
        assert sample_value(text, "hami_container_processes", **dev_a) == 2
        for counter in ("busy", "throttled", "paused"):
            assert sample_value(text, f"hami_container_sm_{counter}_seconds_total", **dev_a) == 0
        assert sample_value(text, "hami_container_processes", container=CID_B, device="1") == 1
        assert sample_value(text, "hami_container_region_readable", container=CID_B,
                            root=root_key(ROOT_MOBY)) == 1
        assert sample_value(text, "hami_container_info", container=CID_A, root=root_key(ROOT_K8S),
                            runc_root=ROOT_K8S, core_policy="force", priority="0") == 1
        assert sample_value(text, "hami_container_info", container=CID_B, runc_root=ROOT_MOBY,
                            core_policy="default", priority="1") == 1
        # Counters move between scrapes: nothing is cached.
        add_sm(region_of(state_dir, NAME_A), 0, busy_ns=1_500_000_000, throttled_ns=2_250_000_000,
               paused_ns=500_000_000)
        fake_process(region_of(state_dir, NAME_B), 3, pid=3, usage={0: (10 * MiB, 0, 0, 0)})
        text = scrape(port)
        assert sample_value(text, "hami_container_sm_busy_seconds_total", **dev_a) == 1.5
        assert sample_value(text, "hami_container_sm_throttled_seconds_total", **dev_a) == 2.25
        assert sample_value(text, "hami_container_sm_paused_seconds_total", **dev_a) == 0.5
        dev_b0 = dict(container=CID_B, device="0")
        assert sample_value(text, "hami_container_memory_used_bytes", **dev_b0) == 10 * MiB
        assert sample_value(text, "hami_container_processes", **dev_b0) == 1
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)
    assert not thread.is_alive()


@pytest.mark.parametrize("listen,expected", [
    ("127.0.0.1:9464", ("127.0.0.1", 9464)),
    ("[::1]:80", ("::1", 80)),
    ("0.0.0.0:0", ("0.0.0.0", 0)),
])
def test_parse_listen(listen, expected):
    assert metrics.parse_listen(listen) == expected


@pytest.mark.parametrize("listen", ["9464", ":9464", "host:port", "127.0.0.1:70000"])
def test_bad_listen_names_the_flag(state_dir, listen):
    result = CliRunner().invoke(metrics.metrics_command,
                                ["--state-dir", str(state_dir), "--listen", listen])
    assert result.exit_code == 2
    assert f"--listen: {listen!r} is not HOST:PORT" in result.output


def test_metrics_command_serves_until_sigterm(state_dir):
    code = "from hami_runtime.tools.metrics import metrics_command; metrics_command()"
    proc = subprocess.Popen([sys.executable, "-c", code, "--state-dir", str(state_dir),
                             "--listen", "127.0.0.1:0"], cwd=ROOT, stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stderr.readline()
        match = re.match(r"serving http://127\.0\.0\.1:(\d+)/metrics", line)
        assert match, line
        text = scrape(int(match.group(1)))
        assert sample_value(text, "hami_container_memory_used_bytes", container=CID_A) == 512 * MiB
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=10) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
        proc.stderr.close()


def test_hamictl_top_uses_the_config_state_dir(state_dir, tmp_path_factory, capsys):
    from hami_runtime.tools import hamictl
    cfg = tmp_path_factory.mktemp("cfg") / "hami.toml"
    cfg.write_text(f'state_dir = "{state_dir}"\n')
    assert hamictl.main(["--config", str(cfg), "top", "--interval", "0", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert sorted(c["id"] for c in data["containers"]) == sorted([CID_A, CID_B])


@pytest.mark.parametrize("command", [["top", "--interval", "0"], ["metrics", "--listen", "127.0.0.1:0"]])
def test_missing_header_is_one_clear_line(state_dir, command):
    env = dict(os.environ, HAMI_REGION_HEADER=str(state_dir / "none.h"))
    result = subprocess.run([sys.executable, "-c", "import sys; from hami_runtime.tools.hamictl import main; "
                             "sys.exit(main())", *command[:1], "--state-dir", str(state_dir),
                             *command[1:]], cwd=ROOT, env=env, capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 1
    assert result.stderr.strip() == f"Error: HAMI_REGION_HEADER: no such file: {state_dir / 'none.h'}"


def test_metrics_over_ipv6_loopback(state_dir):
    if not socket.has_ipv6:
        pytest.skip("no IPv6 in this Python")
    try:
        server, thread = metrics.serve(str(state_dir), "::1", 0)
    except OSError as exc:
        pytest.skip(f"no IPv6 loopback here: {exc}")
    try:
        url = f"http://[::1]:{server.server_address[1]}/metrics"
        with urllib.request.urlopen(url, timeout=5) as response:
            assert "hami_container_memory_used_bytes" in response.read().decode()
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


def test_watch_refreshes_count_times(state_dir, fake_time):
    result = CliRunner().invoke(top.top_command, ["--state-dir", str(state_dir), "--interval", "0.25",
                                                  "--watch", "--count", "3"])
    assert result.exit_code == 0, result.output
    assert result.output.count("CONTAINER") == 3
    assert fake_time.sleeps == [0.25] * 3
    assert "\033[" not in result.output  # no screen control when not on a terminal


def test_watch_needs_an_interval(state_dir):
    result = CliRunner().invoke(top.top_command, ["--state-dir", str(state_dir), "--interval", "0",
                                                  "--watch"])
    assert result.exit_code == 2
    assert "--interval" in result.output and "0.0 must be above 0 with --watch" in result.output


def plant_link_to_neighbour(state_dir, path):
    path.unlink()
    path.symlink_to(region_of(state_dir, NAME_A))


def plant_fifo(state_dir, path):
    path.unlink()
    os.mkfifo(path)


def plant_copy(state_dir, path):
    copy = path.with_name("copy")
    copy.write_bytes(path.read_bytes())
    copy.replace(path)


PLANTED = {
    "link to a neighbour's": (plant_link_to_neighbour, "a symbolic link"),
    "fifo": (plant_fifo, "not a regular file"),
    "copy renamed over": (plant_copy, "replaced (not the file the runtime made)"),
    "removed": (lambda state_dir, path: path.unlink(), "No such file"),
}


@pytest.mark.parametrize("plant,shown", PLANTED.values(), ids=PLANTED.keys())
def test_what_a_container_plants_in_its_region_dir_is_its_own_error(state_dir, plant, shown):
    """B's processes can write anything in its region dir: top and the metrics show
    B's error, never follow it (nor block on it), and show A as it is."""
    plant(state_dir, region_of(state_dir, NAME_B))
    views = {c.id: c for c in top.read_all(str(state_dir))}
    assert shown in views[CID_B].error and views[CID_B].devices == []
    assert not views[CID_A].error and views[CID_A].devices[0].mem_used_bytes == 512 * MiB
    text = collect(state_dir)
    assert sample_value(text, "hami_container_region_readable", container=CID_B) == 0
    assert sample_value(text, "hami_container_region_readable", container=CID_A) == 1
