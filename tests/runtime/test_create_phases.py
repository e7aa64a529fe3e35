"""One GPU create's phases (hami_runtime/phases.py): at log level debug one
line per create names every phase with its time, through the launcher (its
own part, then the create server's handoff or its own Python) and without it;
at the default level no such line is written."""
import re
import time

import pytest

from hami_runtime import phases

from .node import LAUNCHER
from .test_create_server import answering, configure, create, no_requests_in_flight, released

GPU = {"hami.io/gpumem": "100", "hami.io/gpucores": "30"}
# what a create that allocates does, in order (lifecycle/serving/command.py, create.py)
PYTHON_PHASES = ["config", "spec_read", "request", "gpus", "checks", "majors", "driver_files", "gpus_waited",
                 "allocation", "host_files", "injection", "spec_edit", "spec_write", "log"]
LINE = re.compile(r" debug pid=\d+ create (\S+) phases: (.*) total=([\d.]+)ms(.*)$")
needs_launcher = pytest.mark.skipif(not LAUNCHER.exists(), reason="make build builds the launcher")


def phase_lines(node) -> dict:
    """container id -> ([(phase, ms)], total ms, [notes])"""
    log = node.tmp / "hami.log"
    found = {}
    for line in (log.read_text() if log.exists() else "").splitlines():
        got = LINE.search(line)
        if got:
            spans = [(name, float(ms)) for name, ms in re.findall(r"(\w+)=([\d.]+)ms", got.group(2))]
            found[got.group(1)] = (spans, float(got.group(3)), [n.strip() for n in got.group(4).split(";")
                                                                  if n.strip()])
    return found


def check_line(spans, total, first):
    assert [name for name, _ in spans] == first + PYTHON_PHASES
    assert all(ms >= 0 for _, ms in spans)
    assert abs(sum(ms for _, ms in spans) - total) < 0.05 * len(spans)


@needs_launcher
def test_each_create_through_the_launcher_says_its_phases_at_debug(node):
    """The first GPU create runs its own Python (which starts the server), the
    next is served; both lines name every phase, and the served one found the
    GPUs and driver files in the discovery cache the server's warm-up filled
    (its environment, but for the launcher's markers, is the engine's)."""
    configure(node, log_level="debug")
    for cid in ("own", "served"):
        rc, err, _, _ = create(node, cid, node.bundle(cid, GPU, args=("true",)))
        assert rc == 0, err
        assert node.runtime("delete", "-f", cid, cmd=[str(LAUNCHER)]).returncode == 0
        assert answering(node) and released(node) and no_requests_in_flight(node)
    lines = phase_lines(node)
    spans, total, notes = lines["own"]
    check_line(spans, total, ["launcher_python"])
    assert "a Python of its own (no create server answered)" in notes
    spans, total, notes = lines["served"]
    check_line(spans, total, ["launcher", "handoff"])
    assert notes[:3] == ["served by the create server", "GPUs from the discovery cache",
                         "driver files from the discovery cache"], notes
    assert re.fullmatch(r"\d+ driver files mounted", notes[3])


def test_a_create_without_the_launcher_says_its_phases(node):
    node.write_config(log_file=str(node.tmp / "hami.log"), log_level="debug")
    assert node.create("direct", node.bundle("direct", GPU, args=("true",))).returncode == 0
    spans, total, notes = phase_lines(node)["direct"]
    check_line(spans, total, [])
    assert any(n.startswith("GPUs discovered through NVML (discovery cache: no entry)") for n in notes), notes
    assert any(n.startswith("NVML loaded in ") and "nvmlInit" in n for n in notes), notes
    node.runtime("delete", "-f", "direct")


@pytest.mark.parametrize("through", ["python", "launcher"])
def test_no_phase_line_at_the_default_level(node, through):
    if through == "launcher" and not LAUNCHER.exists():
        pytest.skip("make build builds the launcher")
    configure(node)  # log_level at its default, info
    cmd = [str(LAUNCHER)] if through == "launcher" else None
    assert node.runtime("create", "--bundle", str(node.bundle("quiet", GPU, args=("true",))), "quiet",
                        cmd=cmd).returncode == 0
    text = (node.tmp / "hami.log").read_text()
    assert "quiet: allocated GPU" in text and "phases:" not in text
    node.runtime("delete", "-f", "quiet", cmd=cmd)


def test_the_line_and_the_launchers_stamp():
    trace = phases.Trace(1_000_000)
    trace.mark("launcher", 1_500_000)
    trace.mark("handoff", 3_750_000)
    trace.notes.append("served by the create server")
    assert trace.line("c1") == ("create c1 phases: launcher=0.50ms handoff=2.25ms total=2.75ms; "
                                "served by the create server")
    now = time.monotonic_ns()
    env = {phases.LAUNCHER_STARTED_ENV: str(now), "PATH": "/bin"}
    assert phases.launcher_started(env) == now and env == {"PATH": "/bin"}  # never passed on
    for bad in ("", "x", "-5", str(now + 10**12)):  # not a time of this boot's past
        assert phases.launcher_started({phases.LAUNCHER_STARTED_ENV: bad}) is None
    assert phases.launcher_started({}) is None


def test_the_launchers_markers_are_not_in_the_discovery_key(monkeypatch):
    """The create server inherits them from the GPU create that started it; a
    create takes them out first: the warm-up's entry must be the creates'."""
    from hami_runtime.node import discovery_cache
    before = discovery_cache._environment_hash()
    monkeypatch.setenv("HAMI_LAUNCHER", "/usr/bin/hami-runtime")
    monkeypatch.setenv(phases.LAUNCHER_STARTED_ENV, "12345")
    assert discovery_cache._environment_hash() == before
    monkeypatch.setenv("LD_LIBRARY_PATH", "/elsewhere")
    assert discovery_cache._environment_hash() != before


def test_a_miss_says_why():
    from hami_runtime.node.discovery_cache import _miss
    assert _miss(None, None) == "no entry"
    cached = {"key": {"boot_id": "a", "environment": "x", "kernel_gpus": ["0"]}}
    assert _miss(cached, {"boot_id": "a", "environment": "y", "kernel_gpus": ["0", "1"]}) == \
        "its key differs: environment, kernel_gpus"
    assert _miss(cached, dict(cached["key"])) == "its value unusable"
