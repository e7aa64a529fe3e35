"""hamictl top and metrics over containers the runtime made: each shows the policy
and priority it was created with, and one id under two runc roots is two
containers, each with its own root."""
import json
import os
import subprocess
import termios
import time

import pytest

from hami_runtime.lifecycle.node_state.state_layout import root_key
from hami_runtime.tools import top

from .node import HAMICTL, RUNTIME

# (runc root dir under the node's tmp, annotations) -> what top shows of it
CONTAINERS = [
    ("runc-root", {"hami.io/gpumem": "1000", "hami.io/gpucores": "30",
                   "hami.io/core-policy": "force", "hami.io/priority": "0"}, ("force", 0, 30)),
    ("runc-other", {"hami.io/gpumem": "500"}, ("default", 1, 0)),
]


def test_top_tells_roots_apart_and_shows_policy(node):
    roots = []
    for i, (root, annotations, _) in enumerate(CONTAINERS):
        path = node.tmp / root
        result = node.runtime("--root", str(path), "create", "--bundle",
                              str(node.bundle(f"b{i}", annotations)), "same", cmd=RUNTIME)
        assert result.returncode == 0, result.stderr
        roots.append(str(path))
    try:
        top = node.hamictl("top", "--interval", "0", "--json")
        assert top.returncode == 0, top.stderr
        seen = {c["runc_root"]: c for c in json.loads(top.stdout)["containers"]}
        assert sorted(seen) == sorted(roots)
        for root, (_, _, (policy, priority, cores)) in zip(roots, CONTAINERS):
            c = seen[root]
            assert (c["id"], c["name"], c["root_key"]) == ("same", f"same@{root_key(root)}",
                                                           root_key(root))
            assert (c["core_policy"], c["priority"], c["devices"][0]["sm_limit_pct"]) == (
                policy, priority, cores)
        table = node.hamictl("top", "--interval", "0").stdout.splitlines()
        rows = sorted(tuple(line.split()[i] for i in (1, 4, 5)) for line in table
                      if line.startswith("same "))
        assert rows == sorted((root, policy, ("high", "low")[priority])
                              for root, (_, _, (policy, priority, _)) in zip(roots, CONTAINERS))
    finally:
        for root in roots:
            node.runtime("--root", root, "delete", "-f", "same", cmd=RUNTIME)


NAMED = {"hami.io/gpumem": "1000", "io.kubernetes.cri.sandbox-namespace": "ml",
         "io.kubernetes.cri.sandbox-name": "trainer-0", "io.kubernetes.cri.container-name": "trainer"}


@pytest.fixture
def named(node):
    """One GPU container that a pod's annotations name ml/trainer-0/trainer."""
    made = node.runtime("create", "--bundle", str(node.bundle("named", NAMED)), "named-c", cmd=RUNTIME)
    assert made.returncode == 0, made.stderr
    yield "named-c"
    node.runtime("delete", "-f", "named-c", cmd=RUNTIME)


def test_ps_top_and_gpus_name_a_container_alike(node, named):
    """<namespace>/<pod>/<container> in every tool (node_view.shown_name)."""
    ps = node.hamictl("ps")
    assert ps.returncode == 0, ps.stderr
    [row] = [x for x in ps.stdout.splitlines() if x.startswith(named)]
    assert row.split()[-1] == "ml/trainer-0/trainer"
    assert "ml/trainer-0/trainer" in node.hamictl("top", "--interval", "0").stdout
    assert "ml/trainer-0/trainer" in node.hamictl("gpus").stdout


@pytest.mark.parametrize("width", [80, 100, 60])
def test_top_fits_the_width_and_never_wraps(node, named, width):
    full = node.hamictl("top", "--interval", "0")  # not a terminal: every column in full
    assert full.returncode == 0, full.stderr
    assert max(map(len, full.stdout.splitlines())) > 120
    fitted = node.hamictl("top", "--interval", "0", "--width", str(width))
    assert fitted.returncode == 0, fitted.stderr
    lines = fitted.stdout.splitlines()
    assert max(map(len, lines)) <= width
    [row] = [x for x in lines if x.startswith(named)]
    header = next(x for x in lines if x.startswith("CONTAINER"))
    assert "MEM MiB" in header and "1000" in row  # the memory column stays, abbreviated
    if width >= 80:
        assert row.split()[-1] == "ml/trainer-0/trainer"
    assert [x for x in lines if x.startswith("GPU ")] and "MEM MiB drv/prom/cap" in fitted.stdout


def test_fit_columns_abbreviates_then_drops_then_cuts():
    rows = [["A", "UUID", "B"], ["x", "GPU-aaaaaaaa-0000-0000-0000-000000000000", "y" * 30]]
    steps = [("UUID", ("UUID", 13)), ("UUID", None)]
    assert top.fit_columns([list(r) for r in rows], 0, steps)[1].startswith("x  GPU-aaaaaaaa-0000")
    assert top.fit_columns([list(r) for r in rows], 50, steps)[1] == "x  GPU-aaaaaaaa~  " + "y" * 30
    assert top.fit_columns([list(r) for r in rows], 33, steps)[1] == "x  " + "y" * 30
    assert top.fit_columns([list(r) for r in rows], 10, steps) == ["A  B", "x  yyyyyyy"]


def test_q_ends_top_watch_and_restores_the_terminal(node):
    """q on a terminal ends --watch at once (Ctrl-C still does); the terminal's
    settings are as they were."""
    master, slave = os.openpty()
    try:
        before = termios.tcgetattr(slave)
        proc = subprocess.Popen(HAMICTL + ["top", "--watch", "--interval", "0.5"], stdin=slave,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=node.env)
        time.sleep(1.5)
        assert proc.poll() is None  # still watching
        os.write(master, b"q")
        try:
            out, err = proc.communicate(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
            pytest.fail("q did not end hamictl top --watch")
        assert proc.returncode == 0, err
        assert out.count(b"no GPU containers") >= 1
        assert termios.tcgetattr(slave) == before
    finally:
        os.close(master)
        os.close(slave)


def test_watch_without_a_terminal_is_unchanged(node):
    proc = node.hamictl("top", "--watch", "--interval", "0.1", "--count", "2")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count("no GPU containers") == 2
