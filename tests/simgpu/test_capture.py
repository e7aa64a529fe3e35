"""Stream capture and graph memory on the simulated driver, with the driver's rules and codes
(cuda.h; the programming guide's "Stream Capture", "Prohibited and Unhandled Operations",
"Invalidation", "Graph Memory Nodes"). Each case runs progs/sim_capture.c, a compiled
program, and compares the JSON it prints."""
import json
import subprocess

import pytest

from tests.simgpu.conftest import SIM_TESTS

ACTIVE, INVALIDATED, NONE = 1, 2, 0
UNSUPPORTED, INVALIDATED_RC, MERGE, UNMATCHED, UNJOINED, ISOLATION, IMPLICIT, CAPTURED_EVENT, WRONG_THREAD = \
    range(900, 909)
ILLEGAL_STATE, INVALID_VALUE, OUT_OF_MEMORY = 401, 1, 2
KERNEL, MEMCPY, MEMSET, HOST, GRAPH, WAIT_EVENT, EVENT_RECORD, MEM_ALLOC, MEM_FREE = 0, 1, 2, 3, 4, 6, 7, 10, 11


def run(sim_env, *args, config=None, tmp_path=None):
    env = dict(sim_env)
    if config:
        path = tmp_path / "sim.conf"
        path.write_text(config)
        env["HAMI_SIM_CONFIG"] = str(path)
    proc = subprocess.run([SIM_TESTS / "sim_capture", *args], env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


@pytest.mark.parametrize("mode", ["global", "thread_local", "relaxed"])
def test_a_capture_in_each_mode_makes_a_graph_of_what_was_queued(sim_env, mode):
    out = run(sim_env, "mode", mode)
    assert out == {"destroy": INVALID_VALUE, "begin": 0, "again": ILLEGAL_STATE, "kernel": 0, "info": 0, "status": ACTIVE, "id": 1,
                   "graph_same": 1, "deps": 1, "type": KERNEL, "end": 0, "nodes": 1, "after": NONE,
                   "end_again": ILLEGAL_STATE}


# (operation during a capture on a blocking stream begun GLOBAL, the thread's interaction mode) ->
# its code, and whether it invalidated the capture (then ending it gives INVALIDATED and no graph)
RULES = [
    ("stream_sync", "global", UNSUPPORTED, True),       # synchronising a capturing stream
    ("stream_sync", "relaxed", UNSUPPORTED, True),
    ("stream_query", "relaxed", UNSUPPORTED, True),
    ("event_query", "relaxed", CAPTURED_EVENT, True),   # an event last recorded in the capture
    ("event_sync", "relaxed", CAPTURED_EVENT, True),
    ("event_query", "global", UNSUPPORTED, True),       # a potentially unsafe call comes first
    ("ctx_sync", "relaxed", UNSUPPORTED, True),         # the context holds a capturing stream
    ("ctx_sync", "global", UNSUPPORTED, True),
    ("legacy_launch", "relaxed", IMPLICIT, True),       # the legacy stream would depend on the capture
    ("legacy_sync", "relaxed", IMPLICIT, True),
    ("legacy_record", "relaxed", IMPLICIT, True),
    ("sync_copy", "relaxed", IMPLICIT, True),           # synchronous copies use the legacy stream
    ("sync_copy", "global", UNSUPPORTED, True),
    ("legacy_is_capturing", "global", IMPLICIT, False),  # cuda.h: the capture is not invalidated
    ("wait_uncaptured", "relaxed", ISOLATION, True),    # an event recorded outside the capture
    ("wait_external", "relaxed", 0, False),             # ... unless waited on as external: a node
    ("mem_alloc", "global", UNSUPPORTED, True),         # cudaMalloc, the documented unsafe call
    ("mem_alloc", "relaxed", 0, False),
    ("callback", "relaxed", UNSUPPORTED, True),         # legacy callbacks are not capturable
    ("host_fn", "relaxed", 0, False),                   # host functions are: a host node
    ("end_on_joined", "relaxed", UNMATCHED, True),      # ended on a stream it did not begin on
]


@pytest.mark.parametrize("op, thread_mode, code, invalidates", RULES,
                         ids=[f"{r[0]}-{r[1]}" for r in RULES])
def test_each_rule_refuses_with_the_drivers_code_and_invalidates(sim_env, op, thread_mode, code, invalidates):
    out = run(sim_env, "rule", op, "blocking", thread_mode)
    assert out["rc"] == code
    if invalidates:
        assert (out["status"], out["end"], out["graph"]) == (INVALIDATED, INVALIDATED_RC, 0)
    else:
        assert out["status"] == ACTIVE and out["end"] == 0 and out["graph"] >= 1
    assert out["after"] == NONE and out["s2_after"] == NONE  # ending leaves every stream out of capture


@pytest.mark.parametrize("op", ["legacy_launch", "legacy_sync", "sync_copy", "legacy_is_capturing"])
def test_a_non_blocking_capture_leaves_the_legacy_stream_usable(sim_env, op):
    out = run(sim_env, "rule", op, "nonblocking", "relaxed")
    assert (out["rc"], out["status"], out["end"]) == (0, ACTIVE, 0)


def test_an_unjoined_fork_fails_the_end_and_ends_the_capture(sim_env):
    out = run(sim_env, "rule", "unjoined", "blocking", "relaxed")
    assert (out["rc"], out["status"], out["end"], out["graph"]) == (0, ACTIVE, UNJOINED, 0)
    assert out["after"] == NONE and out["s2_after"] == NONE


# (mode the capture began in, the calling thread, its interaction mode) -> refused?
UNSAFE = [(cm, where, tm) for cm in ("global", "thread_local", "relaxed") for where in ("same", "other")
          for tm in ("global", "thread_local", "relaxed")]


def refused(capture_mode, where, thread_mode):
    if thread_mode == "relaxed" or capture_mode == "relaxed":
        return False
    if where == "same":
        return True
    return capture_mode == "global" and thread_mode == "global"


@pytest.mark.parametrize("capture_mode, where, thread_mode", UNSAFE, ids=["-".join(u) for u in UNSAFE])
def test_an_unsafe_call_follows_the_interaction_modes(sim_env, capture_mode, where, thread_mode):
    # cuEventQuery of an event recorded outside any capture, as a watchdog thread makes it
    out = run(sim_env, "unsafe", capture_mode, where, thread_mode, "event_query")
    if refused(capture_mode, where, thread_mode):
        assert out == {"rc": UNSUPPORTED, "status": INVALIDATED, "end": INVALIDATED_RC}
    else:
        assert out == {"rc": 0, "status": ACTIVE, "end": 0}


@pytest.mark.parametrize("call", ["mem_alloc", "mem_free", "event_sync", "stream_query", "stream_sync",
                                  "sync_copy", "sync_memset"])
def test_another_threads_unsafe_call_invalidates_a_global_capture(sim_env, call):
    assert run(sim_env, "unsafe", "global", "other", "global", call) == \
        {"rc": UNSUPPORTED, "status": INVALIDATED, "end": INVALIDATED_RC}
    assert run(sim_env, "unsafe", "global", "other", "relaxed", call) == {"rc": 0, "status": ACTIVE, "end": 0}
    assert run(sim_env, "unsafe", "thread_local", "other", "global", call) == {"rc": 0, "status": ACTIVE, "end": 0}


@pytest.mark.parametrize("call", ["is_capturing", "capture_info", "event_create", "event_record", "ctx_current",
                                  "graph_mem_attr", "mem_get_info"])
def test_calls_that_stay_legal_during_a_global_capture(sim_env, call):
    assert run(sim_env, "unsafe", "global", "other", "global", call) == {"rc": 0, "status": ACTIVE, "end": 0}
    assert run(sim_env, "unsafe", "global", "same", "global", call) == {"rc": 0, "status": ACTIVE, "end": 0}


def test_an_invalidated_capture_forbids_no_more_unsafe_calls_but_its_streams_stay_refused(sim_env):
    assert run(sim_env, "after_invalid") == {"first": UNSUPPORTED, "second": 0, "launch": INVALIDATED_RC,
                                             "idle_wait": INVALID_VALUE, "s2": NONE, "end": INVALIDATED_RC}


@pytest.mark.parametrize("mode, other, status, end", [
    ("global", WRONG_THREAD, INVALIDATED, INVALIDATED_RC),
    ("thread_local", WRONG_THREAD, INVALIDATED, INVALIDATED_RC),
    ("relaxed", 0, NONE, -1),                            # a relaxed capture may end on any thread
])
def test_ending_a_capture_from_another_thread(sim_env, mode, other, status, end):
    assert run(sim_env, "wrong_thread", mode) == {"other": other, "status": status, "end": end}


def test_fork_join_merge_and_a_captured_event(sim_env):
    out = run(sim_env, "fork_join")
    assert out == {"s2_before": NONE, "s2_joined": ACTIVE, "same_id": 1,
                   "query": CAPTURED_EVENT, "end_invalid": INVALIDATED_RC,
                   # kernel, (kernel on s2 | kernel on s1), then a kernel after both
                   "nodes": 4, "last_deps": 2, "deps_before_last": 2 - 1, "s2_after": NONE,
                   "merge": MERGE, "merged_status": [INVALIDATED, INVALIDATED],
                   "merged_end": [INVALIDATED_RC, INVALIDATED_RC]}


def test_every_node_kind_capture_makes_and_its_replay(sim_env):
    out = run(sim_env, "node_kinds")
    assert out["types"] == [KERNEL, MEMSET, MEMCPY, HOST, EVENT_RECORD, WAIT_EVENT, GRAPH, MEM_ALLOC, MEMCPY,
                            MEMCPY, MEM_FREE]
    assert out["alloc_addr"] == 1 and out["alloc_size"] == 4 << 20 and out["free_addr"] == 1
    assert out["child_nodes"] == 1
    assert (out["host_before"], out["host_after"], out["copied"]) == (0, 1, 1)  # host function and copies ran


def test_graph_memory_is_taken_at_upload_kept_and_trimmed(sim_env):
    out = run(sim_env, "graph_memory")
    # [USED MiB, RESERVED MiB, MiB the card lost (cuMemGetInfo)]
    assert out["captured"] == out["instantiated"] == [0, 0, 0]  # nothing taken before upload/launch
    assert out["second_instantiate"] == INVALID_VALUE          # one executable per graph with memory nodes
    assert out["uploaded"] == out["launched"] == [60, 60, 60]  # relaunches reuse it
    assert out["trimmed"] == [0, 0, 0]                         # idle and nothing live: all given back
    assert out["relaunched"] == [60, 60, 60]
    assert out["unfreed"] == [70, 70, 70]                      # an allocation the graph leaves live
    assert out["relaunch_unfreed"] == INVALID_VALUE            # while it lives the graph may not run again
    assert out["trim_live"] == [10, 10, 10]                    # a trim keeps a live allocation
    assert out["free_again"] == INVALID_VALUE                  # freed once (cuMemFreeAsync), not twice
    assert out["freed"] == [0, 10, 10]                         # freed: reserved for reuse until a trim
    assert out["trim_all"] == [0, 0, 0]
    assert out["highs"] == [70, 70] and out["reset"] == [0, 0] and out["set_current"] == INVALID_VALUE
    assert out["auto_free_relaunch"] == 0 and out["auto_free"] == [4, 4, 4]
    assert out["free_twice"] == INVALID_VALUE
    assert out["upload_flag"] == [8, 8, 8] and out["result"] == 0  # instantiated with the upload flag


def test_graph_memory_the_card_cannot_hold_is_refused_leaving_nothing_taken(sim_env, tmp_path):
    out = run(sim_env, "graph_oom", config="devices = 1\nmemory_mib = 1024\n", tmp_path=tmp_path)
    assert out["instantiate"] == 0
    assert out["upload"] == OUT_OF_MEMORY and out["after_upload"] == [0, 0, 0]
    assert out["launch"] == OUT_OF_MEMORY and out["after_launch"] == [0, 0, 0]
    assert out["fits"] == 0 and out["fitted"][0] == out["fitted"][1] == out["fitted"][2] > 0
    assert out["plain_alloc"] == OUT_OF_MEMORY                 # the graph's memory is the card's


def test_a_replay_books_its_kernels_on_the_device(sim_env):
    out = run(sim_env, "replay_time")
    assert out["idle_util"] == 0                                # capture ran nothing
    assert 600 <= out["ms"] < 800                               # three 200 ms kernels, one after another
    assert 55 <= out["util"] <= 65                              # NVML: busy 0.6 s of the last second


def test_an_executable_graph_is_updated_from_a_graph_of_the_same_topology(sim_env):
    out = run(sim_env, "exec_update")
    assert 20 <= out["before_ms"] < 40 and out["same"] == [0, 0]     # two 10 ms kernels, then two of 50 ms
    assert 100 <= out["after_ms"] < 130
    assert out["more"] == [910, 2]                                   # GRAPH_EXEC_UPDATE_FAILURE, TOPOLOGY_CHANGED
    assert out["type"] == [910, 3]                                   # NODE_TYPE_CHANGED
    assert out["third_deps"] == 1 and out["on_first"] == 1           # cuStreamUpdateCaptureDependencies(SET)
