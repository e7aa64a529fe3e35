"""Which request a container of a Kubernetes pod gets. Pure: the spec's
annotations and env, and the container's place in its pod, in; a plan out.

containerd and CRI-O copy a pod's annotations into every container's spec, so a
request written on the pod reaches each of its containers (the app, its sidecars,
its init containers). The pod says which of them get a GPU:

  hami.io/containers: "a,b"          the listed containers get the pod's request
                                     (the hami.io/ keys); every other one runs
                                     untouched
  <name>.hami.io/<key>               a key for container <name> alone (over the
                                     pod's key of the same name): names it too
  (neither)                          the pod's request is one slice for the pod,
                                     held by one container at a time (the first
                                     created; pod_ledger.py)

HAMi's scheduler decision (hami.io/vgpu-devices-allocated, one entry per
container it counts, in the pod's order, init containers first, empty for a
container without a GPU) is paired with containers as its own device plugin
pairs them: the i-th container listed in hami.io/containers gets the i-th entry
that has a device; without a list, each container gets the entry at the place
the kubelet created it in the pod (pod_ledger.py keeps that order).

A spec outside a pod is as it always was (requests.parse).
"""
from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, NamedTuple

from ...errors import HamiError
from ...names import dns_label
from . import requests
from .request_keys import REQUEST_KEYS, split_key

if TYPE_CHECKING:
    from .pod_identity import PodMember

MAX_LISTED = 64

ALONE = "alone"          # not a pod's, or a pod request that does not concern containers: as always
UNTOUCHED = "untouched"  # this container of the pod gets no GPU (why says so)
NAMED = "named"          # named by the pod: its request (request is None: it asks for none)
POD = "pod"              # the pod's one slice: it gets it unless another container holds it
ORDER = "order"          # HAMi's decision by the order the pod's containers were created


class Naming(NamedTuple):
    """Which containers the pod names: `listed` (hami.io/containers, in its order;
    None when absent) and `own` (container name -> one of its own keys)."""
    listed: tuple | None
    list_key: str | None
    list_value: str | None
    own: dict

    def names(self) -> set:
        return set(self.listed or ()) | set(self.own)

    def describe(self) -> str:
        if self.listed is not None:
            return f"{self.list_key}={self.list_value}"
        return "keys of their own for " + ", ".join(sorted(self.own))


def naming(annotations: dict[str, str], found: dict[str, tuple[str, str]]) -> Naming:
    """The pod's naming, checked: `found` is requests.collect(annotations)."""
    listed = list_key = list_value = None
    if "containers" in found:
        list_key, list_value = found["containers"]
        listed = tuple(item.strip(" ") for item in list_value.split(","))
        if not list_value.strip(" ") or len(listed) > MAX_LISTED:
            raise HamiError(list_key, list_value, f"must list 1 to {MAX_LISTED} container names")
        for name in listed:
            if not dns_label(name):
                raise HamiError(list_key, list_value, f"{name!r} is not a Kubernetes container name "
                                "(a DNS label: a-z, 0-9, '-', at most 63)")
        if len(set(listed)) != len(listed):
            raise HamiError(list_key, list_value, "names a container twice")
    own: dict[str, str] = {}
    for key in sorted(annotations):
        split = split_key(key)
        if split is None or split[0] is None:
            continue
        if not dns_label(split[0]):
            raise HamiError(key, str(annotations[key]), f"{split[0]!r} is not a Kubernetes container "
                            "name (a DNS label: a-z, 0-9, '-', at most 63)")
        own.setdefault(split[0], key)
    if listed is not None:
        for name, key in sorted(own.items()):
            if name not in listed:
                raise HamiError(key, str(annotations[key]), f"names container {name}, which "
                                f"{list_key}={list_value} does not list")
    return Naming(listed, list_key, list_value, own)


class Plan(NamedTuple):
    """What a container gets, as far as its spec alone tells: `kind` (above),
    `request` (a GpuRequest or None), `why` (for the log line), and for ORDER the
    decision's `entries` and `entry_request(k)`, the request for entry k."""
    kind: str
    request: requests.GpuRequest | None = None
    why: str = ""
    entries: Sequence = ()
    decision: tuple[str, str] | None = None  # (key, value) of the scheduler's decision, if any
    annotations: dict | None = None
    core_policy: str = "default"
    container: str | None = None

    def entry_request(self, k: int):
        return requests.from_annotations(self.annotations, self.core_policy, self.container, k)


def plan(annotations: dict[str, str], env: Iterable[str], env_requests: bool, core_policy: str,
         member: PodMember | None) -> Plan:
    annotations = annotations or {}
    found = requests.collect(annotations)
    names = naming(annotations, found)
    if member is None:
        if names.listed is not None or names.own:
            key = names.list_key or sorted(names.own.values())[0]
            raise HamiError(key, str(annotations[key]), "names containers of a Kubernetes pod, and "
                            "this container is in none (its spec has no io.kubernetes.cri.container-name "
                            "or io.kubernetes.container.name)")
        return Plan(ALONE, requests.parse(annotations, env, env_requests, core_policy))
    cdi = requests.cdi_devices(annotations)
    if cdi is not None:
        # A device plugin's CDI annotation is this container's own: it names its GPUs.
        return Plan(NAMED, requests.parse(annotations, env, env_requests, core_policy, member.name),
                    why=f"its GPUs named by {cdi[0]}")
    if not names.names() and not any(k in found for k in REQUEST_KEYS):
        # No request on the pod for its containers: the container's own env, as always.
        return Plan(ALONE, requests.parse(annotations, env, env_requests, core_policy))
    name = member.name
    decision = found.get("vgpu-devices-allocated")
    if decision is not None:
        entries = requests.decision_entries(*decision)
        if names.listed is not None:
            with_gpu = [k for k, devices in enumerate(entries) if devices]
            if len(with_gpu) != len(names.listed):
                raise HamiError(names.list_key, names.list_value,
                                f"lists {len(names.listed)} container(s), and {decision[0]} has "
                                f"{len(with_gpu)} entries with a device: the i-th listed container "
                                "gets the i-th entry with a device")
            if name not in names.listed:
                return Plan(UNTOUCHED, why=f"no GPU: not in {names.describe()}")
            k = with_gpu[names.listed.index(name)]
            return Plan(NAMED, requests.from_annotations(annotations, core_policy, name, k),
                        why=f"HAMi's entry {k + 1} of {len(entries)}: listed "
                            f"{names.listed.index(name) + 1} in {names.list_key}", decision=decision)
        if len(entries) == 1:
            return Plan(POD, requests.from_annotations(annotations, core_policy, name, 0),
                        why="the pod's one HAMi entry", decision=decision)
        return Plan(ORDER, entries=entries, decision=decision, annotations=annotations,
                    core_policy=core_policy, container=name)
    if names.names():
        if name not in names.names():
            return Plan(UNTOUCHED, why=f"no GPU: not named by the pod ({names.describe()})")
        how = f"listed in {names.list_key}" if names.listed is not None else "keys of its own"
        return Plan(NAMED, requests.parse(annotations, env, env_requests, core_policy, name), why=how)
    return Plan(POD, requests.from_annotations(annotations, core_policy, name),
                why="the pod's request, which names no container")
