"""What the allocator remembers of each Kubernetes pod's containers: the part of
pod_requests.py's rules that one spec cannot tell (which container holds the
pod's slice, the order the kubelet created them in, what a restarted container
had). A section of the allocator state file (store.py):

  "pods": {"<sandbox id>@<root key>": {
      "sandbox": "<sandbox id>", "runc_root": "<runc root>",
      "complete": true,              # false: rebuilt from allocations (state file lost)
      "containers": {"<name>": {     # the container's name in the pod
          "position": 0,             # the order the pod's containers were first created in
          "id": "<container id>",    # its latest container (a restart has a new id)
          "creator": {"pid": 0, "start": null},   # the create that made it
          "slice": "named",          # named, pod (it holds the pod's one slice),
                                     # entry (HAMi's), none (it got no GPU)
          "uuids": ["GPU-..."]}}}}   # the GPUs it was granted (a restart asks for them again)

It is changed only inside an allocator transaction, in the same atomic write as
the allocation it goes with, and read as untrusted input like the rest of the
state (every field checked; a record that fails is dropped and the pod counts as
rebuilt). A pod's record lives while its sandbox's container or one of the
containers it lists exists under its runc root, or a create of one runs; the
first transaction after that drops it, so a deleted pod leaves nothing behind.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, NamedTuple

from ...errors import HamiError
from ...files import process_alive
from ...names import dns_label, gpu_uuid
from . import state_layout

if TYPE_CHECKING:
    from ..request.pod_identity import PodMember
    from ..request.pod_requests import Plan
    from ..request.requests import GpuRequest

MAX_CONTAINERS = 256
SLICES = ("named", "pod", "entry", "none")
RECORD_FIELDS = {"position", "id", "creator", "slice", "uuids"}
LEDGER_FIELDS = {"sandbox", "runc_root", "complete", "containers"}
ENTRY_FIELDS = {"sandbox", "container", "position", "slice"}  # an allocation's "pod"


def pod_key(runc_root: str, sandbox: str) -> str:
    """The pod's key: named as an allocation is, by its sandbox's id under the runc root."""
    return state_layout.alloc_name(runc_root, sandbox)


def _position_ok(value) -> bool:
    return state_layout.is_int(value, 0, MAX_CONTAINERS * 4)


def record_problem(runc_root: str, name, record) -> str:
    if not isinstance(name, str) or not dns_label(name):
        return f"container name {name!r} is not a Kubernetes container name"
    if not isinstance(record, dict) or set(record) != RECORD_FIELDS:
        return f"{name}: must have exactly {', '.join(sorted(RECORD_FIELDS))}"
    if not _position_ok(record["position"]):
        return f"{name}: position={record['position']!r} is not a whole number"
    try:
        state_layout.alloc_name(runc_root, record["id"])
    except HamiError as exc:
        return f"{name}: {exc.line()}"
    why = state_layout.creator_problem(record["creator"])
    if why:
        return f"{name}: {why}"
    if record["slice"] not in SLICES:
        return f"{name}: slice={record['slice']!r} is not one of {', '.join(SLICES)}"
    uuids = record["uuids"]
    if not isinstance(uuids, list) or len(uuids) > state_layout.MAX_DEVICES or len(set(map(str, uuids))) != len(
            uuids) or not all(isinstance(u, str) and gpu_uuid(u) for u in uuids):
        return f"{name}: uuids={uuids!r} is not a list of distinct GPU UUIDs"
    return ""


def problem(key, ledger) -> str:
    """'' for a well-formed pod record stored under `key`, else what is wrong."""
    if not isinstance(ledger, dict) or set(ledger) != LEDGER_FIELDS:
        return f"must be an object with exactly {', '.join(sorted(LEDGER_FIELDS))}"
    root = ledger["runc_root"]
    why = state_layout.stored_name_problem(key, root, ledger["sandbox"], "sandbox")
    if why:
        return why
    if not isinstance(ledger["complete"], bool):
        return f"complete={ledger['complete']!r} is not true or false"
    containers = ledger["containers"]
    if not isinstance(containers, dict) or len(containers) > MAX_CONTAINERS:
        return f"containers must be an object of at most {MAX_CONTAINERS}"
    for name, record in containers.items():
        why = record_problem(root, name, record)
        if why:
            return why
    positions = [r["position"] for r in containers.values()]
    if len(set(positions)) != len(positions):
        return "two containers have the same position"
    return ""


def parse(section) -> tuple[dict[str, dict], dict[str, str]]:
    """(the well-formed pod records, key -> what is wrong with each other one)."""
    if section is None:
        return {}, {}
    if not isinstance(section, dict):
        return {}, {"pods": "not an object"}
    good: dict[str, dict] = {}
    bad: dict[str, str] = {}
    for key, ledger in section.items():
        why = problem(key, ledger)
        if why:
            bad[str(key)] = why
        else:
            good[key] = ledger
    return good, bad


def entry_problem(entry: dict) -> str:
    """'' when an allocation's "pod" (absent outside pods) is well formed."""
    info = entry.get("pod")
    if info is None:
        return ""
    if not isinstance(info, dict) or set(info) != ENTRY_FIELDS:
        return f"pod must have exactly {', '.join(sorted(ENTRY_FIELDS))}"
    try:
        pod_key(entry["runc_root"], info["sandbox"])
    except HamiError as exc:
        return f"pod: {exc.line()}"
    if not isinstance(info["container"], str) or not dns_label(info["container"]):
        return f"pod.container={info['container']!r} is not a Kubernetes container name"
    if not _position_ok(info["position"]):
        return f"pod.position={info['position']!r} is not a whole number"
    if info["slice"] not in SLICES[:-1]:
        return f"pod.slice={info['slice']!r} is not one of {', '.join(SLICES[:-1])}"
    return ""


def alive(ledger: dict) -> bool:
    """The pod still has something under its runc root: its sandbox's container,
    a container it lists, or a create of one that runs."""
    root = ledger["runc_root"]
    if state_layout.runc_made(root, ledger["sandbox"]):
        return True
    return any(process_alive(r["creator"].get("pid", 0), r["creator"].get("start"))
               or state_layout.runc_made(root, r["id"]) for r in ledger["containers"].values())


def rebuild(pods: dict[str, dict], allocations: dict[str, dict]) -> None:
    """A pod that allocations name and that has no record (the state file was lost
    or its record was not one) gets one from them, marked incomplete: the
    containers that got no GPU, and so the order, are not known."""
    found: dict[str, dict] = {}
    for entry in sorted(allocations.values(), key=lambda e: e.get("created_at", 0)):
        info = entry.get("pod")
        if not isinstance(info, dict):
            continue
        key = pod_key(entry["runc_root"], info["sandbox"])
        if key in pods:
            continue
        ledger = found.setdefault(key, {"sandbox": info["sandbox"], "runc_root": entry["runc_root"],
                                        "complete": False, "containers": {}})
        containers = ledger["containers"]
        if any(r["position"] == info["position"] for n, r in containers.items()
               if n != info["container"]) or len(containers) >= MAX_CONTAINERS:
            continue
        creator = entry.get("creator") if isinstance(entry.get("creator"), dict) else {}
        containers[info["container"]] = {
            "position": info["position"], "id": entry["id"],
            "creator": {"pid": creator.get("pid", 0), "start": creator.get("start")},
            "slice": info["slice"], "uuids": [d["uuid"] for d in entry["devices"]]}
    pods.update(found)


class Placement(NamedTuple):
    """request: what to allocate (None: the container runs untouched, why says
    so); release: container ids of the pod whose allocations go first; ledger:
    the pod's new record (its uuids set once granted); pinned: the GPUs to ask
    for first (a restart's); position, slice: for the allocation's "pod";
    refusal: the HamiError to refuse the create with once the record is kept
    (its place in the pod's order must hold for the next one)."""
    request: GpuRequest | None
    why: str
    release: tuple[str, ...]
    ledger: dict
    pinned: tuple[str, ...]
    position: int
    slice: str
    refusal: HamiError | None


def _decision_line(plan) -> str:
    key, value = plan.decision
    return f"{key}={value}"


def place(ledger: dict | None, member: PodMember, runc_root: str, cid: str, creator: dict,
          plan: Plan, running: Callable[[dict], bool]) -> Placement:
    """Where container `cid` (member.name of the pod) stands in its pod. Pure:
    `running(record)` says whether a record's container holds an allocation and
    runs (or its create does); the ledger given is not changed."""
    from ..request import pod_requests
    name = member.name
    if ledger is None:
        ledger = {"sandbox": member.sandbox, "runc_root": runc_root, "complete": True, "containers": {}}
    containers = {n: dict(r) for n, r in ledger["containers"].items()}
    record = containers.get(name)
    release = []
    if record is None and len(containers) >= MAX_CONTAINERS:
        raise HamiError("container name", name, f"{member.describe()}: the pod already has "
                        f"{MAX_CONTAINERS} containers")
    if record is not None and record["id"] != cid:
        if running(record):  # the kubelet restarts a container once it has stopped
            raise HamiError("container name", name, f"{member.describe()} still runs as container "
                            f"{record['id']}: it must stop before another of that name starts")
        release.append(record["id"])  # a restart: the old container's slice goes
    position = record["position"] if record is not None else \
        max((r["position"] for r in containers.values()), default=-1) + 1
    request, why, slice_, refusal = plan.request, plan.why, "named", None
    if plan.kind == pod_requests.POD:
        holders = [(n, r) for n, r in sorted(containers.items()) if n != name and r["slice"] == "pod"]
        live = [n for n, r in holders if running(r)]
        if live:
            request, slice_ = None, "none"
            why = (f"no GPU: the pod's request ({request_line(plan)}) is held by container {live[0]}, "
                   "which runs (a pod with several containers names the ones that get a GPU in "
                   "hami.io/containers)")
        else:
            for n, r in holders:  # finished (an init container) or gone: its slice passes on
                release.append(r["id"])
                containers[n]["slice"] = "none"
            slice_ = "pod"
            if holders:
                why += f", passed on from container {holders[0][0]}, which no longer runs"
    elif plan.kind == pod_requests.ORDER:
        if record is None and not ledger["complete"]:
            raise HamiError(*plan.decision, f"{member.describe()}: the order the pod's containers "
                            "were created in was lost with the allocator state, so which entry is "
                            "this container's cannot be told; list the GPU containers in "
                            "hami.io/containers")
        count = len(plan.entries)
        if position >= count:
            request, slice_ = None, "none"
            why = (f"no GPU: it is container {position + 1} of the pod by creation order, and "
                   f"{plan.decision[0]} has {count} entries")
        elif not plan.entries[position]:
            request, slice_ = None, "none"
            why = f"no GPU: HAMi's entry {position + 1} of {count} (by creation order) has no device"
        else:
            slice_ = "entry"
            why = f"HAMi's entry {position + 1} of {count}, by the order the pod's containers were created"
            try:
                request = plan.entry_request(position)
            except HamiError as exc:
                request, refusal = None, exc
    pinned = ()
    if request is not None and not request.assigned and record is not None and record["uuids"]:
        pinned = tuple(record["uuids"])
    containers[name] = {"position": position, "id": cid, "creator": dict(creator),
                        "slice": slice_ if request is not None else "none", "uuids": []}
    new = dict(ledger, containers=containers)
    return Placement(request, why, tuple(release), new, pinned, position, slice_, refusal)


def request_line(plan) -> str:
    return plan.request.describe() if plan.request is not None else _decision_line(plan)
