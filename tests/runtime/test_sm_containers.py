"""The SM policies between containers, through hami-runtime and runc on one
simulated card: each container runs a kernel loop (sm_load, 10 ms kernels) in
its own pid namespace, as workloads do, and an unlimited container on the
node's other card is the reference run in the same seconds. Under `default`
the shares hold while the containers work together, a container alone runs at
about the full rate, and it is let go soon after its neighbour stops; under
`force` the shares hold always.

Timed on a shared machine: the bounds are wide (the bench, bench/sm_accuracy.py
--only containers, has the figures)."""
import json
import time

import pytest

from .node import CUDA_ALLOC

pytestmark = pytest.mark.skipif(not CUDA_ALLOC.exists(), reason="make sim builds the test programs")

SECONDS = 5.0
WARMUP_S = 2.0            # containers start and create their contexts before the window
LATE_WARMUP_S = 0.5       # ... a late one just before its own (it launches as soon as it can)
POINTS = 5.0              # each share within this many points of its target


def uuids(node):
    return [g["uuid"] for g in json.loads(node.hamictl("gpus", "--json").stdout)]


def run_together(node, containers, seconds=SECONDS, late=None):
    """containers: [(cid, cores, policy)] on card 0, plus the reference on card 1;
    late: (cid, cores, policy, at_s, for_s), a container whose window opens at_s into
    the others'. Returns {cid: sm_load's report}."""
    card, other = uuids(node)[:2]
    start_at = time.monotonic_ns() + int(WARMUP_S * 1e9)

    def slice_of(uuid, cores, policy):
        annotations = {"hami.io/gpumem": "1000", "hami.io/gpu-uuid": uuid}
        if cores:
            annotations.update({"hami.io/gpucores": str(cores), "hami.io/core-policy": policy})
        return annotations

    procs = {"reference": node.start_load("reference", slice_of(other, 0, None), seconds, start_at)}
    for cid, cores, policy in containers:
        procs[cid] = node.start_load(cid, slice_of(card, cores, policy), seconds, start_at)
    if late:
        cid, cores, policy, at_s, for_s = late
        opens = start_at + int(at_s * 1e9)
        time.sleep(max(0.0, (opens - time.monotonic_ns()) / 1e9 - LATE_WARMUP_S))
        procs[cid] = node.start_load(cid, slice_of(card, cores, policy), for_s, opens)
    return {cid: node.load_result(cid, proc) for cid, proc in procs.items()}


def share(results, cid):
    return 100.0 * results[cid]["completed"] / results["reference"]["completed"]


SPLITS = {
    "default 30+30": [("a", 30, "default"), ("b", 30, "default")],
    "default 20+80": [("a", 20, "default"), ("b", 80, "default")],
    "default 20+30+40": [("a", 20, "default"), ("b", 30, "default"), ("c", 40, "default")],
    "force 30+30": [("a", 30, "force"), ("b", 30, "force")],
    "force 20+80": [("a", 20, "force"), ("b", 80, "force")],
}


@pytest.mark.timeout(300)
@pytest.mark.parametrize("containers", SPLITS.values(), ids=SPLITS.keys())
def test_busy_containers_get_their_shares(node, containers):
    results = run_together(node, containers)
    got = {cid: share(results, cid) for cid, _, _ in containers}
    for cid, cores, _ in containers:
        assert abs(got[cid] - cores) <= POINTS, got


@pytest.mark.timeout(300)
def test_default_lends_an_idle_gpu_and_takes_it_back(node):
    """A 30 % `default` container alone runs at about the full rate; while a 60 %
    neighbour works it is held to its share, and let go within a second after."""
    results = run_together(node, [("ours", 30, "default")], seconds=8.0, late=("neighbour", 60, "default", 3.0, 2.5))
    ours, ref = results["ours"]["per_tenth"], results["reference"]["per_tenth"]

    def pct(begin, end):
        mine, theirs = sum(ours[int(begin * 10):int(end * 10)]), sum(ref[int(begin * 10):int(end * 10)])
        return 100.0 * mine / max(theirs, 1)

    began = 3.0 + results["neighbour"]["ready_s"]   # it launches from when it is ready
    series = f"neighbour from {began:.1f} s to 5.5 s; ours per tenth: " + " ".join(map(str, ours))
    assert pct(0.3, began - 0.1) >= 90, series             # alone
    assert abs(pct(began + 1.0, 5.3) - 30) <= POINTS, series   # held while the neighbour works
    assert pct(6.5, 7.8) >= 90, series                     # let go within 1 s of its last kernel
