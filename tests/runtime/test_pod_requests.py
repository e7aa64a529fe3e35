"""The pure parts of pods: which pod container a spec is, which request it gets
(pod_requests.plan), where it stands among the pod's containers (pod_ledger.place),
and the pod records' checks. Literal annotations and records in, results out."""
import copy

import pytest

from hami_runtime.errors import HamiError
from hami_runtime.lifecycle.node_state import pod_ledger, state_layout, store
from hami_runtime.lifecycle.request import pod_requests
from hami_runtime.lifecycle.request.pod_identity import PodMember, member
from hami_runtime.lifecycle.request.request_keys import mentions_request

SANDBOX = "ab" * 32
ROOT = "/run/containerd/runc/k8s.io"
UUID_A = "GPU-aaaaaaaa-0000-0000-0000-000000000000"
UUID_B = "GPU-bbbbbbbb-0000-0000-0000-000000000000"
CONTAINERD = {"io.kubernetes.cri.container-type": "container", "io.kubernetes.cri.sandbox-id": SANDBOX,
              "io.kubernetes.cri.container-name": "app", "io.kubernetes.cri.sandbox-namespace": "ml",
              "io.kubernetes.cri.sandbox-name": "trainer-0"}
CRIO = {"io.kubernetes.cri-o.ContainerType": "container", "io.kubernetes.cri-o.SandboxID": SANDBOX,
        "io.kubernetes.container.name": "app", "io.kubernetes.pod.namespace": "ml",
        "io.kubernetes.pod.name": "trainer-0", "io.kubernetes.cri-o.ContainerName": "k8s_app_trainer-0"}


@pytest.mark.parametrize("annotations,expected", [
    (CONTAINERD, PodMember(SANDBOX, "app", "ml/trainer-0")),
    (CRIO, PodMember(SANDBOX, "app", "ml/trainer-0")),
    ({**CONTAINERD, "io.kubernetes.cri.sandbox-name": "bad\nname"}, PodMember(SANDBOX, "app", "")),
    ({**CONTAINERD, "io.kubernetes.cri.container-type": "sandbox"}, None),
    ({k: v for k, v in CONTAINERD.items() if k != "io.kubernetes.cri.container-name"}, None),
    ({"io.container.manager": "libpod", "hami.io/gpumem": "1"}, None),     # podman
    ({"nerdctl/name": "x"}, None),
    ({}, None),
])
def test_which_pod_container_a_spec_is(annotations, expected):
    assert member(annotations) == expected


@pytest.mark.parametrize("annotations,field", [
    ({**CONTAINERD, "io.kubernetes.cri.container-name": "App_1"}, "io.kubernetes.cri.container-name"),
    ({**CONTAINERD, "io.kubernetes.cri.container-name": "a" * 64}, "io.kubernetes.cri.container-name"),
    ({**CONTAINERD, "io.kubernetes.cri.sandbox-id": "../etc"}, "io.kubernetes.cri.sandbox-id"),
    ({**CRIO, "io.kubernetes.container.name": "-x"}, "io.kubernetes.container.name"),
    ({**CRIO, "io.kubernetes.cri-o.SandboxID": "a" * 129}, "io.kubernetes.cri-o.SandboxID"),
    # a pod annotation posing as the other engine's keys (CRI-O copies every pod annotation)
    ({**CRIO, "io.kubernetes.cri.container-type": "container", "io.kubernetes.cri.sandbox-id": "cd" * 32,
      "io.kubernetes.cri.container-name": "victim"}, "io.kubernetes.cri.container-type"),
])
def test_a_cri_container_with_a_bad_name_or_sandbox_is_refused(annotations, field):
    with pytest.raises(HamiError) as caught:
        member(annotations)
    assert caught.value.field == field


def decision(*entries):
    """HAMi's encoding: each container's devices, each ended by ';'."""
    return "".join("".join(f"{u},NVIDIA,{m},{c}:" for u, m, c in devices) + ";" for devices in entries)


TWO_AND_EMPTY = decision([(UUID_A, 1024, 30)], [], [(UUID_B, 2048, 0)])


@pytest.mark.parametrize("annotations,name,kind,expected", [
    # not a pod's container: as always
    ({"hami.io/gpumem": "1024"}, None, "alone", dict(mem_mib=1024)),
    ({}, None, "alone", None),
    # a pod with no request for its containers: the container's own env, as always
    ({"hami.io/priority": "0"}, "app", "alone", None),
    # the pod's request, naming no container: one slice for the pod
    ({"hami.io/gpumem": "1024"}, "app", "pod", dict(mem_mib=1024)),
    ({"nvidia.com/gpumem": "1024"}, "sidecar", "pod", dict(mem_mib=1024)),
    # listed containers get it, the others none
    ({"hami.io/gpumem": "1024", "hami.io/containers": "app, worker"}, "worker", "named", dict(mem_mib=1024)),
    ({"hami.io/gpumem": "1024", "hami.io/containers": "app"}, "istio-proxy", "untouched",
     "not named by the pod (hami.io/containers=app)"),
    ({"hami.io/gpumem": "1024", "nvidia.com/containers": "app"}, "app", "named", dict(mem_mib=1024)),
    # a listed container with nothing that asks: untouched, as a spec that asks for nothing
    ({"hami.io/containers": "app"}, "app", "named", None),
    # keys of its own name a container, over the pod's
    ({"hami.io/gpucores": "30", "app.hami.io/gpumem": "2048"}, "app", "named", dict(mem_mib=2048, cores=30)),
    ({"hami.io/gpumem": "1", "app.hami.io/gpumem": "2048"}, "app", "named", dict(mem_mib=2048)),
    ({"app.hami.io/gpumem": "2048", "app.hami.io/priority": "0"}, "app", "named", dict(priority=0)),
    ({"hami.io/gpumem": "1", "app.hami.io/gpumem": "2048"}, "sidecar", "untouched",
     "keys of their own for app"),
    ({"hami.io/containers": "app,eval", "eval.hami.io/gpumem": "512", "hami.io/gpumem": "1024"},
     "eval", "named", dict(mem_mib=512)),
    # a device plugin's CDI annotation is the container's own: it names its GPUs, the pod's keys size them
    ({"cdi.k8s.io/nvidia-device-plugin_uuid": f"nvidia.com/gpu={UUID_B}", "hami.io/gpumem": "1024"}, "app",
     "named", dict(use_uuids=(UUID_B,), mem_mib=1024)),
    ({"cdi.k8s.io/x": f"nvidia.com/gpu={UUID_A}", "hami.io/gpumem": "1024", "hami.io/containers": "other"},
     "app", "named", dict(use_uuids=(UUID_A,))),
    ({"cdi.k8s.io/x": "vendor.com/nic=0", "hami.io/gpumem": "1024"}, "app", "pod", dict(mem_mib=1024)),
    # HAMi's decision: one entry, the pod's slice; several, by order or by the list
    ({"hami.io/vgpu-devices-allocated": decision([(UUID_A, 1024, 30)])}, "app", "pod",
     dict(assigned=((UUID_A, 1024, 30),))),
    ({"hami.io/vgpu-devices-allocated": TWO_AND_EMPTY}, "app", "order", None),
    ({"hami.io/vgpu-devices-allocated": TWO_AND_EMPTY, "hami.io/containers": "a,c"}, "c", "named",
     dict(assigned=((UUID_B, 2048, 0),))),
    ({"hami.io/vgpu-devices-allocated": TWO_AND_EMPTY, "hami.io/containers": "a,c"}, "b", "untouched",
     "not in hami.io/containers=a,c"),
    ({"hami.io/vgpu-devices-allocated": TWO_AND_EMPTY, "hami.io/containers": "a,c",
      "c.hami.io/priority": "0"}, "c", "named", dict(priority=0, assigned=((UUID_B, 2048, 0),))),
])
def test_plan(annotations, name, kind, expected):
    who = PodMember(SANDBOX, name, "ml/trainer-0") if name else None
    assert mentions_request(annotations, [], True) or (kind == "alone" and expected is None)
    plan = pod_requests.plan(annotations, [], True, "default", who)
    assert plan.kind == kind
    if isinstance(expected, str):
        assert expected in plan.why and plan.request is None
    elif expected is None:
        assert plan.request is None
    else:
        for field, value in expected.items():
            got = getattr(plan.request, field)
            assert (tuple(tuple(d) for d in got) if field == "assigned" else got) == value, field


def test_order_plan_gives_each_entry_its_request():
    plan = pod_requests.plan({"hami.io/vgpu-devices-allocated": TWO_AND_EMPTY}, [], True, "force",
                             PodMember(SANDBOX, "c", ""))
    assert [bool(e) for e in plan.entries] == [True, False, True]
    assert tuple(plan.entry_request(2).assigned[0]) == (UUID_B, 2048, 0)
    assert plan.entry_request(2).core_policy == "force"


@pytest.mark.parametrize("annotations,name,field,reason", [
    ({"hami.io/gpumem": "1", "hami.io/containers": "app"}, None, "hami.io/containers",
     "names containers of a Kubernetes pod"),
    ({"app.hami.io/gpumem": "1"}, None, "app.hami.io/gpumem", "names containers of a Kubernetes pod"),
    ({"hami.io/gpumem": "1", "hami.io/containers": ""}, "app", "hami.io/containers", "1 to 64"),
    ({"hami.io/gpumem": "1", "hami.io/containers": "app,App"}, "app", "hami.io/containers",
     "not a Kubernetes container name"),
    ({"hami.io/gpumem": "1", "hami.io/containers": "app,app"}, "app", "hami.io/containers", "twice"),
    ({"hami.io/gpumem": "1", "hami.io/containers": "app,"}, "app", "hami.io/containers",
     "not a Kubernetes container name"),
    ({"Bad_Name.hami.io/gpumem": "1"}, "app", "Bad_Name.hami.io/gpumem", "not a Kubernetes container name"),
    ({"hami.io/containers": "app", "eval.hami.io/gpumem": "1"}, "app", "eval.hami.io/gpumem",
     "names container eval, which hami.io/containers=app does not list"),
    ({"hami.io/vgpu-devices-allocated": TWO_AND_EMPTY, "hami.io/containers": "a"}, "a",
     "hami.io/containers", "lists 1 container(s), and hami.io/vgpu-devices-allocated has 2 entries"),
    ({"hami.io/vgpu-devices-allocated": ";;"}, "a", "hami.io/vgpu-devices-allocated",
     "no device for any container"),
    ({"hami.io/vgpu-devices-allocated": decision([(UUID_A, 1, 1), (UUID_A, 1, 1)])}, "a",
     "hami.io/vgpu-devices-allocated", "the same GPU twice"),
    ({"hami.io/gpumem": "1", "app.hami.io/gpumem-percentage": "5"}, "app", "app.hami.io/gpumem-percentage",
     "conflicts with hami.io/gpumem=1"),
    ({"app.hami.io/gpumem": "lots"}, "app", "app.hami.io/gpumem", "not a whole number"),
    # outside a pod a decision must still hold one entry
    ({"hami.io/vgpu-devices-allocated": TWO_AND_EMPTY}, None, "hami.io/vgpu-devices-allocated",
     "3 container entries: cannot tell which one is this container"),
])
def test_plan_refusals_name_the_key(annotations, name, field, reason):
    who = PodMember(SANDBOX, name, "") if name else None
    with pytest.raises(HamiError) as caught:
        pod_requests.plan(annotations, [], True, "default", who)
    assert caught.value.field == field and reason in caught.value.line()


# ---- where a container stands in its pod -------------------------------------------------

def record(position, cid, slice_="named", uuids=()):
    return {"position": position, "id": cid, "creator": {"pid": 0, "start": None}, "slice": slice_,
            "uuids": list(uuids)}


def ledger(complete=True, **containers):
    return {"sandbox": SANDBOX, "runc_root": ROOT, "complete": complete, "containers": containers}


ONE_GPU = {"hami.io/gpumem": "1024"}
ORDER = {"hami.io/vgpu-devices-allocated": TWO_AND_EMPTY}


@pytest.mark.parametrize("before,running,annotations,name,cid,expected", [
    # the first container of a pod: position 0, the pod's slice
    (None, (), ONE_GPU, "app", "c1", dict(gets=True, position=0, slice="pod", release=())),
    # another one while the holder runs: none, and it says who holds it
    (ledger(app=record(0, "c1", "pod", [UUID_A])), ("c1",), ONE_GPU, "sidecar", "c2",
     dict(gets=False, position=1, slice="none", why="held by container app, which runs")),
    # the holder finished: its slice passes on, its allocation goes
    (ledger(app=record(0, "c1", "pod", [UUID_A])), (), ONE_GPU, "next", "c2",
     dict(gets=True, position=1, slice="pod", release=("c1",), why="passed on from container app")),
    # a restart (same name, new id): the old one goes, the same GPUs are asked for first
    (ledger(app=record(0, "c1", "pod", [UUID_A])), (), ONE_GPU, "app", "c9",
     dict(gets=True, position=0, slice="pod", release=("c1",), pinned=(UUID_A,))),
    # a restarted sidecar while the holder runs: still none, its own old one goes
    (ledger(app=record(0, "c1", "pod", [UUID_A]), sidecar=record(1, "c2", "none")), ("c1",), ONE_GPU,
     "sidecar", "c3", dict(gets=False, position=1, slice="none", release=("c2",))),
    # HAMi's entries by creation order
    (None, (), ORDER, "a", "c1", dict(gets=True, position=0, slice="entry", assigned=UUID_A)),
    (ledger(a=record(0, "c1", "entry", [UUID_A])), ("c1",), ORDER, "b", "c2",
     dict(gets=False, position=1, slice="none", why="entry 2 of 3 (by creation order) has no device")),
    (ledger(a=record(0, "c1", "entry"), b=record(1, "c2", "none")), ("c1",), ORDER, "c", "c3",
     dict(gets=True, position=2, slice="entry", assigned=UUID_B)),
    (ledger(a=record(0, "c1"), b=record(1, "c2"), c=record(2, "c3")), (), ORDER, "debug", "c4",
     dict(gets=False, position=3, why="container 4 of the pod by creation order")),
    # restarts keep their place: c restarts first, it is still entry 3
    (ledger(a=record(0, "c1"), b=record(1, "c2"), c=record(2, "c3", "entry", [UUID_B])), (), ORDER, "c",
     "c5", dict(gets=True, position=2, slice="entry", assigned=UUID_B, release=("c3",), pinned=())),
    # a record rebuilt after the state was lost: known names keep their entry
    (ledger(False, c=record(2, "c3", "entry", [UUID_B])), (), ORDER, "c", "c5",
     dict(gets=True, position=2, assigned=UUID_B)),
    # named containers: their request, a restart gets its GPUs first
    (ledger(app=record(0, "c1", "named", [UUID_B])), (),
     {"hami.io/gpumem": "1024", "hami.io/containers": "app"}, "app", "c2",
     dict(gets=True, position=0, slice="named", release=("c1",), pinned=(UUID_B,))),
])
def test_place(before, running, annotations, name, cid, expected):
    who = PodMember(SANDBOX, name, "ml/trainer-0")
    plan = pod_requests.plan(annotations, [], True, "default", who)
    frozen = copy.deepcopy(before)
    creator = {"pid": 42, "start": 7}
    placed = pod_ledger.place(before, who, ROOT, cid, creator, plan, lambda r: r["id"] in running)
    assert before == frozen  # pure: the given record is not changed
    assert (placed.request is not None) == expected["gets"]
    assert placed.position == expected["position"]
    if "slice" in expected:
        assert placed.ledger["containers"][name]["slice"] == expected["slice"]
    for field in ("release", "pinned"):
        if field in expected:
            assert getattr(placed, field) == expected[field]
    if "why" in expected:
        assert expected["why"] in placed.why
    if "assigned" in expected:
        assert placed.request.assigned[0].uuid == expected["assigned"]
    mine = placed.ledger["containers"][name]
    assert (mine["id"], mine["creator"], mine["position"]) == (cid, creator, expected["position"])
    assert pod_ledger.problem(pod_ledger.pod_key(ROOT, SANDBOX), placed.ledger) == ""


def test_place_takes_over_only_from_a_holder_that_does_not_run():
    before = ledger(init=record(0, "c1", "pod", [UUID_A]))
    who = PodMember(SANDBOX, "app", "")
    plan = pod_requests.plan(ONE_GPU, [], True, "default", who)
    placed = pod_ledger.place(before, who, ROOT, "c2", {"pid": 1, "start": 1}, plan, lambda r: False)
    assert placed.ledger["containers"]["init"]["slice"] == "none"  # one holder at a time


@pytest.mark.parametrize("before,running,annotations,name,field,reason", [
    (ledger(app=record(0, "c1", "pod")), ("c1",), ONE_GPU, "app", "container name",
     "still runs as container c1"),
    (ledger(False, a=record(0, "c1", "entry")), (), ORDER, "late", "hami.io/vgpu-devices-allocated",
     "the order the pod's containers were created in was lost"),
    (ledger(**{f"c{n}": record(n, f"id{n}") for n in range(pod_ledger.MAX_CONTAINERS)}), (), ONE_GPU,
     "one-more", "container name", f"already has {pod_ledger.MAX_CONTAINERS} containers"),
])
def test_place_refusals(before, running, annotations, name, field, reason):
    who = PodMember(SANDBOX, name, "")
    plan = pod_requests.plan(annotations, [], True, "default", who)
    with pytest.raises(HamiError) as caught:
        pod_ledger.place(before, who, ROOT, "new", {"pid": 1, "start": 1}, plan,
                         lambda r: r["id"] in running)
    assert caught.value.field == field and reason in caught.value.line()


def test_an_entry_that_cannot_be_a_request_is_refused_after_its_place_is_kept():
    annotations = {**ORDER, "hami.io/gpu": "2"}  # conflicts with entry 1's one device
    who = PodMember(SANDBOX, "a", "")
    plan = pod_requests.plan(annotations, [], True, "default", who)
    placed = pod_ledger.place(None, who, ROOT, "c1", {"pid": 1, "start": 1}, plan, lambda r: False)
    assert placed.request is None and placed.refusal.field == "hami.io/gpu"
    assert placed.ledger["containers"]["a"]["position"] == 0


# ---- the pod records as read back from the state file ------------------------------------

GOOD = ledger(app=record(0, "c1", "pod", [UUID_A]), sidecar=record(1, "c2", "none"))
KEY = pod_ledger.pod_key(ROOT, SANDBOX)


def broken(change):
    value = copy.deepcopy(GOOD)
    change(value)
    return value


@pytest.mark.parametrize("key,value,reason", [
    (KEY, GOOD, ""),
    (KEY, [], "must be an object"),
    (KEY, broken(lambda v: v.update(extra=1)), "must be an object with exactly"),
    (KEY, broken(lambda v: v.update(runc_root="relative")), "runc_root='relative'"),
    (KEY, broken(lambda v: v.update(sandbox="../x")), "container id"),
    ("other@0123456789abcdef", GOOD, "stored as"),
    (KEY, broken(lambda v: v.update(complete="yes")), "complete='yes'"),
    (KEY, broken(lambda v: v["containers"].update({"Bad": record(5, "c5")})), "'Bad'"),
    (KEY, broken(lambda v: v["containers"]["app"].update(position=-1)), "position=-1"),
    (KEY, broken(lambda v: v["containers"]["app"].update(position=True)), "position=True"),
    (KEY, broken(lambda v: v["containers"]["app"].update(id="../../etc")), "container id"),
    (KEY, broken(lambda v: v["containers"]["app"].update(creator={"pid": "1"})), "creator="),
    (KEY, broken(lambda v: v["containers"]["app"].update(slice="all")), "slice='all'"),
    (KEY, broken(lambda v: v["containers"]["app"].update(uuids=["../x"])), "uuids="),
    (KEY, broken(lambda v: v["containers"]["app"].update(uuids=[UUID_A, UUID_A])), "uuids="),
    (KEY, broken(lambda v: v["containers"]["app"].pop("uuids")), "must have exactly"),
    (KEY, broken(lambda v: v["containers"]["sidecar"].update(position=0)), "the same position"),
])
def test_pod_record_checks(key, value, reason):
    why = pod_ledger.problem(key, value)
    assert (why == "") if reason == "" else (reason in why), why


def test_bad_pod_records_are_set_apart_and_rebuilt_from_allocations():
    entry = {"id": "c1", "runc_root": ROOT, "bundle": "/b", "created_at": 1.0,
             "devices": [{"index": 0, "uuid": UUID_A, "mem_mib": 1024, "cores": 0}],
             "core_policy": "default", "priority": 1, "pid": 0, "creator": {"pid": 5, "start": 9},
             "pod": {"sandbox": SANDBOX, "container": "app", "position": 2, "slice": "entry"}}
    assert store.entry_problem(state_layout.alloc_name(ROOT, "c1"), entry) == ""
    good, bad = pod_ledger.parse({KEY: broken(lambda v: v.update(complete=1))})
    assert good == {} and "complete=1" in bad[KEY]
    pod_ledger.rebuild(good, {state_layout.alloc_name(ROOT, "c1"): entry})
    assert good == {KEY: ledger(False, app={"position": 2, "id": "c1", "creator": {"pid": 5, "start": 9},
                                            "slice": "entry", "uuids": [UUID_A]})}
    assert pod_ledger.problem(KEY, good[KEY]) == ""


@pytest.mark.parametrize("pod,reason", [
    ({"sandbox": SANDBOX, "container": "app", "position": 0}, "pod must have exactly"),
    ({"sandbox": "../x", "container": "app", "position": 0, "slice": "pod"}, "container id"),
    ({"sandbox": SANDBOX, "container": "APP", "position": 0, "slice": "pod"}, "pod.container="),
    ({"sandbox": SANDBOX, "container": "app", "position": "0", "slice": "pod"}, "pod.position="),
    ({"sandbox": SANDBOX, "container": "app", "position": 0, "slice": "none"}, "pod.slice="),
])
def test_an_allocation_with_a_bad_pod_is_invalid(pod, reason):
    entry = {"id": "c1", "runc_root": ROOT, "bundle": "/b", "pid": 0, "core_policy": "default",
             "priority": 1, "devices": [{"index": 0, "uuid": UUID_A, "mem_mib": 1, "cores": 0}], "pod": pod}
    assert reason in store.entry_problem(state_layout.alloc_name(ROOT, "c1"), entry)
