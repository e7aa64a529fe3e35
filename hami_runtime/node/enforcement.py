"""What the node agent does about each GPU container, decided from plain data.

The agent (tools/agent.py) reads, at every tick, each GPU container's slice per
GPU and the host pids in its cgroup, and the driver's per-process device memory
and SM use (NVML); `decide` turns them into actions. Nothing here reads a file,
the clock or the driver: a test gives it tables and reads the actions back.

- Memory: a container holds the sum of what the driver shows its processes
  holding on a GPU. Past its slice for longer than the grace, the policy acts:
  `kill` chooses the processes that hold memory on the GPUs it is over on,
  newest first (its init, the container's first process, last), until what is
  left fits; `log` reports the episode once; `off` only reports the figures.
  A process killed is counted out at once (its memory may take a moment to go)
  and never chosen again while it lives, so no tick kills twice for one excess.
- SM: a container's use is the sum of its processes' utilisation over the
  driver's window. Above its share by more than the tolerance for longer than
  the SM grace: `freeze` stops the container for the time it took beyond its
  share (window x excess / share, at most max_freeze), then thaws it; `log`
  reports the episode once; `off` only reports. The share is held as the
  container's core policy says (as libvgpu holds it): `force` always,
  `default` only while another process used the GPU in the window (alone on
  it, a container may take what is idle), `disable` never.

A container's Record is what the agent keeps of it between ticks (and in its
state file, so that a restarted agent resumes: the grace already run, the
processes killed and still dying, the counters, a freeze to undo).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import AbstractSet, Dict, List, Mapping, Optional, Sequence, Tuple

MEMORY_POLICIES = ("kill", "log", "off")
SM_POLICIES = ("freeze", "log", "off")
ACTIONS = ("kill", "log", "freeze")  # what the counters count
SECOND_NS = 1_000_000_000


@dataclass(frozen=True)
class Slice:
    """A container's share of one GPU."""
    uuid: str
    memory_bytes: int
    sm_pct: int = 0  # 0 or 100 and above: no SM share

    @property
    def sm_limited(self) -> bool:
        return 0 < self.sm_pct < 100


@dataclass
class Container:
    name: str  # the allocation's name, <id>@<root key>
    slices: Tuple[Slice, ...]
    pids: AbstractSet[int]  # host pids in its cgroup
    init_pid: int = 0  # its first process (0: not known)
    starts: Mapping[int, int] = field(default_factory=dict)  # pid -> start time (ticks since boot)
    core_policy: str = "force"  # default, force, disable: when its SM share is held


@dataclass(frozen=True)
class Driver:
    """What the driver showed at this tick, per GPU it answered for (a GPU
    missing from a table was not read: nothing is decided on it)."""
    memory: Mapping[str, Mapping[int, int]] = field(default_factory=dict)  # uuid -> pid -> bytes
    sm: Mapping[str, Mapping[int, float]] = field(default_factory=dict)  # uuid -> pid -> % over the window


@dataclass(frozen=True)
class Policy:
    memory: str = "kill"
    memory_grace_ns: int = SECOND_NS
    sm: str = "log"
    sm_grace_ns: int = 5 * SECOND_NS
    sm_tolerance_pct: float = 10.0
    sm_window_ns: int = SECOND_NS
    max_freeze_ns: int = 5 * SECOND_NS


@dataclass(frozen=True)
class Over:
    """A container past its slice of memory on one GPU."""
    uuid: str
    held_bytes: int
    limit_bytes: int
    holders: Tuple[Tuple[int, int], ...]  # (pid, bytes) as the driver showed them, most first
    over_ns: int  # how long it has been over


@dataclass(frozen=True)
class SmOver:
    """A container above its SM share on one GPU."""
    uuid: str
    use_pct: float
    share_pct: int
    users: Tuple[Tuple[int, float], ...]  # (pid, %) as the driver showed them, most first
    over_ns: int


@dataclass(frozen=True)
class Kill:
    name: str
    overs: Tuple[Over, ...]
    victims: Tuple[Tuple[int, int], ...]  # (pid, start), in the order to kill them
    init_killed: bool = False  # the container's first process is among them


@dataclass(frozen=True)
class Report:
    """An episode reported, nothing done (policy log)."""
    name: str
    overs: Tuple = ()  # Over or SmOver


@dataclass(frozen=True)
class Freeze:
    name: str
    duration_ns: int
    overs: Tuple[SmOver, ...]


@dataclass(frozen=True)
class Thaw:
    name: str


@dataclass
class Record:
    """What the agent keeps of a container between ticks."""
    over_since: Dict[str, int] = field(default_factory=dict)  # uuid -> ns: memory over since
    reported: List[str] = field(default_factory=list)  # uuids whose memory episode was reported
    sm_over_since: Dict[str, int] = field(default_factory=dict)
    sm_reported: List[str] = field(default_factory=list)
    dying: Dict[int, int] = field(default_factory=dict)  # pid -> start: killed, not yet gone
    frozen_until: int = 0  # ns; 0: not frozen by the agent
    killed: int = 0  # processes killed, all told
    actions: Dict[str, int] = field(default_factory=dict)  # action -> times taken
    last_action: str = ""
    # the figures of the last tick, per uuid
    held: Dict[str, int] = field(default_factory=dict)
    excess: Dict[str, int] = field(default_factory=dict)
    sm_use: Dict[str, float] = field(default_factory=dict)
    sm_excess: Dict[str, float] = field(default_factory=dict)

    def copy(self) -> "Record":
        return Record(dict(self.over_since), list(self.reported), dict(self.sm_over_since),
                      list(self.sm_reported), dict(self.dying), self.frozen_until, self.killed,
                      dict(self.actions), self.last_action, dict(self.held), dict(self.excess),
                      dict(self.sm_use), dict(self.sm_excess))

    def count(self, action: str, times: int = 1) -> None:
        self.actions[action] = self.actions.get(action, 0) + times


def choose_victims(container: Container, overs: Sequence[Over], memory: Mapping[str, Mapping[int, int]],
                   live: AbstractSet[int]) -> List[int]:
    """The processes to kill so that the container fits on every GPU it is over
    on: those holding memory there, newest first, its init last."""
    left = {o.uuid: o.held_bytes - o.limit_bytes for o in overs}
    holders = {pid for o in overs for pid, used in o.holders if used > 0 and pid in live}
    order = sorted(holders, key=lambda pid: (pid == container.init_pid,
                                             -container.starts.get(pid, 0), -pid))
    chosen = []
    for pid in order:
        if all(excess <= 0 for excess in left.values()):
            break
        if not any(excess > 0 and memory[uuid].get(pid, 0) > 0 for uuid, excess in left.items()):
            continue
        chosen.append(pid)
        for uuid in left:
            left[uuid] -= memory[uuid].get(pid, 0)
    return chosen


def _past_grace(over_since: Dict[str, int], reported: List[str], uuid: str, over: bool, now: int,
                grace_ns: int) -> Optional[int]:
    """How long (ns) `uuid` has been over, once that is past the grace; else None.
    Back within bounds, when the episode began and that it was reported are forgotten."""
    if not over:
        over_since.pop(uuid, None)
        if uuid in reported:
            reported.remove(uuid)
        return None
    lasted = now - over_since.setdefault(uuid, now)
    return lasted if lasted >= grace_ns else None


def _report_once(name: str, rec: Record, reported: List[str], overs: Sequence, what: str) -> List:
    """Policy `log`: one Report per episode, for the GPUs not reported yet."""
    new = [o for o in overs if o.uuid not in reported]
    if not new:
        return []
    reported.extend(o.uuid for o in new)
    rec.count("log")
    rec.last_action = f"log: {what}"
    return [Report(name, tuple(new))]


def _memory(container: Container, rec: Record, driver: Driver, policy: Policy, now: int,
            live: AbstractSet[int]) -> Tuple[List, List[Over]]:
    overs: List[Over] = []
    for s in container.slices:
        table = driver.memory.get(s.uuid)
        if table is None:
            continue  # not read now: what was known stays
        held = sum(table.get(pid, 0) for pid in live)
        rec.held[s.uuid], rec.excess[s.uuid] = held, max(0, held - s.memory_bytes)
        lasted = _past_grace(rec.over_since, rec.reported, s.uuid, held > s.memory_bytes, now,
                             policy.memory_grace_ns)
        if lasted is not None:
            holders = sorted(((pid, table[pid]) for pid in live if table.get(pid)), key=lambda h: (-h[1], h[0]))
            overs.append(Over(s.uuid, held, s.memory_bytes, tuple(holders), lasted))
    if not overs or policy.memory == "off":
        return [], overs
    if policy.memory == "log":
        return _report_once(container.name, rec, rec.reported, overs, "over its memory slice"), overs
    victims = choose_victims(container, overs, driver.memory, live)
    actions: List = []
    if victims:
        if rec.frozen_until:  # a frozen process dies only once thawed (cgroup v1's freezer)
            actions.append(Thaw(container.name))
            rec.frozen_until = 0
        pairs = tuple((pid, container.starts.get(pid, 0)) for pid in victims)
        actions.append(Kill(container.name, tuple(overs), pairs, container.init_pid in victims))
        rec.dying.update(pairs)
        rec.killed += len(victims)
        rec.count("kill", len(victims))
        rec.last_action = f"kill: {len(victims)} process(es)"
        for o in overs:
            rec.held[o.uuid] -= sum(driver.memory[o.uuid].get(pid, 0) for pid in victims)
            rec.excess[o.uuid] = max(0, rec.held[o.uuid] - o.limit_bytes)
            rec.over_since.pop(o.uuid, None)
    return actions, overs


def _sm(container: Container, rec: Record, driver: Driver, policy: Policy, now: int) -> List:
    if rec.frozen_until:
        if now < rec.frozen_until:
            return []
        rec.frozen_until = 0
        rec.sm_over_since.clear()  # the window read next still holds the time frozen
        return [Thaw(container.name)]
    overs: List[SmOver] = []
    for s in container.slices:
        table = driver.sm.get(s.uuid)
        if not s.sm_limited or table is None:
            continue
        users = sorted(((pid, table[pid]) for pid in container.pids if table.get(pid)),
                       key=lambda u: (-u[1], u[0]))
        use = round(sum(pct for _, pct in users), 1)
        held = container.core_policy == "force" or container.core_policy == "default" and any(
            pct > 0 for pid, pct in table.items() if pid not in container.pids)
        excess = round(use - s.sm_pct, 1) if held else 0.0
        rec.sm_use[s.uuid], rec.sm_excess[s.uuid] = use, max(0.0, excess)
        lasted = _past_grace(rec.sm_over_since, rec.sm_reported, s.uuid, excess > policy.sm_tolerance_pct,
                             now, policy.sm_grace_ns)
        if lasted is not None:
            overs.append(SmOver(s.uuid, use, s.sm_pct, tuple(users), lasted))
    if not overs or policy.sm == "off":
        return []
    if policy.sm == "log":
        return _report_once(container.name, rec, rec.sm_reported, overs, "above its SM share")
    duration = min(policy.max_freeze_ns, max(
        int(policy.sm_window_ns * (o.use_pct - o.share_pct) / o.share_pct) for o in overs))
    rec.frozen_until = now + duration
    rec.count("freeze")
    rec.last_action = f"freeze: {duration / SECOND_NS:.1f} s"
    return [Freeze(container.name, duration, tuple(overs))]


def decide(now: int, containers: Sequence[Container], driver: Driver, policy: Policy,
           records: Mapping[str, Record]) -> Tuple[List, Dict[str, Record]]:
    """(actions in the order to take them, the records after this tick). The
    records are the agent's, carried from tick to tick: each one given is
    brought up to date and handed back (Record.copy keeps one as it was). A
    container no longer listed has no record after it: it is gone, and what it
    was frozen with is gone too."""
    actions: List = []
    after: Dict[str, Record] = {}
    for container in containers:
        rec = records.get(container.name) or Record()
        if rec.dying:
            rec.dying = {pid: start for pid, start in rec.dying.items()
                         if pid in container.pids and container.starts.get(pid, start) == start}
        live = container.pids - rec.dying.keys() if rec.dying else container.pids
        taken, _ = _memory(container, rec, driver, policy, now, live)
        actions.extend(taken)
        if not any(isinstance(a, Kill) and a.init_killed for a in taken):
            actions.extend(_sm(container, rec, driver, policy, now))
        after[container.name] = rec
    return actions, after


def flags(rec: Optional[Record], uuid: str = "") -> List[str]:
    """What the tools mark a container (or its device `uuid`) with: over its
    slice, above its SM share, frozen, killed N."""
    if rec is None:
        return []
    uuids = [uuid] if uuid else sorted(set(rec.excess) | set(rec.sm_excess))
    marks = []
    if any(rec.excess.get(u, 0) > 0 for u in uuids):
        marks.append("over slice")
    if any(u in rec.sm_over_since or u in rec.sm_reported for u in uuids):
        marks.append("over SM share")
    if rec.frozen_until:
        marks.append("frozen")
    if rec.killed:
        marks.append(f"killed {rec.killed}")
    return marks
