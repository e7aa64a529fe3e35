"""hamictl top and the Prometheus endpoint, over regions with known counters."""
import json
import os
import re
import signal
import socket
import subprocess
import sys
import urllib.request

import pytest
from click.testing import CliRunner

from hami_runtime.tools import metrics, top
from hami_runtime.node import region
from hami_runtime.node.region import DeviceLimit
from tests.conftest import ROOT
from tests.region.fakes import add_busy, fake_process

MiB = 1024 * 1024
CID_A = "a" * 64
CID_B = "bbbbbbbbbbbbbbbbcontainer"
HOST_PID = os.getpid()  # a live process the host can see, as the hook would record it


def owner_of(pid_in_container, host_pid):
    return (pid_in_container << 32) | (region.process_start_ticks(host_pid) & 0xFFFFFFFF)


def gone_pid():
    child = subprocess.Popen(["true"])
    child.wait(timeout=10)
    return child.pid


@pytest.fixture
def state_dir(tmp_path):
    """Two GPU containers: A with two processes on one device, B with two devices."""
    def make(cid, devices):
        d = tmp_path / "containers" / cid
        d.mkdir(parents=True)
        return region.create(d / region.REGION_FILE_NAME, devices)

    a = make(CID_A, [DeviceLimit("GPU-a", 1024 * MiB, 30)])
    fake_process(a, 0, pid=1, host_pid=HOST_PID, owner=owner_of(1, HOST_PID),
                 usage={0: (300 * MiB, 100 * MiB, 0, 40)})
    fake_process(a, 7, pid=2, usage={0: (212 * MiB, 100 * MiB, 0, 2)})
    b = make(CID_B, [DeviceLimit("GPU-b0", 2048 * MiB, 0), DeviceLimit("GPU-b1", 0, 60)])
    fake_process(b, 1, pid=9, usage={1: (64 * MiB, 64 * MiB, 0, 1)})
    (tmp_path / "containers" / "no-region-yet").mkdir()
    return tmp_path


def test_read_all_reports_limits_and_summed_usage(state_dir):
    views = {c.id: c for c in top.read_all(str(state_dir))}
    assert sorted(views) == sorted([CID_A, CID_B])
    a, b = views[CID_A], views[CID_B]
    assert [(d.uuid, d.mem_used_bytes, d.mem_limit_bytes, d.sm_limit_pct) for d in a.devices] == [
        ("GPU-a", 512 * MiB, 1024 * MiB, 30)]
    assert [(p.pid, p.host_pid, p.mem_used_bytes) for p in a.processes] == [
        (1, HOST_PID, [300 * MiB]), (2, 0, [212 * MiB])]
    assert [p.alive for p in a.processes] == [True, None]
    assert [(d.mem_used_bytes, d.mem_limit_bytes, d.sm_limit_pct) for d in b.devices] == [
        (0, 2048 * MiB, 0), (64 * MiB, 0, 60)]


@pytest.mark.parametrize("busy_ns,elapsed_ns,expected", [
    (250_000_000, 1_000_000_000, 25.0),
    (0, 1_000_000_000, 0.0),
    (1_000_000_000, 2_000_000_000, 50.0),
])
def test_sm_use_is_busy_time_over_the_interval(state_dir, busy_ns, elapsed_ns, expected):
    path = state_dir / "containers" / CID_A / region.REGION_FILE_NAME
    before = top.read_all(str(state_dir))
    add_busy(path, 0, busy_ns, slot=0)
    after = top.read_all(str(state_dir))
    top.add_rates(before, after, elapsed_ns)
    a = next(c for c in after if c.id == CID_A)
    assert a.devices[0].sm_use_pct == expected
    assert a.processes[0].sm_use_pct == [expected]
    assert a.processes[1].sm_use_pct == [0.0]


def test_table_shows_each_container_device_and_process(state_dir):
    result = CliRunner().invoke(top.top_command, ["--state-dir", str(state_dir), "--interval", "0"])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[0].split()[:3] == ["CONTAINER", "DEV", "UUID"]
    assert re.search(r"^aaaaaaaaaaaa\s+0\s+GPU-a\s+512 / 1024\s+\? / 30%\s+2$", result.output, re.M)
    assert re.search(rf"^  pid 1 \(host {HOST_PID}\)\s+0\s+300 \(context 100\)\s+\?\s+40 launches$",
                     result.output, re.M)
    assert re.search(r"^  pid 2 \(host \?\)\s+0\s+212 \(context 100\)", result.output, re.M)
    assert re.search(r"^bbbbbbbbbbbb\s+0\s+GPU-b0\s+0 / 2048\s+\? / -\s+0$", result.output, re.M)
    assert re.search(r"^bbbbbbbbbbbb\s+1\s+GPU-b1\s+64 / -\s+\? / 60%\s+1$", result.output, re.M)


def test_exited_process_is_marked_and_not_counted(state_dir):
    """A slot whose process is gone still counts against the limit until a process of
    the container reclaims it; top says so and counts only live processes."""
    path = state_dir / "containers" / CID_A / region.REGION_FILE_NAME
    dead = gone_pid()
    fake_process(path, 9, pid=4, host_pid=dead, owner=owner_of(4, HOST_PID),
                 usage={0: (24 * MiB, 24 * MiB, 0, 0)})
    result = CliRunner().invoke(top.top_command, ["--state-dir", str(state_dir), "--interval", "0"])
    assert re.search(r"^aaaaaaaaaaaa\s+0\s+GPU-a\s+536 / 1024\s+\? / 30%\s+2$", result.output, re.M)
    assert re.search(rf"^  pid 4 \(host {dead}, exited\)\s+0\s+24 \(context 24\)", result.output,
                     re.M), result.output


def test_json_output(state_dir):
    result = CliRunner().invoke(top.top_command,
                                ["--state-dir", str(state_dir), "--interval", "0.05", "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    a = next(c for c in data["containers"] if c["id"] == CID_A)
    assert a["devices"][0]["mem_used_bytes"] == 512 * MiB
    assert a["devices"][0]["sm_use_pct"] == 0.0  # nothing ran during the interval
    assert [p["pid"] for p in a["processes"]] == [1, 2]


def test_unreadable_region_is_shown_not_fatal(state_dir):
    path = state_dir / "containers" / CID_B / region.REGION_FILE_NAME
    os.truncate(path, 10)
    result = CliRunner().invoke(top.top_command, ["--state-dir", str(state_dir), "--interval", "0"])
    assert result.exit_code == 0
    assert re.search(r"^bbbbbbbbbbbb\s+-\s+-\s+region .*truncated", result.output, re.M)
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
        dev_a = dict(container=CID_A, device="0", uuid="GPU-a")
        assert sample_value(text, "hami_container_memory_used_bytes", **dev_a) == 512 * MiB
        assert sample_value(text, "hami_container_memory_limit_bytes", **dev_a) == 1024 * MiB
        assert sample_value(text, "hami_container_sm_limit_percent", **dev_a) == 30
        assert sample_value(text, "hami_container_processes", **dev_a) == 2
        assert sample_value(text, "hami_container_sm_busy_seconds_total", **dev_a) == 0
        assert sample_value(text, "hami_container_processes", container=CID_B, device="1") == 1
        assert sample_value(text, "hami_container_region_readable", container=CID_B) == 1
        # Counters move between scrapes: nothing is cached.
        add_busy(state_dir / "containers" / CID_A / region.REGION_FILE_NAME, 0, 1_500_000_000)
        fake_process(state_dir / "containers" / CID_A / region.REGION_FILE_NAME, 3, pid=3,
                     usage={0: (10 * MiB, 0, 0, 0)})
        text = scrape(port)
        assert sample_value(text, "hami_container_sm_busy_seconds_total", **dev_a) == 1.5
        assert sample_value(text, "hami_container_memory_used_bytes", **dev_a) == 522 * MiB
        assert sample_value(text, "hami_container_processes", **dev_a) == 3
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


def test_watch_refreshes_count_times(state_dir):
    result = CliRunner().invoke(top.top_command, ["--state-dir", str(state_dir), "--interval", "0.05",
                                                  "--watch", "--count", "3"])
    assert result.exit_code == 0, result.output
    assert result.output.count("CONTAINER") == 3
    assert "\033[" not in result.output  # no screen control when not on a terminal


def test_watch_needs_an_interval(state_dir):
    result = CliRunner().invoke(top.top_command, ["--state-dir", str(state_dir), "--interval", "0",
                                                  "--watch"])
    assert result.exit_code == 2
    assert "--interval" in result.output and "0.0 must be above 0 with --watch" in result.output
