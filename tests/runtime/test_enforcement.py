"""The node agent's decisions (hami_runtime/node/enforcement.py) on plain data:
containers (slices, host pids, start times), what the driver showed, a policy and
the records of the tick before; no process, cgroup or driver. Also the agent's
state file read back (node/agent_state.py) and how a container's cgroup is found
(node/cgroups.py) from tables."""
import os

import pytest

from hami_runtime.node import agent_state, cgroups
from hami_runtime.node.enforcement import (Container, Driver, Freeze, Kill, Policy, Record, Report, Slice,
                                           Thaw, choose_victims, decide, flags)

MiB = 1 << 20
S = 1_000_000_000
GPU0, GPU1 = "GPU-0", "GPU-1"
INIT = 10


def box(pids, slices=((GPU0, 1024, 0),), starts=None, name="c"):
    """A container whose first process is INIT; pid n started at tick n unless said."""
    pids = frozenset(pids)
    return Container(name, tuple(Slice(u, m * MiB, sm) for u, m, sm in slices), pids, INIT,
                     starts if starts is not None else {p: p for p in pids})


def mem(**gpus):
    """Driver memory tables: mem(GPU0={pid: MiB})."""
    return {GPU_NAMES[k]: {pid: mib * MiB for pid, mib in table.items()} for k, table in gpus.items()}


GPU_NAMES = {"g0": GPU0, "g1": GPU1}
KILL = Policy(memory="kill", memory_grace_ns=S)


def victims(actions):
    return [pid for a in actions if isinstance(a, Kill) for pid, _ in a.victims]


# (what, container, driver memory, records before, now, policy, pids killed, excess MiB after on GPU0)
MEMORY_CASES = {
    "within its slice": (box({10, 11}), mem(g0={10: 300, 11: 700}), {}, 5 * S, KILL, [], 0),
    "exactly its slice": (box({10, 11}), mem(g0={10: 324, 11: 700}), {}, 5 * S, KILL, [], 0),
    "over, grace not run": (box({10, 11}), mem(g0={11: 1800}), {}, 5 * S, KILL, [], 776),
    "over past the grace: newest first until it fits":
        (box({10, 11, 12, 13}), mem(g0={10: 100, 11: 900, 12: 900, 13: 900}),
         {"c": Record(over_since={GPU0: 3 * S})}, 5 * S, KILL, [13, 12], 0),
    "a process that holds nothing is never chosen":
        (box({10, 11, 12, 14}), mem(g0={11: 900, 12: 900}),
         {"c": Record(over_since={GPU0: 3 * S})}, 5 * S, KILL, [12], 0),
    "its first process last, only when nothing else is left":
        (box({10, 11}), mem(g0={10: 1500, 11: 100}), {"c": Record(over_since={GPU0: 0})}, 5 * S, KILL,
         [11, 10], 0),
    "the driver's pids outside its cgroup are not its":
        (box({10, 11}), mem(g0={11: 900, 99: 4000}), {"c": Record(over_since={GPU0: 0})}, 5 * S, KILL, [], 0),
    "grace 0: at once": (box({10, 11}), mem(g0={11: 1800}), {}, 5 * S,
                         Policy(memory="kill", memory_grace_ns=0), [11], 0),
    "not read this tick: nothing decided":
        (box({10, 11}), {}, {"c": Record(over_since={GPU0: 0}, excess={GPU0: 776 * MiB})}, 5 * S, KILL, [], 776),
    "policy off: the figures only":
        (box({10, 11}), mem(g0={11: 1800}), {"c": Record(over_since={GPU0: 0})}, 5 * S,
         Policy(memory="off"), [], 776),
    "killed, still dying: counted out, never chosen again":
        (box({10, 11, 12}), mem(g0={11: 900, 12: 900}),
         {"c": Record(dying={12: 12}, killed=1)}, 5 * S, Policy(memory="kill", memory_grace_ns=0), [], 0),
    "a dying pid another process has now counts again":
        (box({10, 11, 12}, starts={10: 10, 11: 11, 12: 40}), mem(g0={11: 900, 12: 900}),
         {"c": Record(dying={12: 12}, killed=1)}, 5 * S, Policy(memory="kill", memory_grace_ns=0), [12], 0),
}


@pytest.mark.parametrize("container,memory,before,now,policy,killed,excess_mib", MEMORY_CASES.values(),
                         ids=MEMORY_CASES.keys())
def test_memory(container, memory, before, now, policy, killed, excess_mib):
    before = {name: rec.copy() for name, rec in before.items()}  # the table's, as it was
    killed_before = before.get("c", Record()).killed
    actions, after = decide(now, [container], Driver(memory=memory), policy, before)
    assert victims(actions) == killed
    rec = after["c"]
    assert rec.excess.get(GPU0, 0) == excess_mib * MiB
    assert rec.killed == killed_before + len(killed)
    assert set(rec.dying) >= set(killed)
    if killed:
        kill = next(a for a in actions if isinstance(a, Kill))
        assert kill.init_killed == (INIT in killed)
        assert dict(kill.victims) == {pid: container.starts[pid] for pid in killed}
        assert rec.actions["kill"] == len(killed) and "kill" in rec.last_action


def test_the_grace_runs_from_the_first_tick_over():
    c = box({10, 11})
    driver = Driver(memory=mem(g0={11: 1800}))
    records = {}
    for now, expected in ((0, []), (S // 2, []), (S - 1, []), (S, [11])):
        actions, records = decide(now, [c], driver, KILL, records)
        assert victims(actions) == expected, now


def test_back_within_resets_the_grace():
    c = box({10, 11})
    _, records = decide(0, [c], Driver(memory=mem(g0={11: 1800})), KILL, {})
    _, records = decide(S // 2, [c], Driver(memory=mem(g0={11: 500})), KILL, records)
    actions, records = decide(S, [c], Driver(memory=mem(g0={11: 1800})), KILL, records)
    assert victims(actions) == [] and records["c"].over_since == {GPU0: S}


def test_log_reports_each_episode_once():
    c = box({10, 11})
    log = Policy(memory="log", memory_grace_ns=0)
    over, within = Driver(memory=mem(g0={11: 1800})), Driver(memory=mem(g0={11: 500}))
    seen = []
    records = {}
    for now, driver in enumerate((over, over, over, within, over)):
        actions, records = decide(now * S, [c], driver, log, records)
        assert not victims(actions)
        seen.append(len([a for a in actions if isinstance(a, Report)]))
    assert seen == [1, 0, 0, 0, 1]
    assert records["c"].actions == {"log": 2} and records["c"].killed == 0


def test_over_on_two_gpus_one_kill_counts_on_both():
    c = box({10, 11, 12}, slices=((GPU0, 1024, 0), (GPU1, 1024, 0)))
    memory = mem(g0={11: 600, 12: 600}, g1={11: 800, 12: 300})
    actions, records = decide(S, [c], Driver(memory=memory), Policy(memory="kill", memory_grace_ns=0), {})
    assert victims(actions) == [12]  # newest; with it gone both fit
    assert records["c"].excess == {GPU0: 0, GPU1: 0}
    kill = actions[0]
    assert {o.uuid for o in kill.overs} == {GPU0, GPU1}


def test_choose_victims_skips_what_does_not_help():
    c = box({10, 11, 12, 13}, slices=((GPU0, 1024, 0), (GPU1, 1024, 0)))
    memory = mem(g0={11: 1000, 13: 100}, g1={12: 50})
    from hami_runtime.node.enforcement import Over
    overs = [Over(GPU0, 1100 * MiB, 1024 * MiB, ((11, 1000 * MiB), (13, 100 * MiB)), S)]
    assert choose_victims(c, overs, memory, c.pids) == [13]


def test_a_container_gone_leaves_no_record():
    _, records = decide(0, [box({10})], Driver(memory=mem(g0={10: 2000})), KILL, {})
    _, records = decide(S, [], Driver(), KILL, records)
    assert records == {}


SM = Policy(memory="off", sm="freeze", sm_grace_ns=2 * S, sm_tolerance_pct=10, sm_window_ns=S,
            max_freeze_ns=5 * S)


# (what, SM share, the driver's use per pid, ticks (s) at which the policy acts, freeze seconds)
SM_CASES = {
    "within its share and the tolerance": (30, {11: 25.0, 12: 14.0}, [], None),
    "over, the grace runs": (30, {11: 60.0}, [2], 1.0),
    "far over: frozen at most max_freeze": (10, {11: 100.0}, [2], 5.0),
    "no SM share: never": (0, {11: 100.0}, [], None),
}


@pytest.mark.parametrize("share,use,acts_at,seconds", SM_CASES.values(), ids=SM_CASES.keys())
def test_sm_freeze(share, use, acts_at, seconds):
    c = box({10, 11, 12}, slices=((GPU0, 1024, share),))
    records, acted = {}, []
    for t in range(4):
        actions, records = decide(t * S, [c], Driver(memory=mem(g0={}), sm={GPU0: use}), SM, records)
        freezes = [a for a in actions if isinstance(a, Freeze)]
        if freezes:
            acted.append(t)
            assert freezes[0].duration_ns == int(seconds * S)
    assert acted == acts_at[:1]
    if share and 0 < share < 100:
        assert records["c"].sm_use[GPU0] == round(sum(use.values()), 1)


@pytest.mark.parametrize("core_policy,neighbour,frozen", [
    ("force", 0.0, True), ("default", 0.0, False), ("default", 20.0, True), ("disable", 20.0, False)])
def test_the_share_is_held_as_its_core_policy_says(core_policy, neighbour, frozen):
    """default: alone on the GPU a container may take what is idle; disable: never held."""
    c = Container("c", (Slice(GPU0, 1024 * MiB, 30),), frozenset({10, 11}), INIT, {}, core_policy)
    use = {11: 90.0, 99: neighbour}
    actions, records = decide(0, [c], Driver(memory=mem(g0={}), sm={GPU0: use}),
                              Policy(memory="off", sm="freeze", sm_grace_ns=0), {})
    assert any(isinstance(a, Freeze) for a in actions) == frozen
    assert records["c"].sm_use[GPU0] == 90.0 and (records["c"].sm_excess[GPU0] > 0) == frozen


def test_frozen_then_thawed_at_its_time_and_the_grace_runs_again():
    c = box({10, 11}, slices=((GPU0, 1024, 30),))
    driver = Driver(memory=mem(g0={}), sm={GPU0: {11: 60.0}})
    policy = Policy(memory="off", sm="freeze", sm_grace_ns=0, sm_window_ns=S)
    actions, records = decide(0, [c], driver, policy, {})
    assert [type(a) for a in actions] == [Freeze] and records["c"].frozen_until == S
    assert flags(records["c"], GPU0) == ["over SM share", "frozen"]
    actions, records = decide(S // 2, [c], driver, policy, records)
    assert actions == []
    actions, records = decide(S, [c], driver, policy, records)
    assert actions == [Thaw("c")] and records["c"].frozen_until == 0
    actions, records = decide(S + 1, [c], driver, policy, records)
    assert [type(a) for a in actions] == [Freeze] and records["c"].actions == {"freeze": 2}


def test_sm_log_once():
    c = box({10, 11}, slices=((GPU0, 1024, 30),))
    policy = Policy(memory="off", sm="log", sm_grace_ns=0)
    driver = Driver(memory=mem(g0={}), sm={GPU0: {11: 90.0}})
    kinds = []
    records = {}
    for t in range(3):
        actions, records = decide(t * S, [c], driver, policy, records)
        kinds.append([type(a).__name__ for a in actions])
    assert kinds == [["Report"], [], []]


def test_a_frozen_container_is_thawed_before_a_kill():
    c = box({10, 11}, slices=((GPU0, 1024, 30),))
    records = {"c": Record(frozen_until=10 * S)}
    actions, records = decide(S, [c], Driver(memory=mem(g0={11: 2000})),
                              Policy(memory="kill", memory_grace_ns=0), records)
    assert [type(a) for a in actions] == [Thaw, Kill] and records["c"].frozen_until == 0


def test_flags():
    assert flags(None) == []
    rec = Record(excess={GPU0: 5, GPU1: 0}, killed=3)
    assert flags(rec, GPU0) == ["over slice", "killed 3"]
    assert flags(rec, GPU1) == ["killed 3"]
    assert flags(rec) == ["over slice", "killed 3"]


def test_state_file_round_trip(tmp_path):
    rec = Record(over_since={GPU0: 7}, reported=[GPU1], dying={123: 456}, frozen_until=9, killed=2,
                 actions={"kill": 2, "log": 1}, last_action="kill: 2 process(es)", held={GPU0: 5 * MiB},
                 excess={GPU0: MiB}, sm_use={GPU0: 12.5}, sm_excess={GPU0: 0.0})
    me = os.getpid()
    from hami_runtime.files import boot_id, process_start
    state = agent_state.AgentState(pid=me, start=process_start(me), boot=boot_id(), updated=1.0,
                                   interval_ms=200, policy={"memory": "kill", "sm": "log"},
                                   totals={"kill": 4}, containers={"c@0123456789abcdef": rec},
                                   wall={"c@0123456789abcdef": 2.0})
    agent_state.write(str(tmp_path), state)
    back = agent_state.read(str(tmp_path))
    assert back == state and back.running() and not back.fresh()  # written at 1.0 s after the epoch
    assert agent_state.current(str(tmp_path)) is None
    assert oct(os.stat(agent_state.state_path(str(tmp_path))).st_mode & 0o777) == "0o600"


@pytest.mark.parametrize("text", [b"", b"{", b'{"version": 9}', b"[]"])
def test_state_file_that_is_not_one(tmp_path, text):
    os.makedirs(agent_state.agent_dir(str(tmp_path)))
    with open(agent_state.state_path(str(tmp_path)), "wb") as handle:
        handle.write(text)
    assert agent_state.read(str(tmp_path)) is None


def test_state_file_fields_that_do_not_fit_are_dropped():
    back = agent_state.parse(b'{"version": 1, "pid": "x", "containers": {"c": {"dying": {"x": 1, "5": "y", "6": 7},'
                             b' "killed": true, "reported": [1, "GPU-0"], "actions": {"kill": 1, "rm": 2}}}}')
    assert back.pid == 0 and back.containers["c"].dying == {6: 7}
    assert back.containers["c"].killed == 0 and back.containers["c"].reported == ["GPU-0"]
    assert back.containers["c"].actions == {"kill": 1}


MOUNTS = {"": "/sys/fs/cgroup/unified", "freezer": "/sys/fs/cgroup/freezer", "pids": "/sys/fs/cgroup/pids"}


def test_mountinfo_hybrid(tmp_path):
    info = tmp_path / "mountinfo"
    info.write_text(
        "31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755\n"
        "37 31 0:34 / /sys/fs/cgroup/freezer rw,relatime - cgroup cgroup rw,freezer\n"
        "38 31 0:35 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,xattr,name=systemd\n"
        "39 31 0:36 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw\n"
        "40 31 0:34 /sub /mnt/elsewhere rw,relatime - cgroup cgroup rw,freezer\n")
    found = cgroups.mounts(str(info))
    assert found[""] == "/sys/fs/cgroup/unified" and found["freezer"] == "/sys/fs/cgroup/freezer"
    assert found["name=systemd"] == "/sys/fs/cgroup/systemd"


def test_proc_cgroup(tmp_path):
    (tmp_path / "7").mkdir()
    (tmp_path / "7" / "cgroup").write_text("6:freezer:/c1\n5:cpu,cpuacct:/c1\n0::/c1\n")
    assert cgroups.of_process(7, str(tmp_path)) == {"freezer": "/c1", "cpu": "/c1", "cpuacct": "/c1", "": "/c1"}
    assert cgroups.of_process(8, str(tmp_path)) == {}


def fake_hierarchies(tmp_path):
    where = {}
    for hierarchy, kind_file in (("", "cgroup.freeze"), ("freezer", "freezer.state"), ("pids", None)):
        top = tmp_path / (hierarchy or "unified")
        (top / "c1").mkdir(parents=True)
        if kind_file:
            (top / "c1" / kind_file).write_text("")
        where[hierarchy] = str(top)
    return where


@pytest.mark.parametrize("paths,own,expected", [
    # hybrid, as runc makes it here: listed from the unified tree, frozen with the v1 freezer
    ({"": "/c1", "freezer": "/c1", "pids": "/c1"}, {"": "/", "freezer": "/"}, ("unified", "v1")),
    # a pid reused by a host process: the root cgroup, never taken
    ({"": "/", "freezer": "/", "pids": "/"}, {"": "/"}, None),
    # one the agent is in too (a cgroup above its own)
    ({"": "/c1", "freezer": "/c1", "pids": "/c1"}, {"": "/c1/agent", "freezer": "/c1/agent", "pids": "/c1/x"},
     None),
])
def test_locate(tmp_path, paths, own, expected):
    where = fake_hierarchies(tmp_path)
    found = cgroups.locate(paths, where, own)
    if expected is None:
        assert found is None
        return
    listing, kind = expected
    assert found.procs_dir == str(tmp_path / listing / "c1") and found.freezer_kind == kind


def test_locate_v2_only(tmp_path):
    where = fake_hierarchies(tmp_path)
    del where["freezer"], where["pids"]
    found = cgroups.locate({"": "/c1"}, where, {"": "/"})
    assert (found.procs_dir, found.freezer_kind) == (str(tmp_path / "unified" / "c1"), "v2")
    assert cgroups.from_spec_path("/c1", where, {"": "/"}).procs_dir == found.procs_dir
    assert cgroups.from_spec_path("system.slice:hami:c1", where, {"": "/"}) is None


def test_processes_of_a_cgroup_and_below(tmp_path):
    (tmp_path / "c1" / "sub").mkdir(parents=True)
    (tmp_path / "c1" / "cgroup.procs").write_text("1\n2\n")
    (tmp_path / "c1" / "sub" / "cgroup.procs").write_text("3\n")
    cg = cgroups.Cgroup(str(tmp_path / "c1"))
    assert cgroups.processes(cg) == {1, 2}
    cg.below = cgroups.subtree(cg.procs_dir)
    assert cgroups.processes(cg) == {1, 2, 3}
