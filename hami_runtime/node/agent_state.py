"""The node agent's state file, <state_dir>/agent/state.json: what it keeps of
each GPU container (enforcement.Record: the figures of its last tick, the
grace run so far, processes killed and still dying, a freeze to undo, counters)
and the node's totals, written atomically by the agent and read by `hamictl
ps`, `top`, `metrics` and `doctor`. Beside it, `lock` (the agent holds an
flock on it while it runs: one agent per state dir).

The state dir is host-only; the file is read as any state file (a regular
file of root's, never through a link, bounded), and a field that does not fit
is dropped, never trusted into an action: the agent reads back only what it
wrote itself, and only on the boot it wrote it (monotonic times mean nothing
after a reboot).
"""
from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field, fields
from typing import Dict, Optional

from ..errors import HamiError
from ..files import atomic_write, process_start, read_state_file
from .enforcement import ACTIONS, Record

DIR = "agent"
STATE_FILE = "state.json"
LOCK_FILE = "lock"
VERSION = 1
MAX_BYTES = 8 << 20
FRESH_S = 5.0  # a state older than this (or whose agent is gone) shows no current figures


def agent_dir(state_dir: str) -> str:
    return os.path.join(state_dir, DIR)


def state_path(state_dir: str) -> str:
    return os.path.join(agent_dir(state_dir), STATE_FILE)


def lock_path(state_dir: str) -> str:
    return os.path.join(agent_dir(state_dir), LOCK_FILE)


@dataclass
class AgentState:
    pid: int = 0
    start: Optional[int] = None  # the agent process's start time
    boot: str = ""
    updated: float = 0.0  # wall clock of the last write
    interval_ms: int = 0
    policy: Dict[str, str] = field(default_factory=dict)  # memory, sm
    driver_error: str = ""  # why the driver was not read at the last tick ("" when it was)
    totals: Dict[str, int] = field(default_factory=dict)  # action -> times, since the state dir was made
    containers: Dict[str, Record] = field(default_factory=dict)  # by allocation name
    wall: Dict[str, float] = field(default_factory=dict)  # name -> wall clock of its last action

    def running(self) -> bool:
        """Its agent still runs (the pid is the process that wrote it)."""
        return self.pid > 0 and self.start is not None and process_start(self.pid) == self.start

    def fresh(self, now: Optional[float] = None) -> bool:
        """Written by a running agent within FRESH_S (or 10 of its intervals)."""
        limit = max(FRESH_S, 10 * self.interval_ms / 1000)
        return self.running() and abs((now or time.time()) - self.updated) < limit


_RECORD_FIELDS = tuple(f.name for f in fields(Record))


def to_bytes(state: AgentState) -> bytes:
    doc = {"version": VERSION, **{f.name: getattr(state, f.name) for f in fields(AgentState)}}
    records = {}
    for name, rec in state.containers.items():
        records[name] = raw = {f: getattr(rec, f) for f in _RECORD_FIELDS}
        raw["dying"] = {str(pid): start for pid, start in rec.dying.items()}
    doc["containers"] = records
    return (json.dumps(doc, sort_keys=True, separators=(",", ":")) + "\n").encode()


def write(state_dir: str, state: AgentState) -> None:
    os.makedirs(agent_dir(state_dir), mode=0o700, exist_ok=True)
    atomic_write(state_path(state_dir), to_bytes(state), 0o600)


def _ints(value, keys=str) -> Dict:
    if not isinstance(value, dict):
        return {}
    out = {}
    for k, v in value.items():
        try:
            key = keys(k)
        except (TypeError, ValueError):
            continue
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            out[key] = v
    return out


def _record(raw) -> Record:
    rec = Record()
    if not isinstance(raw, dict):
        return rec
    for f in fields(Record):
        value = raw.get(f.name)
        if f.name == "dying":
            rec.dying = {pid: int(start) for pid, start in _ints(value, int).items()}
        elif f.name in ("reported", "sm_reported"):
            setattr(rec, f.name, [u for u in value if isinstance(u, str)] if isinstance(value, list) else [])
        elif f.name in ("frozen_until", "killed"):
            setattr(rec, f.name, int(value) if isinstance(value, int) and not isinstance(value, bool) else 0)
        elif f.name == "last_action":
            rec.last_action = value if isinstance(value, str) else ""
        else:
            setattr(rec, f.name, _ints(value))
    rec.actions = {k: int(v) for k, v in rec.actions.items() if k in ACTIONS}
    return rec


def parse(data: bytes) -> Optional[AgentState]:
    try:
        doc = json.loads(data)
    except ValueError:
        return None
    if not isinstance(doc, dict) or doc.get("version") != VERSION:
        return None
    state = AgentState()
    for name in ("pid", "interval_ms"):
        value = doc.get(name)
        setattr(state, name, value if isinstance(value, int) and not isinstance(value, bool) else 0)
    start = doc.get("start")
    state.start = start if isinstance(start, int) and not isinstance(start, bool) else None
    for name in ("boot", "driver_error"):
        value = doc.get(name)
        setattr(state, name, value if isinstance(value, str) else "")
    updated = doc.get("updated")
    state.updated = float(updated) if isinstance(updated, (int, float)) and not isinstance(updated, bool) else 0.0
    policy = doc.get("policy")
    state.policy = {k: v for k, v in policy.items() if isinstance(k, str) and isinstance(v, str)} \
        if isinstance(policy, dict) else {}
    state.totals = {k: int(v) for k, v in _ints(doc.get("totals")).items() if k in ACTIONS}
    state.wall = _ints(doc.get("wall"))
    containers = doc.get("containers")
    if isinstance(containers, dict):
        state.containers = {name: _record(raw) for name, raw in containers.items() if isinstance(name, str)}
    return state


def read(state_dir: str) -> Optional[AgentState]:
    """The agent's state as it last wrote it; None where there is none (no
    agent ever ran on this state dir) or it cannot be read."""
    try:
        data = read_state_file(state_path(state_dir), MAX_BYTES)
    except (OSError, HamiError):
        return None
    return parse(data)


def current(state_dir: str) -> Optional[AgentState]:
    """The state of an agent that runs now and wrote it lately, else None: what
    the tools mark containers with (where no agent runs they show nothing of it)."""
    state = read(state_dir)
    return state if state is not None and state.fresh() else None
