"""Kubernetes pods through the runtime and real runc: each container's spec has
the pod's annotations and the keys containerd's CRI plugin writes after them
(container type, sandbox id, container name), as on a node. The kubelet's side
(sandbox first, then the containers in the pod's order, restarts with new ids)
is played here with runc itself; tests/engines/test_containerd_cri.py drives the
same through containerd's CRI."""
import json
import os
import signal
import subprocess
import time

import jsonschema
import pytest

from tests.conftest import ROOT

from .node import RUNC, RUNTIME, TIMEOUT

STATE_SCHEMA = json.loads((ROOT / "schemas" / "state.schema.json").read_text())

SANDBOX = "5b1c0d2a9b7e4c11" * 4
MEMBER_KEYS = ("io.kubernetes.cri.container-type", "io.kubernetes.cri.sandbox-id",
               "io.kubernetes.cri.container-name")


def uuids(node):
    return [g["uuid"] for g in json.loads(node.hamictl("gpus", "--json").stdout)]


class Pod:
    """One pod on the node: its sandbox container, then containers named as in the
    pod, each with a container id of its own (a restart: a new id, the same name)."""

    def __init__(self, node, annotations, sandbox=SANDBOX):
        self.node, self.annotations, self.sandbox = node, dict(annotations), sandbox
        self.ids = {}
        node.write_config(log_file=str(node.tmp / "hami.log"), log_level="info")
        spec = {"io.kubernetes.cri.container-type": "sandbox", "io.kubernetes.cri.sandbox-id": sandbox,
                "io.kubernetes.cri.sandbox-name": "trainer-0", "io.kubernetes.cri.sandbox-namespace": "default",
                **self.annotations}
        bundle = node.bundle(sandbox, spec)
        proc = node.runtime("run", "--detach", "--bundle", str(bundle), sandbox)
        assert proc.returncode == 0, proc.stderr
        assert node.allocations() == {}  # the sandbox holds nothing

    def spec(self, name):
        return {**self.annotations, "io.kubernetes.cri.container-type": "container",
                "io.kubernetes.cri.sandbox-id": self.sandbox, "io.kubernetes.cri.container-name": name,
                "io.kubernetes.cri.sandbox-name": "trainer-0",
                "io.kubernetes.cri.sandbox-namespace": "default"}

    def start(self, name, attempt=0, check=True):
        """The kubelet's create and start of container `name`: its id, or the runtime's result."""
        cid = f"{name}-{attempt}"
        bundle = self.node.bundle(cid, self.spec(name))
        proc = self.node.runtime("run", "--detach", "--bundle", str(bundle), cid)
        if check:
            assert proc.returncode == 0, proc.stderr
            self.ids[name] = cid
            return cid
        return proc

    def stop(self, name):
        """The container's process ends; runc keeps it (as CRI-O does until the kubelet removes it)."""
        cid = self.ids[name]
        assert self.node.runtime("kill", cid, "KILL").returncode == 0
        deadline = time.monotonic() + TIMEOUT
        while json.loads(self.node.runtime("state", cid).stdout or "{}").get("status") != "stopped":
            assert time.monotonic() < deadline, f"{cid} did not stop"
            time.sleep(0.05)

    def remove(self, cid):
        assert self.node.runtime("delete", "--force", cid).returncode == 0

    def held(self):
        """container name -> [(uuid, MiB, cores)] of the pod's allocations now."""
        return {e["pod"]["container"]: [(d["uuid"], d["mem_mib"], d["cores"]) for d in e["devices"]]
                for e in self.node.allocations().values() if "pod" in e}

    def log(self):
        return (self.node.tmp / "hami.log").read_text()


def unchanged(node, cid, spec_before):
    return json.loads((node.tmp / "bundles" / cid / "config.json").read_text()) == spec_before


def test_a_sidecar_not_named_runs_untouched(node):
    pod = Pod(node, {"hami.io/gpumem": "1024", "hami.io/gpucores": "30", "hami.io/containers": "app"})
    pod.start("app")
    sidecar = pod.start("istio-proxy")
    assert pod.held() == {"app": [(uuids(node)[0], 1024, 30)]}
    spec = json.loads((node.tmp / "bundles" / sidecar / "config.json").read_text())
    assert "hami.io/allocation" not in spec["annotations"] and "linux" in spec
    assert not any("vgpu" in m["destination"] for m in spec.get("mounts", []))
    assert "istio-proxy-0 (container istio-proxy of pod default/trainer-0): passed through untouched: " \
           "no GPU: not named by the pod (hami.io/containers=app)" in pod.log()
    assert "app-0 (container app of pod default/trainer-0): allocated GPU 0 1024MiB 30% " \
           "(listed in hami.io/containers)" in pod.log()


def test_containers_of_one_pod_with_slices_of_their_own(node):
    pod = Pod(node, {"hami.io/gpucores": "30", "trainer.hami.io/gpumem": "4096",
                     "trainer.hami.io/gpucores": "60", "evaluator.hami.io/gpumem": "1024"})
    for name in ("trainer", "evaluator", "log-shipper"):
        pod.start(name)
    held = pod.held()
    assert sorted(held) == ["evaluator", "trainer"]
    assert [(mib, cores) for _, mib, cores in held["trainer"]] == [(4096, 60)]
    assert [(mib, cores) for _, mib, cores in held["evaluator"]] == [(1024, 30)]
    # The keys each request was made of, as written on the pod.
    written = {e["pod"]["container"]: e["request"] for e in node.allocations().values()}
    assert written == {"trainer": {"trainer.hami.io/gpucores": "60", "trainer.hami.io/gpumem": "4096"},
                       "evaluator": {"hami.io/gpucores": "30", "evaluator.hami.io/gpumem": "1024"}}
    assert "no GPU: not named by the pod (keys of their own for evaluator, trainer)" in pod.log()


def test_an_unnamed_request_is_one_slice_for_the_pod(node):
    """No silent doubling: the first container holds the pod's request, the others
    run without a GPU while it runs, and it passes on once its holder has finished
    (an init container)."""
    pod = Pod(node, {"hami.io/gpumem": "1024"})
    first = pod.start("init-weights")
    pod.start("app")
    assert pod.held() == {"init-weights": [(uuids(node)[0], 1024, 0)]}
    assert "app-0 (container app of pod default/trainer-0): passed through untouched: no GPU: the " \
           "pod's request (hami.io/gpumem=1024) is held by container init-weights, which runs" in pod.log()
    pod.stop("init-weights")   # finished; the kubelet keeps it until the pod goes
    pod.start("worker")
    assert pod.held() == {"worker": [(uuids(node)[0], 1024, 0)]}  # and init-weights' slice is freed
    assert "passed on from container init-weights, which no longer runs" in pod.log()
    pod.remove(first)
    assert pod.held() == {"worker": [(uuids(node)[0], 1024, 0)]}


def test_a_single_container_pod_works_as_before(node):
    pod = Pod(node, {"hami.io/gpumem": "2048", "hami.io/gpucores": "25"})
    pod.start("app")
    [entry] = node.allocations().values()
    assert [(d["mem_mib"], d["cores"]) for d in entry["devices"]] == [(2048, 25)]
    assert entry["pod"] == {"sandbox": SANDBOX, "container": "app", "position": 0, "slice": "pod"}


def decision(node, *entries):
    return ";".join(",".join(("{}", "NVIDIA", str(mib), str(cores))).format(uuids(node)[gpu]) + ":"
                    if gpu is not None else "" for gpu, mib, cores in entries) + ";"


def test_hami_decision_by_creation_order(node):
    """Three containers and HAMi's decision (the middle one without a GPU): each gets
    the entry at the place it was created in the pod; a fourth (kubectl debug) none."""
    value = decision(node, (0, 1024, 30), (None, 0, 0), (1, 2048, 0))
    pod = Pod(node, {"hami.io/vgpu-devices-allocated": value})
    for name in ("a", "b", "c", "debugger"):
        pod.start(name)
    gpu = uuids(node)
    assert pod.held() == {"a": [(gpu[0], 1024, 30)], "c": [(gpu[1], 2048, 0)]}
    assert "b-0 (container b of pod default/trainer-0): passed through untouched: no GPU: HAMi's " \
           "entry 2 of 3 (by creation order) has no device" in pod.log()
    assert "no GPU: it is container 4 of the pod by creation order, and " \
           "hami.io/vgpu-devices-allocated has 3 entries" in pod.log()
    state = node.state()
    jsonschema.validate(state, STATE_SCHEMA)
    [ledger] = state["pods"].values()
    assert {n: (r["position"], r["slice"]) for n, r in ledger["containers"].items()} == {
        "a": (0, "entry"), "b": (1, "none"), "c": (2, "entry"), "debugger": (3, "none")}


def test_hami_decision_paired_by_the_listed_containers(node):
    """hami.io/containers pairs the i-th listed container with the i-th entry that has
    a device, whatever order the containers come in (an image pull that failed)."""
    value = decision(node, (None, 0, 0), (0, 1024, 30), (None, 0, 0), (1, 2048, 0))
    pod = Pod(node, {"hami.io/vgpu-devices-allocated": value, "hami.io/containers": "a,c"})
    for name in ("c", "sidecar", "a"):
        pod.start(name)
    gpu = uuids(node)
    assert pod.held() == {"a": [(gpu[0], 1024, 30)], "c": [(gpu[1], 2048, 0)]}


def test_a_restarted_container_gets_its_slice_back_and_the_old_one_goes(node):
    """Same name, same sandbox, a new container id: the same GPU again (though
    binpack would now pick the other one), and the stopped one's allocation freed."""
    pod = Pod(node, {"hami.io/gpumem": "1024", "hami.io/containers": "app"})
    pod.start("app")
    gpu = uuids(node)
    other = node.bundle("other", {"hami.io/gpumem": "4096", "hami.io/gpu-uuid": gpu[1]})
    assert node.create("other", other).returncode == 0
    pod.stop("app")
    assert pod.held() == {"app": [(gpu[0], 1024, 0)]}  # runc keeps the stopped one
    pod.start("app", attempt=1)
    assert sorted(node.allocations()) == ["app-1", "other"]
    assert pod.held()["app"] == [(gpu[0], 1024, 0)]
    assert "on the GPUs it had before its restart" in pod.log()
    assert sorted(os.listdir(node.state_dir / "containers")) == sorted(
        n for n in node.state()["allocations"])


def test_a_second_container_of_one_name_while_the_first_runs_is_refused(node):
    pod = Pod(node, {"hami.io/gpumem": "1024", "hami.io/containers": "app"})
    pod.start("app")
    before = (node.state_dir / "allocations.json").read_bytes()
    proc = pod.start("app", attempt=1, check=False)
    assert proc.returncode == 1 and proc.stderr.count("\n") == 1
    assert "container name='app': container app of pod default/trainer-0 still runs as container app-0" \
        in proc.stderr
    assert (node.state_dir / "allocations.json").read_bytes() == before


def test_a_deleted_pod_leaves_nothing(node, tmp_path):
    """The pod goes while its GPU container is between restarts, and while a create of
    another is killed half-way: no allocation, dir or pod record is left."""
    pod = Pod(node, {"hami.io/gpumem": "1024", "hami.io/containers": "app,worker"})
    pod.start("app")
    pod.start("sidecar")
    pod.stop("app")
    slow = tmp_path / "slow-runc"
    slow.write_text(f"#!/bin/sh\nsleep 5\nexec {RUNC} \"$@\"\n")
    slow.chmod(0o755)
    saved, node.config = node.config, tmp_path / "slow.toml"
    node.write_config(runtime=[str(slow)])
    slow_config, node.config = node.config, saved
    bundle = node.bundle("worker-0", pod.spec("worker"))
    with open(tmp_path / "out", "wb") as out:
        proc = subprocess.Popen(RUNTIME + ["--root", str(node.runc_root), "create", "--bundle", str(bundle),
                                           "worker-0"], stdin=subprocess.DEVNULL, stdout=out, stderr=out,
                                env={**node.env, "HAMI_CONFIG": str(slow_config)}, start_new_session=True)
        deadline = time.monotonic() + TIMEOUT
        while "worker" not in pod.held():
            assert time.monotonic() < deadline and proc.poll() is None
            time.sleep(0.05)
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(TIMEOUT)
    [ledger] = node.state()["pods"].values()
    assert ledger["sandbox"] == SANDBOX and sorted(ledger["containers"]) == ["app", "worker"]
    for cid in (SANDBOX, "app-0", "sidecar-0"):
        pod.remove(cid)
    assert node.ps() == []
    node.reconcile()  # the next operation frees what is gone
    state = node.state()
    assert state["allocations"] == {} and "pods" not in state
    assert os.listdir(node.state_dir / "containers") == os.listdir(node.state_dir / "private") == []


def test_lost_state_keeps_the_order_it_knows_and_refuses_what_it_cannot_tell(node):
    value = decision(node, (0, 1024, 30), (None, 0, 0), (1, 2048, 0))
    pod = Pod(node, {"hami.io/vgpu-devices-allocated": value})
    for name in ("a", "b", "c"):
        pod.start(name)
    (node.state_dir / "allocations.json").unlink()
    proc = pod.start("late", check=False)
    assert proc.returncode == 1
    assert "the order the pod's containers were created in was lost" in proc.stderr
    pod.stop("a")
    pod.start("a", attempt=1)  # a name it knows keeps its entry
    gpu = uuids(node)
    assert pod.held() == {"a": [(gpu[0], 1024, 30)], "c": [(gpu[1], 2048, 0)]}
    [ledger] = node.state()["pods"].values()
    assert ledger["complete"] is False and sorted(ledger["containers"]) == ["a", "c"]


@pytest.mark.parametrize("annotations,field", [
    ({"hami.io/gpumem": "1024", "hami.io/containers": "app"}, "hami.io/containers"),
    ({"app.hami.io/gpumem": "1024"}, "app.hami.io/gpumem"),
])
def test_naming_containers_outside_a_pod_is_refused(node, annotations, field):
    proc = node.create("alone", node.bundle("alone", annotations))
    assert proc.returncode == 1 and proc.stderr.count("\n") == 1
    assert f"{field}=" in proc.stderr and "names containers of a Kubernetes pod" in proc.stderr
    assert node.allocations() == {} and node.containers() == []


def test_a_tampered_pod_record_is_set_apart_and_named_by_doctor(node):
    """A pod record that is not one (here: a container id that would be a path) is
    never used: the pod counts as rebuilt from its allocations, so a container the
    rebuilt record does not know is refused rather than guessed, and doctor names it."""
    value = decision(node, (0, 1024, 30), (None, 0, 0), (1, 2048, 0))
    pod = Pod(node, {"hami.io/vgpu-devices-allocated": value})
    pod.start("a")
    state = node.state()
    [key] = state["pods"]
    state["pods"][key]["containers"]["a"]["id"] = "../../../etc"
    (node.state_dir / "allocations.json").write_text(json.dumps(state))
    doctor = node.hamictl("doctor")
    assert doctor.returncode == 1 and f"pod record '{key}': invalid: a: container id=" in doctor.stdout
    proc = pod.start("b", check=False)
    assert proc.returncode == 1 and "the order the pod's containers were created in was lost" in proc.stderr
    assert node.ps()  # shown, and nothing written: hamictl only reads the state
    node.reconcile()  # the next transaction writes the state back without the bad record
    [ledger] = node.state()["pods"].values()
    assert ledger["complete"] is False and ledger["containers"]["a"]["id"] == "a-0"
    assert node.hamictl("doctor").returncode == 0
