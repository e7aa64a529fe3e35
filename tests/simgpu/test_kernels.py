"""Simulated kernel time: streams run in order, devices run one kernel at a time across
processes, events time the stream, NVML utilisation comes from the busy time.

Times are a GPU's, not the stream thread's: events read the stream's GPU timeline, a
kernel starts `dispatch_us` after its launch call returned (the call itself takes
`launch_us` of CPU), and the device's engine time-slices between contexts (`timeslice_us`,
sim_engine.c)."""
import json
import time

import pytest


def test_launch_is_asynchronous_and_the_stream_runs_in_order(run_py):
    out = json.loads(run_py("""
        import json
        c = Cuda(); c.init(0)
        s = c.stream()
        t0 = time.monotonic()
        for _ in range(4):
            c.kernel(50_000, s)
        launched = time.monotonic() - t0
        busy = c.rc("cuStreamQuery", s)
        c.sync(s)
        done = time.monotonic() - t0
        print(json.dumps([launched, busy, done, c.rc("cuStreamQuery", s)]))
    """))
    launched, busy, done, idle = out
    assert launched < 0.04 and busy == NOT_READY_CODE and idle == 0
    assert 0.2 <= done < 0.4


NOT_READY_CODE = 600


def test_event_elapsed_time_is_the_kernels_time(run_py):
    out = json.loads(run_py("""
        import json
        c = Cuda(); c.init(0)
        start, end, untimed = c.event(), c.event(), c.event(2)
        c.call("cuEventRecord", start, None)
        c.kernel(80_000)
        c.kernel(40_000)
        c.call("cuEventRecord", end, None)
        pending = c.rc("cuEventQuery", end)
        not_ready = c.rc("cuEventElapsedTime", ctypes.byref(ctypes.c_float()), start, end)
        c.call("cuEventSynchronize", end)
        ms = c.elapsed_ms(start, end)
        c.call("cuEventRecord", untimed, None); c.sync()
        errors = [c.rc("cuEventElapsedTime", ctypes.byref(ctypes.c_float()), start, untimed),
                  c.rc("cuEventElapsedTime", ctypes.byref(ctypes.c_float()), start, c.event()),
                  c.rc("cuEventQuery", c.event())]
        print(json.dumps([pending, not_ready, ms, errors]))
    """))
    pending, not_ready, ms, errors = out
    assert pending == 600 and not_ready == 600
    assert 119 <= ms <= 160
    assert errors == [400, 400, 0]  # no timing / never recorded: INVALID_HANDLE; unrecorded query: done


def test_a_wait_is_for_the_record_it_was_given_not_a_later_one(run_py):
    """cuStreamWaitEvent waits for the event's record at the time of the call: recording the
    event again on a stream that depends on the waiter must not hold the waiter (as cuDNN's
    plan timing does with its streams)."""
    out = json.loads(run_py("""
        import json
        c = Cuda(); c.init(0)
        a, b, d = c.stream(), c.stream(), c.stream()
        e, g = c.event(), c.event()
        c.kernel(50_000, a)
        c.call("cuEventRecord", e, a)          # record 1 of e, after 50 ms on a
        c.call("cuStreamWaitEvent", b, e, 0)   # b waits for record 1
        c.call("cuEventRecord", g, b)
        c.call("cuStreamWaitEvent", d, g, 0)   # d waits for b ...
        c.call("cuEventRecord", e, d)          # ... and then records e again (record 2)
        t0 = time.monotonic()
        for s in (a, b, d):
            c.sync(s)
        synced = time.monotonic() - t0
        print(json.dumps([synced, c.rc("cuEventQuery", e)]))
    """, timeout=20))
    synced, query = out
    assert synced < 5 and query == 0


def test_two_processes_never_overlap_on_one_device(spawn_py, sim_env, run_py):
    # Both run 5 x 60 ms on device 0 at once: the device serialises them (>= 600 ms);
    # on different devices they run side by side (~300 ms).
    body = """
        import json
        c = Cuda(); c.init(int(sys.argv[1]) if len(sys.argv) > 1 else {dev})
        print('ready', flush=True); os.read(0, 1)
        t0 = time.monotonic()
        for _ in range(5):
            c.kernel(60_000)
        c.sync()
        print(json.dumps(time.monotonic() - t0), flush=True)
    """
    for devs, low, high in [((0, 0), 0.6, 0.9), ((0, 1), 0.3, 0.55)]:
        procs = [spawn_py(body.format(dev=d)) for d in devs]
        t0 = time.monotonic()
        for p in procs:
            p.stdin.write("go")
            p.stdin.flush()
        for p in procs:
            p.stdin.close()
        times = [json.loads(p.stdout.readline()) for p in procs]
        wall = time.monotonic() - t0
        assert low <= wall < high, (devs, wall, times)


def busy_30_percent(spawn_py, sim_env, tmp_path, period_ms):
    """30 ms kernels with 70 ms gaps (~30 % busy) on device 0 for a second and on, NVML's sample
    periods `period_ms` for it and for every scenario run after."""
    (tmp_path / "sim.conf").write_text(f"util_period_ms = {period_ms}\n")
    sim_env["HAMI_SIM_CONFIG"] = str(tmp_path / "sim.conf")
    spawn_py("""
        c = Cuda(); c.init(0); print('ready', flush=True)
        while True:
            c.kernel(30_000); c.sync(); time.sleep(0.07)
    """)
    time.sleep(1.2)


def test_utilisation_comes_from_busy_time(spawn_py, run_py, sim_env, tmp_path):
    # the second device stays idle; NVML's periods of 100 ms: the last second's are all the loop's
    busy_30_percent(spawn_py, sim_env, tmp_path, 100)
    out = json.loads(run_py("""
        import json, pynvml
        pynvml.nvmlInit()
        h0, h1 = (pynvml.nvmlDeviceGetHandleByIndex(i) for i in (0, 1))
        samples = pynvml.nvmlDeviceGetProcessUtilization(h0, 0)
        latest = max(s.timeStamp for s in samples)
        try:
            pynvml.nvmlDeviceGetProcessUtilization(h0, latest + 10_000_000)
            later = "found"
        except pynvml.NVMLError as e:
            later = str(e)
        print(json.dumps([pynvml.nvmlDeviceGetUtilizationRates(h0).gpu, pynvml.nvmlDeviceGetUtilizationRates(h1).gpu,
                          [(s.pid, s.smUtil) for s in samples], abs(latest / 1e6 - time.time()), later]))
    """))
    util0, util1, samples, age, later = out
    assert 15 <= util0 <= 40 and util1 == 0
    assert len(samples) == 1 and 15 <= samples[0][1] <= 40
    assert age < 0.5          # stamped with the end of the newest period recorded
    assert later == "Not Found"


TIMING = """
    import json
    c = Cuda(); c.init(0)
    s = c.stream()
    ev = [c.event() for _ in range(6)]
    c.kernel(1000, s); c.sync(s)                     # the stream's thread started, the module loaded
    c.call("cuEventRecord", ev[0], s)                # an idle stream: read at once
    c.kernel({us}, s)
    c.call("cuEventRecord", ev[1], s)
    c.sync(s)
    t0 = time.monotonic()
    c.kernel(20_000, s)                              # the next ones queue behind it
    c.call("cuEventRecord", ev[2], s)
    for _ in range(4):                               # each starts where the last one ended
        c.kernel({us}, s)
    c.call("cuEventRecord", ev[3], s)
    c.sync(s)
    synced = time.monotonic() - t0
    time.sleep(0.01)                                 # the GPU idles: nothing of it is timed
    c.call("cuEventRecord", ev[4], s)
    c.kernel({us}, s)
    c.call("cuEventRecord", ev[5], s)
    c.sync(s)
    print(json.dumps([c.elapsed_ms(ev[0], ev[1]) * 1000, c.elapsed_ms(ev[2], ev[3]) * 1000, synced,
                      c.elapsed_ms(ev[4], ev[5]) * 1000]))
"""


@pytest.mark.parametrize("us", [10, 20, 50, 1000])
def test_events_read_the_gpu_timeline_not_the_stream_thread(run_py, us):
    """A kernel of N us occupies N us of its stream's timeline: events around queued kernels
    read exactly their time; around one launched on an idle stream, its time plus the launch's
    gap (the call's CPU time and dispatch: 3 + 10 us by default, and this script's own call); a
    synchronise returns once the timeline is done, late only by the OS's wake-up."""
    one, four, synced, again = json.loads(run_py(TIMING.format(us=us)))
    assert us + 13 <= one <= us + 500, one        # the gap: > the modelled 13 us, < a busy machine's
    assert abs(four - 4 * us) < 1, four            # back to back, whatever the thread's wake-ups
    assert 0.02 + 4 * us / 1e6 <= synced < 0.02 + 4 * us / 1e6 + 0.05, synced
    assert us + 13 <= again <= us + 500, again


DISPATCH = """
    import json, statistics
    c = Cuda(); c.init(0)
    s = c.stream()
    empty, fn = ctypes.c_void_p(), ctypes.c_void_p()
    c.call("cuModuleLoadData", ctypes.byref(empty), b"any image")
    c.call("cuModuleGetFunction", ctypes.byref(fn), empty, b"empty")
    zero = ctypes.c_uint64(0)
    no_time = (ctypes.c_void_p * 1)(ctypes.addressof(zero))
    start, end = c.event(), c.event()
    c.kernel(1000, s); c.sync(s)
    beyond = []
    for _ in range(41):
        time.sleep(0.001)                            # the GPU idles
        if {primed}:
            c.call("cuLaunchKernel", fn, 1, 1, 1, 1, 1, 1, 0, s, no_time, None)
        before = time.perf_counter()                 # the primer's call has returned ...
        c.call("cuEventRecord", start, s)
        if not {primed}:
            before = time.perf_counter()             # ... else the start event's record
        c.kernel(50, s)
        returned = time.perf_counter()
        c.call("cuEventRecord", end, s)
        c.sync(s)
        beyond.append(c.elapsed_ms(start, end) * 1000 - 50 - (returned - before) * 1e6)
    print(json.dumps(statistics.median(beyond)))
"""


@pytest.mark.parametrize("primed, dispatch_us", [(False, 10), (True, 0)], ids=["bare", "primed"])
def test_a_launch_is_dispatched_after_its_call_returned(run_py, primed, dispatch_us):
    """Events around a kernel launched on an idle stream read, beyond the kernel and the CPU
    time from the start event's record to the launch call's return, the GPU's dispatch of the
    launch (`dispatch_us`, 10: what a 50 us kernel on an H200 took beyond its call). An empty
    kernel launched first takes that dispatch before the start event is reached: then the
    events read only the kernel and the CPU time between the two launches' returns (what the
    SM limiter does with a throttled launch, libvgpu_src/sm_limiter.c)."""
    beyond = json.loads(run_py(DISPATCH.format(primed=primed)))
    assert abs(beyond - dispatch_us) < 3, beyond


def test_process_utilisation_is_recorded_per_period(spawn_py, run_py, sim_env, tmp_path):
    """NVML records each process's SM use per sample period, at the period's end: asked again
    with the stamp it gave, it has nothing new until the next period is recorded, and then
    gives exactly that period (200 ms here)."""
    busy_30_percent(spawn_py, sim_env, tmp_path, 200)
    out = json.loads(run_py("""
        import json, pynvml
        pynvml.nvmlInit()
        h = pynvml.nvmlDeviceGetHandleByIndex(0)
        first = pynvml.nvmlDeviceGetProcessUtilization(h, 0)[0]
        try:
            pynvml.nvmlDeviceGetProcessUtilization(h, first.timeStamp)
            again = "found"
        except pynvml.NVMLError as e:
            again = str(e)
        time.sleep(max(0.0, first.timeStamp / 1e6 + 0.3 - time.time()))   # mid-way through the period after
        nxt = pynvml.nvmlDeviceGetProcessUtilization(h, first.timeStamp)[0]
        print(json.dumps([first.smUtil, again, nxt.smUtil, nxt.timeStamp - first.timeStamp]))
    """))
    first, again, nxt, step_us = out
    assert 15 <= first <= 40 and again == "Not Found", out
    assert 5 <= nxt <= 60 and abs(step_us - 200_000) < 1000, out


def test_nvml_counts_a_launchs_dispatch_busy(run_py, sim_env, tmp_path):
    """NVML's utilisation counts the front end's work on a launch as busy, as it counts the
    kernel: on an H200, NVML read a process whose 50 us kernels ran 25 % of the time at the
    30 % its events measured (dispatch included), and its correction gave nothing back. With a
    200 us dispatch before each 200 us kernel on an idle stream, NVML reads about twice the
    kernels' own time."""
    conf = tmp_path / "sim.conf"
    conf.write_text("dispatch_us = 200\nutil_period_ms = 100\n")   # the last second's periods: the loop's
    out = json.loads(run_py("""
        import json, pynvml
        c = Cuda(); c.init(0)
        s = c.stream()
        c.kernel(200, s); c.sync(s)
        t0 = time.monotonic(); kernels = 0
        while time.monotonic() - t0 < 1.2:
            c.kernel(200, s); c.sync(s); kernels += 1
        own = kernels * 200e-6 / (time.monotonic() - t0) * 100
        pynvml.nvmlInit()
        h = pynvml.nvmlDeviceGetHandleByIndex(0)
        print(json.dumps([own, [s.smUtil for s in pynvml.nvmlDeviceGetProcessUtilization(h, 0)]]))
    """, env=dict(sim_env, HAMI_SIM_CONFIG=str(conf)), timeout=60))
    own, nvml = out
    assert len(nvml) == 1 and nvml[0] >= 1.6 * own, out


@pytest.mark.parametrize("how", ["stream", "graph"])
def test_a_host_function_holds_the_stream_timeline(run_py, how):
    """Work queued after a host function (cuLaunchHostFunc, or a graph's host node) starts
    once the function has returned: 20 ms of host time lie between the events around it."""
    ms = json.loads(run_py("""
        import json
        c = Cuda(); c.init(0); s = c.stream()
        a, b = c.event(), c.event()
        c.kernel(1000, s); c.sync(s)
        slow = ctypes.CFUNCTYPE(None, ctypes.c_void_p)(lambda _: time.sleep(0.02))
        graph, exec_ = ctypes.c_void_p(), ctypes.c_void_p()
        if "{how}" == "graph":
            c.call("cuStreamBeginCapture_v2", s, 2)          # relaxed
        else:
            c.call("cuEventRecord", a, s)
        c.call("cuLaunchHostFunc", s, slow, None)
        c.kernel(1000, s)
        if "{how}" == "graph":
            c.call("cuStreamEndCapture", s, ctypes.byref(graph))
            c.call("cuGraphInstantiateWithFlags", ctypes.byref(exec_), graph, ctypes.c_ulonglong(0))
            c.call("cuEventRecord", a, s)
            c.call("cuGraphLaunch", exec_, s)
        c.call("cuEventRecord", b, s)
        c.sync(s)
        print(json.dumps(c.elapsed_ms(a, b)))
    """.format(how=how)))
    assert 21 <= ms < 200, ms


def test_two_contexts_time_slice_a_long_kernel(spawn_py, run_py, sim_env, tmp_path):
    """Contexts share the GPU by time slices: a 6 ms kernel of one process, with another's 6 ms
    kernel ready 1 ms later, runs one slice (2 ms), yields a slice to the other, and so on
    (A 0-2, B 2-4, A 4-6, B 6-8, A 8-10, B 10-12 ms): each one's events span more than its own
    6 ms (serialised whole, the first would read 6 ms)."""
    body = """
        import json
        c = Cuda(); c.init(0); s = c.stream()
        a, b = c.event(), c.event()
        c.kernel(1000, s); c.sync(s)
        print('ready', flush=True); os.read(0, 1)
        time.sleep(float(sys.argv[1]) if len(sys.argv) > 1 else {delay})
        c.call("cuEventRecord", a, s); c.kernel(6000, s); c.call("cuEventRecord", b, s); c.sync(s)
        print(json.dumps(c.elapsed_ms(a, b)), flush=True)
    """
    procs = [spawn_py(body.format(delay=d)) for d in (0.0, 0.001)]
    for p in procs:
        p.stdin.write("go")
        p.stdin.flush()
        p.stdin.close()
    first, second = (json.loads(p.stdout.readline()) for p in procs)
    assert 7.5 < first < 12.5 and 7.5 < second < 12.5, (first, second)   # never more than both kernels


PREEMPTED = """
    import json
    c = Cuda(); c.init(0); s = c.stream()
    a, b = c.event(), c.event()
    c.kernel(1000, s); c.sync(s)
    print('ready', flush=True)
    spans, stop = [], time.monotonic() + 1.5
    while time.monotonic() < stop:
        c.call("cuEventRecord", a, s); c.kernel(1000, s); c.call("cuEventRecord", b, s); c.sync(s)
        spans.append(c.elapsed_ms(a, b))
    print(json.dumps(spans), flush=True)
"""

ARRIVING = """
    import json
    c = Cuda(); c.init(0); s = c.stream()
    a, b = c.event(), c.event()
    c.kernel(1000, s); c.sync(s)
    spans = []
    for _ in range(100):
        time.sleep(0.004)
        c.call("cuEventRecord", a, s); c.kernel(1000, s); c.call("cuEventRecord", b, s); c.sync(s)
        spans.append(c.elapsed_ms(a, b))
    print(json.dumps(spans))
"""


@pytest.mark.parametrize("timeslice_us, preempted", [(None, True), (0, False)])
def test_the_context_that_takes_the_engine_never_sees_its_wait(spawn_py, run_py, sim_env, tmp_path,
                                                                timeslice_us, preempted):
    """As on the H200 (sim_engine.c): one process keeps the GPU busy with 1 ms kernels, one at a
    time, its turn lasting across the gaps between them; another's 1 ms kernel, launched between
    events on an idle stream every few ms, takes the engine at once. Its events read its own
    kernel (its start event is reached when its context gets the engine); the preempted kernels'
    events take in its run (here about 90 of the 100). With `timeslice_us = 0` nothing is
    preempted: the newcomer's start event is reached when the busy one's kernel ends, and the busy
    one's events read the other's kernel only where its start event came first and its kernel
    second (0 to 12 here)."""
    env = dict(sim_env)
    if timeslice_us is not None:
        (tmp_path / "sim.conf").write_text(f"timeslice_us = {timeslice_us}\n")
        env["HAMI_SIM_CONFIG"] = str(tmp_path / "sim.conf")
    busy = spawn_py(PREEMPTED, env=env)
    arriving = sorted(json.loads(run_py(ARRIVING, env=env)))
    busy_spans = json.loads(busy.stdout.readline())
    stretched = sum(1 for ms in busy_spans if ms >= 1.8)
    assert arriving[len(arriving) // 2] < 1.1, arriving
    if preempted:
        assert stretched >= 30, sorted(busy_spans)[-120:]
    else:
        assert stretched <= 25, sorted(busy_spans)[-40:]


def test_every_launch_path_of_a_compiled_program(sim_env):
    import subprocess
    from tests.simgpu.conftest import SIM_TESTS
    proc = subprocess.run([SIM_TESTS / "sim_launch_paths"], env=sim_env, capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0, proc.stderr
    results = {line.split()[0]: line.split()[1:] for line in proc.stdout.splitlines()}
    expected_ms = {"plain": 30, "packed": 30, "per_thread": 30, "legacy": 30, "cooperative": 30, "launch_ex": 30,
                   "graph": 60, "cooperative_too_large": 0}
    for path, ms in expected_ms.items():
        code, took = results[path]
        assert code == ("720" if path == "cooperative_too_large" else "0"), path
        assert ms <= float(took) <= ms + 20, (path, took)
    assert results["graph_destroyed"] == ["400"] and results["unloaded"] == ["400"]
