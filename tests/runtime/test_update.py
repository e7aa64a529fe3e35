"""hamictl update: a running container's slice resized in one allocator
transaction; the record and the region change together or not at all.

Containers here are seeded straight into the state dir (a runc state.json
marks them live, the region is written as create writes it), so that every
case runs in milliseconds; tests/runtime/test_update_container.py resizes a
real container while a process in it allocates."""
import json
import multiprocessing
import os
import random
import time

import pytest

from hami_runtime.lifecycle.node_state import container_files, state_layout, store
from hami_runtime.node import region

from .node import TIMEOUT

MIB = 1 << 20
CAP = 16384  # MiB of each simulated GPU


@pytest.fixture(scope="module")
def uuids(module_node):
    return [g["uuid"] for g in json.loads(module_node.hamictl("gpus", "--json").stdout)]


def seed(node, cid, devices, root=None, policy="default", priority=1):
    """A live allocation of `devices` [(gpu index, uuid, MiB, cores)] with its region."""
    root = str(root or node.runc_root)
    os.makedirs(os.path.join(root, cid), exist_ok=True)
    with open(os.path.join(root, cid, "state.json"), "w") as f:
        f.write("{}")
    name = state_layout.alloc_name(root, cid)
    entry = {"id": cid, "runc_root": root, "bundle": f"/bundles/{cid}",
             "devices": [{"index": i, "uuid": u, "mem_mib": m, "cores": c} for i, u, m, c in devices],
             "core_policy": policy, "priority": priority, "pid": 0}
    with store.transaction(str(node.state_dir)) as state:
        state.allocations[name] = entry
        state_layout.make_dirs(str(node.state_dir), name)
    container_files.make(str(node.state_dir), name, [region.DeviceLimit(u, m * MIB, c) for _, u, m, c in devices],
                         policy, priority, region.PRIORITY_IDLE_MS_DEFAULT)
    return name


def limits_of(node, name):
    return container_files.open_limits(str(node.state_dir), name)


def use(node, name, device, mib):
    """A live process of the container holding `mib` on region device `device`."""
    with region.Region(node.state_dir / "containers" / name / region.REGION_FILE_NAME,
                       writable=True) as reg:
        slot = reg._c.procs[0]
        start = region.process_start_ticks(os.getpid())
        slot.owner = (os.getpid() << 32) | (start & 0xFFFFFFFF)
        slot.pid = slot.host_pid = os.getpid()
        slot.mem_used[device] = mib * MIB
        reg._c.procs_high = 1


def snapshot(node, name):
    """The record and the container's limits, to compare before and after a refusal."""
    with limits_of(node, name) as limits:
        live = (limits.devices, limits.core_policy, limits.priority)
    return json.loads((node.state_dir / "allocations.json").read_text())["allocations"], live


def matches(node, name):
    """The limits hold exactly what the record says."""
    entry = json.loads((node.state_dir / "allocations.json").read_text())["allocations"][name]
    with limits_of(node, name) as limits:
        assert [(d.uuid, d.mem_limit_bytes, d.sm_limit_pct) for d in limits.devices] == \
            [(d["uuid"], d["mem_mib"] * MIB, d["cores"]) for d in entry["devices"]]
        assert (limits.core_policy, limits.priority) == (entry["core_policy"], entry["priority"])
    return entry


def update(node, *args):
    return node.hamictl("update", *args)


# (what the container holds [(gpu, MiB, cores)], others on the node [(gpu, MiB, cores)],
#  MiB used now per device, options) -> the devices after [(MiB, cores)], policy, priority
GRANTED = [
    pytest.param([(0, 3000, 30)], [], [0], ["--gpumem", "4000"], [(4000, 30)], "default", 1,
                 id="grow"),
    pytest.param([(0, 3000, 30)], [(0, 12384, 0)], [0], ["--gpumem", "4000"], [(4000, 30)],
                 "default", 1, id="grow-to-exactly-full"),
    pytest.param([(0, 3000, 30)], [], [1000], ["--gpumem", "2000"], [(2000, 30)], "default", 1,
                 id="shrink-above-use"),
    pytest.param([(0, 3000, 30)], [], [2500], ["--gpumem", "2000", "--force"], [(2000, 30)],
                 "default", 1, id="force-shrink-below-use"),
    pytest.param([(0, 3000, 30)], [], [0], ["--gpumem-percentage", "50"], [(8192, 30)],
                 "default", 1, id="percentage"),
    pytest.param([(0, 3000, 30)], [(0, 100, 60)], [0], ["--gpucores", "40"], [(3000, 40)],
                 "default", 1, id="cores-grow"),
    pytest.param([(0, 3000, 30)], [(0, 100, 90)], [0], ["--gpucores", "10"], [(3000, 10)],
                 "default", 1, id="cores-shrink-on-a-full-gpu"),
    pytest.param([(0, 3000, 30)], [], [0], ["--core-policy", "force"], [(3000, 30)], "force", 1,
                 id="policy"),
    pytest.param([(0, 3000, 30)], [], [0], ["--priority", "0"], [(3000, 30)], "default", 0,
                 id="priority"),
    pytest.param([(0, 3000, 30), (1, 1000, 20)], [], [0, 0], ["--gpumem", "2000", "--device", "1"],
                 [(3000, 30), (2000, 20)], "default", 1, id="device-by-index"),
    pytest.param([(0, 3000, 30), (1, 1000, 20)], [], [0, 0], ["--gpumem", "2000", "--gpucores", "50"],
                 [(2000, 50), (2000, 50)], "default", 1, id="every-device"),
]


def seed_case(node, uuids, held, others, used):
    """Container "c" holding `held` [(gpu, MiB, cores)] and using `used` MiB per
    device, beside one container per entry of `others`."""
    name = seed(node, "c", [(g, uuids[g], m, c) for g, m, c in held])
    for n, (g, m, c) in enumerate(others):
        seed(node, f"other{n}", [(g, uuids[g], m, c)])
    for device, mib in enumerate(used):
        if mib:
            use(node, name, device, mib)
    return name


@pytest.mark.parametrize("held,others,used,options,after,policy,priority", GRANTED)
def test_update_granted(node, uuids, held, others, used, options, after, policy, priority):
    name = seed_case(node, uuids, held, others, used)
    proc = update(node, "c", *options)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("c: GPU ")
    # a forced shrink below use says so (one line per such GPU); anything else is silent
    over = [n for n, (mib, (limit, _)) in enumerate(zip(used, after)) if mib > limit]
    assert proc.stderr.count("over its new") == len(over), proc.stderr
    entry = matches(node, name)
    assert [(d["mem_mib"], d["cores"]) for d in entry["devices"]] == after
    assert (entry["core_policy"], entry["priority"]) == (policy, priority)


def test_update_by_uuid_and_json(node, uuids):
    name = seed(node, "c", [(0, uuids[0], 3000, 30), (1, uuids[1], 1000, 20)])
    proc = update(node, "c", "--gpumem", "1500", "--device", uuids[1], "--json")
    assert proc.returncode == 0, proc.stderr
    shown = json.loads(proc.stdout)
    assert shown["name"] == name and shown["id"] == "c"
    assert [(d["uuid"], d["mem_mib"]) for d in shown["devices"]] == [(uuids[0], 3000), (uuids[1], 1500)]
    assert shown == {**matches(node, name), "name": name}


# (held, others, used, options) -> the one line on stderr (contains each part)
REFUSED = [
    pytest.param([(0, 3000, 30)], [(0, 12000, 0)], [0], ["--gpumem", "5000"],
                 ["--gpumem='5000': does not fit on GPU 0 (", "1384 MiB free of 16384 MiB",
                  "at most 4384 MiB fits"], id="grow-does-not-fit"),
    pytest.param([(0, 3000, 30)], [], [2500], ["--gpumem", "2000"],
                 ["--gpumem='2000': GPU 0 (", "uses 2500 MiB now", "--force"], id="shrink-below-use"),
    pytest.param([(0, 3000, 30)], [(0, 100, 60)], [0], ["--gpucores", "50"],
                 ["--gpucores='50': does not fit on GPU 0 (", "10% of cores free",
                  "at most 40% fits"], id="cores-do-not-fit"),
    pytest.param([(0, 3000, 30), (1, 1000, 20)], [(1, 16000, 0)], [0, 0],
                 ["--gpumem", "2000"], ["does not fit on GPU 1 ("], id="second-device-full"),
    pytest.param([(0, 3000, 30)], [], [0], ["--gpumem", "2000", "--device", "1"],
                 ["--device='1': is not one of this container's GPUs (0 GPU-"], id="device-not-held"),
    pytest.param([(0, 3000, 30)], [], [0], ["--gpumem", "0"],
                 ["--gpumem='0': must be a whole number of MiB"], id="zero-memory"),
    pytest.param([(0, 3000, 30)], [], [0], ["--gpumem", "2g"],
                 ["--gpumem='2g': must be a whole number of MiB"], id="memory-with-unit"),
    pytest.param([(0, 3000, 30)], [], [0], ["--gpumem-percentage", "101"],
                 ["--gpumem-percentage='101': must be a whole percentage in 1..100"], id="percentage"),
    pytest.param([(0, 3000, 30)], [], [0], ["--gpumem", "1", "--gpumem-percentage", "1"],
                 ["--gpumem-percentage='1': give --gpumem or --gpumem-percentage, not both"],
                 id="both-memory-options"),
    pytest.param([(0, 3000, 30)], [], [0], ["--gpucores", "-5"],
                 ["--gpucores='-5': must be a whole percentage in 0..100"], id="negative-cores"),
    pytest.param([(0, 3000, 30)], [], [0], ["--priority", "2"],
                 ["--priority='2': must be 0 (high) or 1 (low)"], id="priority"),
    pytest.param([(0, 3000, 30)], [], [0], ["--core-policy", "always"],
                 ["--core-policy='always': must be one of default, force, disable"], id="policy"),
    pytest.param([(0, 3000, 30)], [], [0], [],
                 ["options: nothing to change"], id="nothing"),
]


@pytest.mark.parametrize("held,others,used,options,parts", REFUSED)
def test_update_refused_changes_nothing(node, uuids, held, others, used, options, parts):
    name = seed_case(node, uuids, held, others, used)
    before = snapshot(node, name)
    proc = update(node, "c", *options)
    assert proc.returncode == 1 and proc.stdout == ""
    assert proc.stderr.startswith("hamictl: ") and proc.stderr.count("\n") == 1, proc.stderr
    for part in parts:
        assert part in proc.stderr, proc.stderr
    assert snapshot(node, name) == before
    matches(node, name)


def test_unknown_container(node, uuids):
    seed(node, "c", [(0, uuids[0], 3000, 30)])
    proc = update(node, "nope", "--gpumem", "100")
    assert (proc.returncode, proc.stderr) == (
        1, "hamictl: container='nope': has no GPU allocation on this node\n")


def test_two_roots_need_root(node, uuids):
    other = node.tmp / "runc-other"
    a = seed(node, "same", [(0, uuids[0], 1000, 0)])
    b = seed(node, "same", [(0, uuids[0], 1000, 0)], root=other)
    before = snapshot(node, a)
    proc = update(node, "same", "--gpumem", "2000")
    assert proc.returncode == 1 and proc.stderr.count("\n") == 1
    assert "is held under 2 runc roots" in proc.stderr and "name one with --root" in proc.stderr
    assert str(other) in proc.stderr and str(node.runc_root) in proc.stderr
    assert snapshot(node, a) == before
    proc = update(node, "same", "--gpumem", "2000", "--root", str(other))
    assert proc.returncode == 0, proc.stderr
    assert matches(node, b)["devices"][0]["mem_mib"] == 2000
    assert matches(node, a)["devices"][0]["mem_mib"] == 1000
    proc = update(node, "same", "--gpumem", "2000", "--root", str(node.tmp / "runc-third"))
    assert proc.returncode == 1 and "has no GPU allocation under that runc root" in proc.stderr


def test_rebuild_keeps_the_new_size(node, uuids):
    """A lost state file is rebuilt from the bundles, with the sizes hamictl
    update gave (kept host-side), not those the container was created with."""
    bundle = node.bundle("b", {"hami.io/gpumem": "1000"})
    assert node.create("b", bundle).returncode == 0
    assert update(node, "b", "--gpumem", "2500", "--priority", "0").returncode == 0
    (node.state_dir / "allocations.json").unlink()
    [row] = node.ps()  # as rebuilt (ps writes nothing)
    assert row["memory_mib"] == 2500
    node.reconcile()  # the next create or delete rebuilds and writes it
    assert node.allocations()["b"]["priority"] == 0
    assert node.allocations()["b"]["devices"][0]["mem_mib"] == 2500


# ---- racing updates, creates and deletes -------------------------------------------

def _creator(env, root, bundle, cid, life, results):
    """Creates (the runtime's create path), lives `life` seconds, exits: its entry
    is then freed by the next transaction, as a delete would."""
    os.environ.update(env)
    from hami_runtime import argv, config as config_mod
    from hami_runtime.errors import HamiError
    from hami_runtime.lifecycle.commands import create
    try:
        create.prepare(config_mod.load(), argv.parse(["--root", root, "create", "--bundle",
                                                      bundle, cid]))
        results.put("create ok")
    except HamiError:
        results.put("create refused")
    time.sleep(life)


def _updater(env, ids, rounds, seed_value, results):
    os.environ.update(env)
    from hami_runtime import config as config_mod
    from hami_runtime.errors import HamiError
    from hami_runtime.lifecycle.commands import resize
    from hami_runtime.tools import update as update_mod
    cfg = config_mod.load()
    rng = random.Random(seed_value)
    for _ in range(rounds):
        change = resize.parse(gpumem=str(rng.choice([500, 1500, 3000, 5000, 9000])),
                              gpucores=str(rng.choice([0, 20, 40, 70])))
        try:
            update_mod.update(cfg, rng.choice(ids), change)
            results.put("update ok")
        except HamiError:
            results.put("update refused")


def _check_capacity(state_dir):
    try:
        data = json.loads((state_dir / "allocations.json").read_text())
    except (FileNotFoundError, ValueError):
        return
    mem, cores = {}, {}
    for entry in data["allocations"].values():
        for d in entry["devices"]:
            mem[d["uuid"]] = mem.get(d["uuid"], 0) + d["mem_mib"]
            cores[d["uuid"]] = cores.get(d["uuid"], 0) + d["cores"]
    assert all(v <= CAP for v in mem.values()), mem
    assert all(v <= 100 for v in cores.values()), cores


def _race(node, procs, results, count):
    """Runs the processes at once, checking capacity at every moment (not only at
    the end); their `count` outcomes."""
    try:
        for p in procs:
            p.start()
        deadline = time.time() + TIMEOUT
        while any(p.is_alive() for p in procs) and time.time() < deadline:
            _check_capacity(node.state_dir)
            time.sleep(0.02)
        return [results.get(timeout=TIMEOUT) for _ in range(count)]
    finally:
        for p in procs:
            p.join(TIMEOUT)
            if p.is_alive():
                p.kill()


def test_racing_updates_creates_and_exits_never_overcommit(node, uuids):
    ctx = multiprocessing.get_context("fork")
    results = ctx.Queue()
    ids = [f"r{n}" for n in range(12)]
    procs = [ctx.Process(target=_creator, args=(
        node.env, str(node.runc_root),
        str(node.bundle(cid, {"hami.io/gpumem": "2000", "hami.io/gpu-uuid": uuids[n % 2]})),
        cid, 0.3 + 0.1 * n, results)) for n, cid in enumerate(ids)]
    procs += [ctx.Process(target=_updater, args=(node.env, ids, 25, n, results))
              for n in range(4)]
    outcomes = _race(node, procs, results, len(ids) + 4 * 25)
    assert outcomes.count("update ok") > 0 and outcomes.count("create ok") > 0
    _check_capacity(node.state_dir)
    # Every creator is gone: the next transaction frees all, leaving no dir behind.
    assert node.ps() == []
    node.reconcile()
    assert os.listdir(node.state_dir / "containers") == []


def test_racing_updates_of_live_containers_keep_regions_matching(node, uuids):
    """Containers that stay: updates race among themselves; every region ends as its record."""
    names = [seed(node, f"k{n}", [(n % 2, uuids[n % 2], 1000, 10)]) for n in range(6)]
    ctx = multiprocessing.get_context("fork")
    results = ctx.Queue()
    procs = [ctx.Process(target=_updater, args=(node.env, [f"k{n}" for n in range(6)],
                                                20, 100 + n, results)) for n in range(4)]
    outcomes = _race(node, procs, results, 4 * 20)
    assert outcomes.count("update ok") > 0 and outcomes.count("update refused") > 0
    _check_capacity(node.state_dir)
    for name in names:
        matches(node, name)


def test_invalid_entry_is_named(node, uuids):
    name = seed(node, "bad", [(0, uuids[0], 1000, 0)])
    with store.transaction(str(node.state_dir)) as state:
        entry = state.allocations.pop(name)
        state.invalid[name] = {"entry": entry, "reason": "devices[0].cores=-1 is not a whole number"}
    proc = update(node, "bad", "--gpumem", "2000")
    assert proc.returncode == 1 and proc.stderr.count("\n") == 1
    assert f"its allocation entry '{name}' is invalid" in proc.stderr
    assert "run hamictl doctor" in proc.stderr


def test_priority_moves_the_containers_stamps_on_and_off_the_board(node, uuids):
    """libvgpu follows the host's board, not the region: --priority 0 links the
    container's stamp there, --priority 1 takes it away again."""
    from hami_runtime.lifecycle.node_state import boards
    name = seed(node, "p", [(0, uuids[0], 2000, 30)])
    boards.make_stamps(str(node.state_dir), name, [uuids[0]])
    stamp = node.state_dir / "containers" / name / boards.STAMP_DIR / uuids[0]
    entry = node.state_dir / boards.PRIORITY / uuids[0] / name

    assert update(node, "p", "--priority", "0").returncode == 0
    assert os.path.samestat(os.stat(entry), os.stat(stamp))
    assert matches(node, name)["priority"] == 0

    assert update(node, "p", "--priority", "1").returncode == 0
    assert not entry.exists()
    assert matches(node, name)["priority"] == 1
