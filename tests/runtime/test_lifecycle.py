"""Capacity, races, crashes and recovery of the allocator, through the real
create path; passthrough of everything else."""
import json
import multiprocessing
import os
import signal
import subprocess
import sys
import sysconfig
import time

import pytest

from tests.conftest import ROOT

from .node import LAUNCHER, RUNC, RUNTIME, TIMEOUT

needs_launcher = pytest.mark.skipif(not LAUNCHER.exists(), reason="make build builds the launcher")


def gpu_uuids(node):
    return [g["uuid"] for g in json.loads(node.hamictl("gpus", "--json").stdout)]


def test_split_count_refuses_the_eleventh(node):
    uuid = gpu_uuids(node)[0]
    request = {"hami.io/gpumem": "100", "hami.io/gpu-uuid": uuid}
    for n in range(10):
        proc = node.create(f"s{n}", node.bundle(f"s{n}", request))
        assert proc.returncode == 0, proc.stderr
    proc = node.create("s10", node.bundle("s10", request))
    assert proc.returncode == 1
    assert "10/10 slots used" in proc.stderr and proc.stderr.count("\n") == 1
    assert "s10" not in node.containers()
    assert node.runtime("delete", "s3").returncode == 0
    proc = node.create("s11", node.bundle("s11", request))
    assert proc.returncode == 0, proc.stderr
    assert sorted(r["container"] for r in node.ps()) == sorted(
        [f"s{n}" for n in range(10) if n != 3] + ["s11"])


def _race_one(env, state_dir, root, bundle, cid, results, hold):
    os.environ.update(env)  # the node's config and its own simulated GPU
    from hami_runtime import argv, config as config_mod
    from hami_runtime.lifecycle.commands import create
    from hami_runtime.errors import HamiError
    inv = argv.parse(["--root", root, "create", "--bundle", bundle, cid])
    try:
        create.prepare(config_mod.load(), inv)
        results.put((cid, "ok"))
    except HamiError as exc:
        results.put((cid, exc.line()))
    hold.wait(TIMEOUT)  # stay alive: an entry lives while its creator does


def test_fifty_racing_creates_never_overcommit(node):
    """50 processes run the create path at once for 2000 MiB each of one
    16384 MiB GPU: exactly 8 get it, the rest are refused clearly."""
    uuid = gpu_uuids(node)[0]
    ctx = multiprocessing.get_context("fork")
    results, hold = ctx.Queue(), ctx.Event()
    procs = []
    for n in range(50):
        bundle = node.bundle(f"r{n}", {"hami.io/gpumem": "2000", "hami.io/gpu-uuid": uuid})
        procs.append(ctx.Process(target=_race_one, args=(
            node.env, str(node.state_dir), str(node.runc_root), str(bundle), f"r{n}",
            results, hold)))
    try:
        for p in procs:
            p.start()
        outcomes = dict(results.get(timeout=TIMEOUT) for _ in procs)
        allocations = node.allocations()
    finally:
        hold.set()
        for p in procs:
            p.join(TIMEOUT)
    granted = [cid for cid, outcome in outcomes.items() if outcome == "ok"]
    assert len(granted) == 8
    assert sorted(allocations) == sorted(granted)
    assert sum(d["mem_mib"] for e in allocations.values() for d in e["devices"]) <= 16384
    assert all("room" in o for o in outcomes.values() if o != "ok")
    # Their creators are gone and no container exists: ps shows none, the next
    # create or delete (or doctor --repair) frees all.
    assert node.ps() == []
    assert node.hamictl("doctor", "--repair").returncode == 0
    assert node.allocations() == {} and os.listdir(node.state_dir / "containers") == []


def test_sigkill_during_create_leaks_nothing(node, tmp_path):
    slow = tmp_path / "slow-runc"
    slow.write_text(f"#!/bin/sh\nsleep 5\nexec {RUNC} \"$@\"\n")
    slow.chmod(0o755)
    config = tmp_path / "slow.toml"
    saved, node.config = node.config, config
    node.write_config(runtime=[str(slow)])
    node.config = saved
    env = {**node.env, "HAMI_CONFIG": str(config)}
    for n, delay in enumerate((0.05, 0.15, 0.3, 0.5, 0.8, 1.5)):
        bundle = node.bundle(f"k{n}", {"hami.io/gpumem": "1000"})
        with open(tmp_path / "out", "wb") as out:
            proc = subprocess.Popen(RUNTIME + ["--root", str(node.runc_root), "create", "--bundle",
                                               str(bundle), f"k{n}"], stdin=subprocess.DEVNULL,
                                    stdout=out, stderr=out, env=env, start_new_session=True)
            time.sleep(delay)
            os.killpg(proc.pid, signal.SIGKILL)  # the runtime and anything it started
            proc.wait(TIMEOUT)
    assert node.ps() == []  # dead entries are not shown; ps frees nothing
    assert node.hamictl("doctor", "--repair").returncode == 0  # as the next create or delete, frees them
    assert os.listdir(node.state_dir / "containers") == os.listdir(node.state_dir / "private") == []
    assert sorted(os.listdir(node.state_dir)) == ["activity", "allocations.json", "allocations.lock", "cache",
                                                  "containers", "priority", "private"]
    for board in (node.state_dir / "activity", node.state_dir / "priority"):
        # their GPU dirs stay (containers watch them), empty
        assert [e for gpu in os.listdir(board) for e in os.listdir(board / gpu)] == []
    proc = node.create("after", node.bundle("after", {"hami.io/gpumem": "16384"}))
    assert proc.returncode == 0, proc.stderr


def test_runc_failing_after_allocation_releases(node):
    bundle = node.bundle("broken", {"hami.io/gpumem": "1000"}, args=("/no/such/program",))
    proc = node.create("broken", bundle)
    assert proc.returncode != 0
    assert node.ps() == []  # dead: not shown; the next create or delete frees it
    node.reconcile()
    assert node.allocations() == {}
    assert os.listdir(node.state_dir / "containers") == []


@pytest.mark.parametrize("damage", ["corrupt", "missing"])
def test_state_rebuilt_from_live_bundles(node, damage):
    for cid, mem in (("a", "1000"), ("b", "2000")):
        assert node.create(cid, node.bundle(cid, {"hami.io/gpumem": mem})).returncode == 0
    before = node.allocations()
    state = node.state_dir / "allocations.json"
    if damage == "corrupt":
        state.write_text('{"version": 1, "allocations": {"a": ')
    else:
        state.unlink()
    rows = {r["container"]: r["memory_mib"] for r in node.ps()}  # as rebuilt; ps writes nothing
    assert rows == {"a": 1000, "b": 2000}
    assert node.runtime("delete", "a").returncode == 0  # rebuilds, then frees a
    after = node.allocations()
    assert {k: v["devices"] for k, v in after.items()} == {k: v["devices"] for k, v in before.items()
                                                           if k == "b"}
    assert [r["container"] for r in node.ps()] == ["b"]


def test_delete_of_running_container_without_force_keeps_allocation(node):
    bundle = node.bundle("busy", {"hami.io/gpumem": "1000"})
    assert node.runtime("run", "--detach", "--bundle", str(bundle), "busy").returncode == 0
    assert node.runtime("delete", "busy").returncode != 0
    assert [r["container"] for r in node.ps()] == ["busy"]
    assert node.runtime("kill", "busy", "KILL").returncode == 0
    deadline = time.time() + 10
    while node.runtime("delete", "busy").returncode != 0 and time.time() < deadline:
        time.sleep(0.1)
    assert node.ps() == []


ENTRIES = [pytest.param(RUNTIME, id="python"),
           pytest.param([str(LAUNCHER)], id="launcher", marks=needs_launcher)]


def imported_by(node, *args):
    """The modules a hami-runtime command loads itself (what site loads comes first)."""
    err = node.tmp / "importtime"
    with open(err, "wb") as stderr:  # files, not pipes: a created container inherits them
        proc = subprocess.run([sys.executable, "-X", "importtime", "-m", "hami_runtime", "--root",
                               str(node.runc_root)] + list(args), stdout=subprocess.DEVNULL,
                              stderr=stderr, env=node.env, timeout=TIMEOUT, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, err.read_text()[-2000:]
    names = [line.split("|")[-1].strip() for line in err.read_text().splitlines()
             if line.startswith("import time:")]
    return set(names[names.index("site") + 1:] if "site" in names else names)


def test_gpu_create_with_caches_loads_no_heavy_package(node):
    """Once the config has settled and a create has cached it and the GPU list,
    a GPU create loads no TOML parser, no config model, no NVML binding, no
    schema validator and no header parser (the region's prebuilt layout needs
    only cffi's C backend)."""
    from hami_runtime.config_cache import SETTLED_NS
    time.sleep(max(0.0, SETTLED_NS / 1e9 - (time.time() - node.config.stat().st_ctime)) + 0.2)
    warm = node.bundle("warm", {"hami.io/gpumem": "100"})
    assert node.create("warm", warm).returncode == 0
    assert node.runtime("delete", "-f", "warm").returncode == 0
    gpu = node.bundle("gpu", {"hami.io/gpumem": "100"})
    modules = imported_by(node, "create", "--bundle", str(gpu), "gpu")
    assert "hami_runtime.lifecycle.node_state.allocator" in modules  # it did serve the request
    assert not {m.partition(".")[0] for m in modules} & {
        "tomllib", "tomli", "pydantic", "pydantic_core", "pynvml", "jsonschema", "cffi"}


@pytest.mark.parametrize("entry", ENTRIES)
# --version prints ours before runc's lines (test_version.py)
@pytest.mark.parametrize("args", [["list"], ["state", "nope"], ["--log-format=json", "list"],
                                  ["kill", "nope"], ["features"], ["--unknown-flag", "list"]])
def test_passthrough_matches_runc(node, args, entry):
    ours = node.runtime(*args, cmd=entry)
    theirs = subprocess.run([RUNC, "--root", str(node.runc_root), "--log", str(node.tmp / "runc.log")]
                            + args, capture_output=True, text=True, timeout=TIMEOUT)
    assert (ours.returncode, ours.stdout) == (theirs.returncode, theirs.stdout)


@pytest.mark.parametrize("args", [["list"], ["create", "--bundle", "{plain}", "plain"]])
def test_passthrough_imports_nothing_heavy(node, args):
    """Passthrough, and create of a container with no request, load no heavy module
    once the config is the one validated before."""
    from hami_runtime.config_cache import SETTLED_NS
    time.sleep(max(0.0, SETTLED_NS / 1e9 - (time.time() - node.config.stat().st_ctime)) + 0.2)
    from hami_runtime import config
    config.load(str(node.config))  # validates it and keeps the values in the state dir
    plain = node.bundle("plain", args=("true",))
    args = [a.replace("{plain}", str(plain)) for a in args]
    err = node.tmp / "importtime"
    # Python started as the launcher starts it: no site processing (the test venv's
    # client wheels install .pth files that import modules at every start), this
    # tree and the venv's packages on the path.
    env = dict(node.env, PYTHONPATH=f"{ROOT}:{sysconfig.get_paths()['purelib']}")
    with open(err, "wb") as stderr:  # files, not pipes: a created container inherits them
        proc = subprocess.run([sys.executable, "-S", "-X", "importtime", "-m", "hami_runtime", "--root",
                               str(node.runc_root)] + args, stdout=subprocess.DEVNULL, stderr=stderr,
                              env=env, timeout=TIMEOUT, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, err.read_text()[-2000:]
    modules = {line.split("|")[-1].strip() for line in err.read_text().splitlines()
               if line.startswith("import time:")}
    imported = {name.split(".")[0] for name in modules}
    assert not imported & {"pydantic", "pynvml", "jsonschema", "cffi", "click"}
    # nor the modules that serve a GPU request only
    assert not modules & {"tempfile", "hami_runtime.lifecycle.spec_edit.modifiers",
                          "hami_runtime.lifecycle.node_state.store", "hami_runtime.lifecycle.node_state.allocator",
                          "hami_runtime.node.region", "hami_runtime.node.discovery"}


def test_hook_release_is_idempotent_and_spares_a_live_container(node):
    assert node.create("h", node.bundle("h", {"hami.io/gpumem": "10"})).returncode == 0
    state = json.dumps({"ociVersion": "1.0.2", "id": "h", "status": "stopped", "pid": 0,
                        "bundle": str(node.tmp)})

    def poststop():
        proc = subprocess.run([sys.executable, "-m", "hami_hook", "--state-dir", str(node.state_dir),
                               "--runc-root", str(node.runc_root), "poststop"], input=state,
                              capture_output=True, text=True, timeout=TIMEOUT)
        assert proc.returncode == 0, proc.stderr

    poststop()  # runc still has the container: nothing is freed
    assert list(node.allocations()) == ["h"]
    # runc's own delete runs the hook (this create had no launcher): freed
    subprocess.run([RUNC, "--root", str(node.runc_root), "delete", "h"], check=True, timeout=TIMEOUT)
    assert node.allocations() == {}
    poststop()
    assert node.allocations() == {}
    bad = subprocess.run([sys.executable, "-m", "hami_hook", "--state-dir", str(node.state_dir),
                          "poststop"], input='{"id": "../x"}', capture_output=True, text=True,
                         timeout=TIMEOUT)
    assert bad.returncode == 1 and "container id" in bad.stderr


@needs_launcher
def test_launcher_hands_create_and_delete_to_python(node):
    bundle = node.bundle("l1", {"hami.io/gpumem": "700"})
    proc = node.create("l1", bundle, cmd=[str(LAUNCHER)])
    assert proc.returncode == 0, proc.stderr
    assert [(r["container"], r["memory_mib"]) for r in node.ps()] == [("l1", 700)]
    assert node.runtime("delete", "-f", "l1", cmd=[str(LAUNCHER)]).returncode == 0
    assert node.ps() == []


@needs_launcher
@pytest.mark.parametrize("runtime_line,works", [
    ('runtime = "{runc}"', True),
    ('runtime = [\n  "{runc}",\n]', True),       # not one line: Python reads it
    ('runtime = ["/nonexistent/runc", "{runc}"]', True),
    ('runtime = "{launcher}"', False),              # itself: refused
    ('runtime = ["/nonexistent/runc"]', False),
])
def test_launcher_reads_the_runtime_key(node, runtime_line, works):
    text = node.config.read_text().splitlines()
    text = [l for l in text if not l.startswith("runtime")]
    line = runtime_line.format(runc=RUNC, launcher=LAUNCHER)
    node.config.write_text(line + "\n" + "\n".join(text) + "\n")
    proc = node.runtime("list", cmd=[str(LAUNCHER)])
    if works:
        assert proc.returncode == 0 and proc.stdout.startswith("ID"), proc.stderr
    else:
        assert proc.returncode == 1 and "config runtime" in proc.stderr and proc.stderr.count("\n") == 1


def test_rebuild_keeps_a_create_in_flight(node):
    """A create that allocated but has not become a runc container yet (its
    process still runs) survives a lost state file."""
    ctx = multiprocessing.get_context("fork")
    results, hold = ctx.Queue(), ctx.Event()
    bundle = node.bundle("flight", {"hami.io/gpumem": "4000"})
    proc = ctx.Process(target=_race_one, args=(node.env, str(node.state_dir),
                                               str(node.runc_root), str(bundle), "flight", results, hold))
    proc.start()
    try:
        assert results.get(timeout=TIMEOUT) == ("flight", "ok")
        (node.state_dir / "allocations.json").unlink()
        assert [(r["container"], r["memory_mib"]) for r in node.ps()] == [("flight", 4000)]
    finally:
        hold.set()
        proc.join(TIMEOUT)
    assert node.ps() == []
