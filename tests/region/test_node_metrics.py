"""The node seen whole through `hamictl metrics`, on the simulated GPU: two
containers on one card and a process of no slice holding memory, scraped over
HTTP and read with prometheus-client's own text parser; a scrape while the
driver hangs; the views top and gpus show."""
import json
import re
import os
import subprocess
import sys
import time
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from hami_runtime.files import process_start
from hami_runtime.lifecycle.node_state.state_layout import alloc_name, root_key
from hami_runtime.node import region
from hami_runtime.node.region import DeviceLimit
from hami_runtime.tools import node_view
from tests.conftest import BUILD, ROOT, SIM_LIB
from tests.region.fakes import fake_process, make_container

MiB = 1024 * 1024
CONTEXT_MIB = 300  # the simulator's context_mib
UUID0 = "GPU-453c5d90-9eaf-43fa-be71-c8ae8fc44d65"  # the simulator's card 0
MODEL = "HAMi Simulated GPU"
K8S = "/run/containerd/runc/k8s.io"
MOBY = "/run/docker/runtime-runc/moby"
CID_A, CID_B = "a" * 64, "b" * 64
NAME_A, NAME_B = alloc_name(K8S, CID_A), alloc_name(MOBY, CID_B)
# A pod annotation may say anything: quotes, backslashes, newlines, any length.
ODD_NAME = 'train "big"\\\n' + "x" * 400
CUDA_ALLOC = BUILD / "runtime-tests" / "cuda_alloc"

A_IDENTITY = {"io.kubernetes.cri.sandbox-namespace": "ml",
              "io.kubernetes.cri.sandbox-name": "trainer-0",
              "io.kubernetes.cri.container-name": ODD_NAME}
B_IDENTITY = {}


def entry(cid, root, mem_mib, cores, identity, request, pid=0):
    me = os.getpid()
    return {"id": cid, "runc_root": root, "bundle": f"/bundles/{cid[:8]}",
            "devices": [{"index": 0, "uuid": UUID0, "mem_mib": mem_mib, "cores": cores}],
            "core_policy": "default", "priority": 1, "oversubscribe": True,
            "identity": identity, "request": request, "created_at": 0.0, "pid": pid,
            "creator": {"pid": me, "start": process_start(me)}}  # alive while the test runs


def write_allocations(state_dir, entries, invalid=None):
    (state_dir / "allocations.json").write_text(json.dumps(
        {"version": 2, "allocations": entries, "invalid": invalid or {}}))


def owner_of(host_pid):
    """A slot's owner for a process of the host's pid namespace (its pid there is its host pid)."""
    return (host_pid << 32) | (region.process_start_ticks(host_pid) & 0xFFFFFFFF)


@pytest.fixture
def sim_env(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HAMI_", "LD_", "CUDA_", "NODE_"))}
    env.update(HAMI_SIM_STATE=str(tmp_path / "sim.state"), LD_LIBRARY_PATH=str(SIM_LIB))
    return env


@pytest.fixture
def holders(tmp_path, sim_env):
    """Starts processes that allocate on card 0 and hold it until the test ends;
    hold(MiB) -> its pid, once the memory is held."""
    if not CUDA_ALLOC.exists():
        pytest.fail(f"{CUDA_ALLOC} is missing: run `make sim build/runtime-tests/cuda_alloc`")
    release, procs = tmp_path / "release", []

    def hold(mib):
        proc = subprocess.Popen([str(CUDA_ALLOC), str(mib), f"@{release}"], env=sim_env,
                                stdout=subprocess.PIPE, text=True)
        procs.append(proc)
        for line in proc.stdout:
            if line.startswith("alloc"):
                assert line.split() == ["alloc", str(mib), "0"], line
                return proc.pid
        raise AssertionError(f"cuda_alloc {mib} ended: {proc.wait()}")

    yield hold
    release.touch()
    for proc in procs:
        proc.wait(timeout=30)
        proc.stdout.close()


@pytest.fixture
def node(tmp_path, holders):
    """Two containers on card 0, each with one process charging its slice (A: a
    pod's, from annotations, 2048 MiB 30 %; B: dockerd's, from env, 1024 MiB, no
    SM limit), and one process started on the host holding 1024 MiB outside both."""
    state = tmp_path / "state"
    state.mkdir()
    pids = {"a": holders(512), "b": holders(256), "outside": holders(1024)}
    for name, limit, pid, mib in ((NAME_A, DeviceLimit(UUID0, 2048 * MiB, 30), pids["a"], 512),
                                  (NAME_B, DeviceLimit(UUID0, 1024 * MiB, 0), pids["b"], 256)):
        path = make_container(state, name, [limit])
        (state / "private" / name / "pid").write_text(f"{pid}\n")
        fake_process(path, 0, pid=pid, owner=owner_of(pid),
                     usage={0: ((mib + CONTEXT_MIB) * MiB, CONTEXT_MIB * MiB, 0, 0)})
    write_allocations(state, {
        NAME_A: entry(CID_A, K8S, 2048, 30, A_IDENTITY, {"hami.io/gpumem": "2048", "hami.io/gpucores": "30"}),
        NAME_B: entry(CID_B, MOBY, 1024, 0, B_IDENTITY, {"NVIDIA_VISIBLE_DEVICES": "0", "HAMI_GPUMEM": "1024"}),
    })
    config = tmp_path / "hami.toml"
    config.write_text(f'state_dir = "{state}"\nnvml_library = "{SIM_LIB / "libnvidia-ml.so.1"}"\n'
                      'split_count = 4\nmemory_scaling = 1.5\npolicy = "spread"\n')
    return {"state": state, "config": config, "pids": pids}


class Server:
    """`hamictl metrics` in a process of its own, as an operator runs it (the
    simulated driver is never loaded into pytest)."""

    def __init__(self, config, env, *args):
        env = dict(env, HAMI_CONFIG=str(config))
        self.proc = subprocess.Popen(
            [sys.executable, "-c", "import sys; from hami_runtime.tools.hamictl import main; sys.exit(main())",
             "metrics", "--listen", "127.0.0.1:0", "--node-name", "node-1", *args],
            cwd=ROOT, env=env, stderr=subprocess.PIPE, text=True)
        line = self.proc.stderr.readline()
        assert line.startswith("serving http://127.0.0.1:"), line + self.proc.stderr.read()
        self.url = line.split()[1]

    def scrape(self, timeout=5):
        started = time.monotonic()
        with urllib.request.urlopen(self.url, timeout=timeout) as response:
            text = response.read().decode()
        return text, time.monotonic() - started

    def stop(self):
        self.proc.terminate()
        self.proc.wait(timeout=10)
        self.proc.stderr.close()


@pytest.fixture
def serve(sim_env):
    servers = []

    def start(config, *args, env=None):
        servers.append(Server(config, env or sim_env, *args))
        return servers[-1]

    yield start
    for server in servers:
        server.stop()


def samples(text):
    """{(name, frozenset(labels)): value}, parsed by prometheus-client."""
    found = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            key = (s.name, frozenset(s.labels.items()))
            assert key not in found, f"duplicate series {key}"
            found[key] = s.value
    return found


def series(found, name):
    """[(labels, value)] of one metric name."""
    return sorted(((dict(labels), value) for (n, labels), value in found.items() if n == name),
                  key=lambda item: sorted(item[0].items()))


NODE = {"node": "node-1"}  # --node-name, on every series
GPU0 = NODE | {"gpu": "0", "uuid": UUID0, "model": MODEL}
CARD_MIB = 16384
USED_MIB = {"a": 512 + CONTEXT_MIB, "b": 256 + CONTEXT_MIB, "outside": 1024 + CONTEXT_MIB}
A_LABELS = NODE | {"container": CID_A, "root": root_key(K8S), "pod_namespace": "ml", "pod_name": "trainer-0",
            "container_name": ODD_NAME[:node_view.MAX_LABEL], "request_source": "annotation"}
B_LABELS = NODE | {"container": CID_B, "root": root_key(MOBY), "pod_namespace": "", "pod_name": "",
            "container_name": "", "request_source": "env"}

# Every per-GPU series of card 0: name -> value.
GPU_SERIES = {
    "hami_gpu_memory_physical_bytes": CARD_MIB * MiB,
    "hami_gpu_memory_capacity_bytes": int(CARD_MIB * 1.5) * MiB,
    "hami_gpu_cores_capacity_percent": 100,
    "hami_gpu_slots": 4,
    "hami_gpu_memory_promised_bytes": 3072 * MiB,
    "hami_gpu_cores_promised_percent": 30,
    "hami_gpu_containers": 2,
    "hami_gpu_invalid_entries": 0,
    "hami_gpu_allocator_readable": 1,
    "hami_gpu_driver_read": 1,
    "hami_gpu_driver_memory_used_bytes": sum(USED_MIB.values()) * MiB,
    "hami_gpu_driver_utilization_percent": 0,
    "hami_gpu_memory_outside_slices_bytes": USED_MIB["outside"] * MiB,
    "hami_gpu_processes_outside_slices": 1,
}
# Every container series: name -> {container: value} (device 0).
CONTAINER_SERIES = {
    "hami_container_memory_used_bytes": {CID_A: USED_MIB["a"] * MiB, CID_B: USED_MIB["b"] * MiB},
    "hami_container_memory_limit_bytes": {CID_A: 2048 * MiB, CID_B: 1024 * MiB},
    "hami_container_sm_limit_percent": {CID_A: 30, CID_B: 0},
    "hami_container_sm_busy_seconds_total": {CID_A: 0, CID_B: 0},
    "hami_container_sm_throttled_seconds_total": {CID_A: 0, CID_B: 0},
    "hami_container_sm_paused_seconds_total": {CID_A: 0, CID_B: 0},
    "hami_container_processes": {CID_A: 1, CID_B: 1},
}


def test_scrape_shows_each_gpu_and_container_with_its_pod(node, serve):
    server = serve(node["config"])
    text, took = server.scrape()
    found = samples(text)
    for name, value in GPU_SERIES.items():
        assert [s for s in series(found, name) if s[0]["gpu"] == "0"] == [(GPU0, value)], name
    # card 1: nothing promised, nothing in use
    gpu1 = [labels for labels, _ in series(found, "hami_gpu_driver_read") if labels["gpu"] == "1"]
    assert len(gpu1) == 1 and gpu1[0]["model"] == MODEL
    for name, value in (("hami_gpu_memory_promised_bytes", 0), ("hami_gpu_containers", 0),
                        ("hami_gpu_memory_outside_slices_bytes", 0), ("hami_gpu_driver_read", 1)):
        assert [v for labels, v in series(found, name) if labels["gpu"] == "1"] == [value], name
    assert series(found, "hami_gpu_info") == [
        (GPU0 | {"parent": "", "mig_mode": "0"}, 1), (gpu1[0] | {"parent": "", "mig_mode": "0"}, 1)]
    for name, values in CONTAINER_SERIES.items():
        assert series(found, name) == [(A_LABELS | {"device": "0", "uuid": UUID0}, values[CID_A]),
                                       (B_LABELS | {"device": "0", "uuid": UUID0}, values[CID_B])], name
    assert series(found, "hami_container_region_readable") == [(A_LABELS, 1), (B_LABELS, 1)]
    assert series(found, "hami_container_info") == [
        (A_LABELS | {"runc_root": K8S, "core_policy": "default", "priority": "1"}, 1),
        (B_LABELS | {"runc_root": MOBY, "core_policy": "default", "priority": "1"}, 1)]
    assert series(found, "hami_node_memory_scaling") == [(NODE, 1.5)]
    assert series(found, "hami_node_info") == [(NODE | {"policy": "spread", "core_policy": "default"}, 1)]
    assert took < 1, took


# HAMi's names of the same figures, older and current labels: name -> (labels, value) of card 0.
HAMI_GPU_OLD = NODE | {"nodeid": "node-1", "deviceuuid": UUID0, "deviceidx": "0", "devicetype": f"NVIDIA-{MODEL}"}
HAMI_GPU_NEW = {"node": "node-1", "device_uuid": UUID0, "device_index": "0", "device_type": f"NVIDIA-{MODEL}"}
HAMI_GPU_SERIES = [
    ("HostGPUMemoryUsage", "hami_host_gpu_memory_used_bytes", {}, {}, sum(USED_MIB.values()) * MiB),
    ("HostCoreUtilization", "hami_host_gpu_utilization_ratio", {}, {}, 0),
    ("GPUDeviceMemoryLimit", "hami_gpu_memory_limit_bytes", {}, {}, int(CARD_MIB * 1.5) * MiB),
    ("GPUDeviceCoreLimit", "hami_gpu_core_limit_ratio", {}, {}, 100),
    ("GPUDeviceMemoryAllocated", "hami_gpu_memory_allocated_bytes", {"devicecores": "100"},
     {"device_cores": "100"}, 3072 * MiB),
    ("GPUDeviceSharedNum", "hami_gpu_shared_count", {}, {}, 2),
    ("GPUDeviceCoreAllocated", "hami_gpu_core_allocated_ratio", {}, {}, 30),
    ("nodeGPUOverview", "hami_node_gpu_overview", {"devicecores": "100", "devicememorylimit": "24576"},
     {"device_cores": "100", "device_memory_limit": "24576"}, 3072 * MiB),
    ("nodeGPUMemoryPercentage", "hami_node_gpu_memory_allocated_ratio", {}, {}, 3072 / 24576),
]
NO_DEVICE_TYPE = {"nodeGPUMemoryPercentage"}  # as HAMi's own: node, uuid and index only


@pytest.mark.parametrize("old,new,old_extra,new_extra,value", HAMI_GPU_SERIES,
                         ids=[row[0] for row in HAMI_GPU_SERIES])
def test_hami_gpu_names(node, serve, old, new, old_extra, new_extra, value):
    found = samples(serve(node["config"]).scrape()[0])
    old_labels, new_labels = HAMI_GPU_OLD | old_extra, HAMI_GPU_NEW | new_extra
    if old in NO_DEVICE_TYPE:
        del old_labels["devicetype"], new_labels["device_type"]
    assert [s for s in series(found, old) if s[0]["deviceuuid"] == UUID0] == [
        (old_labels, pytest.approx(value))]
    assert [s for s in series(found, new) if s[0]["device_uuid"] == UUID0] == [
        (new_labels, pytest.approx(value))]


def test_hami_container_names(node, serve):
    found = samples(serve(node["config"]).scrape()[0])
    for old, new, values in (("vGPU_device_memory_usage_in_bytes", "hami_vgpu_memory_used_bytes",
                              CONTAINER_SERIES["hami_container_memory_used_bytes"]),
                             ("vGPU_device_memory_limit_in_bytes", "hami_vgpu_memory_limit_bytes",
                              CONTAINER_SERIES["hami_container_memory_limit_bytes"])):
        assert series(found, old) == sorted([
            (NODE | {"podnamespace": "ml", "podname": "trainer-0", "ctrname": A_LABELS["container_name"],
              "vdeviceid": "0", "deviceuuid": UUID0, "container_id": CID_A, "root": root_key(K8S)},
             values[CID_A]),
            (NODE | {"podnamespace": "", "podname": "", "ctrname": "", "vdeviceid": "0", "deviceuuid": UUID0,
              "container_id": CID_B, "root": root_key(MOBY)}, values[CID_B])],
            key=lambda item: sorted(item[0].items()))
        assert sorted((labels["container_id"], v) for labels, v in series(found, new)) == \
            sorted((labels["container_id"], v) for labels, v in series(found, old))
        assert {labels["container"] for labels, _ in series(found, new)} == {A_LABELS["container_name"], ""}


def test_no_hami_names(node, serve):
    found = samples(serve(node["config"], "--no-hami-names").scrape()[0])
    names = {name for name, _ in found}
    hami = {name for row in HAMI_GPU_SERIES for name in row[:2]} | {
        "vGPU_device_memory_usage_in_bytes", "hami_vgpu_memory_used_bytes"}
    assert not names & hami
    assert "hami_gpu_driver_read" in names


def test_label_escaped_and_cut(node, serve):
    """A pod annotation's quotes, backslash and newline are escaped as the text
    format asks; a value past MAX_LABEL is cut, its series kept."""
    text, _ = serve(node["config"]).scrape()
    line = next(line for line in text.splitlines() if line.startswith("hami_container_memory_limit_bytes{")
                and CID_A in line)
    assert 'container_name="train \\"big\\"\\\\\\n' in line, line
    assert len(A_LABELS["container_name"]) == node_view.MAX_LABEL


def test_scrape_answers_while_the_driver_hangs(node, serve, sim_env, tmp_path):
    """NVML's memory query sleeps 30 s: the scrape answers within a second, says the
    driver was not read, and keeps the allocator's figures and the containers'."""
    hung = tmp_path / "hung.conf"
    hung.write_text("nvml_memory_info_us = 30000000\n")
    server = serve(node["config"], env=dict(sim_env, HAMI_SIM_CONFIG=str(hung)))
    for _ in range(2):  # the second finds the first read still stuck
        text, took = server.scrape()
        assert took < 1, took
        found = samples(text)
        gpu0 = NODE | {"gpu": "0", "uuid": UUID0, "model": ""}  # the driver never named it
        assert series(found, "hami_gpu_driver_read") == [(gpu0, 0)]
        assert series(found, "hami_gpu_memory_promised_bytes") == [(gpu0, 3072 * MiB)]
        assert series(found, "hami_gpu_containers") == [(gpu0, 2)]
        assert series(found, "hami_gpu_driver_memory_used_bytes") == []
        assert series(found, "hami_gpu_memory_outside_slices_bytes") == []
        assert [v for _, v in series(found, "hami_container_memory_used_bytes")] == [
            USED_MIB["a"] * MiB, USED_MIB["b"] * MiB]


def test_unreadable_allocator_state_is_an_error_series(node, serve):
    (node["state"] / "allocations.json").write_text("{not json")
    text, took = serve(node["config"]).scrape()
    found = samples(text)
    assert took < 1
    assert [(labels["gpu"], v) for labels, v in series(found, "hami_gpu_allocator_readable")] == [
        ("0", 0), ("1", 0)]
    assert series(found, "hami_gpu_memory_promised_bytes") == []
    assert series(found, "GPUDeviceMemoryAllocated") == []
    # the driver's figures and the regions are still there
    assert series(found, "hami_gpu_driver_read")[0][1] == 1
    assert len(series(found, "hami_container_memory_used_bytes")) == 2


def test_unreadable_region_is_that_containers_error(node, serve):
    os.truncate(node["state"] / "containers" / NAME_B / region.REGION_FILE_NAME, 10)
    found = samples(serve(node["config"]).scrape()[0])
    assert series(found, "hami_container_region_readable") == [(A_LABELS, 1), (B_LABELS, 0)]
    assert [labels["container"] for labels, _ in series(found, "hami_container_memory_used_bytes")] == [CID_A]
    # B's process is still its container's first one (the pid the hook recorded): not outside
    assert series(found, "hami_gpu_memory_outside_slices_bytes")[0] == (GPU0, USED_MIB["outside"] * MiB)


def hamictl(node, env, *args):
    result = subprocess.run(
        [sys.executable, "-c", "import sys; from hami_runtime.tools.hamictl import main; sys.exit(main())",
         *args], cwd=ROOT, env=dict(env, HAMI_CONFIG=str(node["config"])), capture_output=True,
        text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_top_and_gpus_show_the_same_figures(node, sim_env):
    top = json.loads(hamictl(node, sim_env, "top", "--interval", "0", "--json"))
    gpus = json.loads(hamictl(node, sim_env, "gpus", "--json"))
    seen_by_top = next(g for g in top["gpus"] if g["uuid"] == UUID0)
    seen_by_gpus = next(g for g in gpus if g["uuid"] == UUID0)
    used, outside = sum(USED_MIB.values()), USED_MIB["outside"]
    assert (seen_by_top["driver_used_bytes"], seen_by_top["outside_bytes"], seen_by_top["outside_pids"],
            seen_by_top["memory_promised_bytes"], seen_by_top["cores_promised_pct"],
            seen_by_top["containers"], seen_by_top["slots"], seen_by_top["driver_read"]) == (
        used * MiB, outside * MiB, [node["pids"]["outside"]], 3072 * MiB, 30, 2, 4, True)
    assert (seen_by_gpus["driver_memory_used_mib"], seen_by_gpus["memory_outside_mib"],
            seen_by_gpus["outside_pids"], seen_by_gpus["memory_allocated_mib"],
            seen_by_gpus["cores_allocated"], seen_by_gpus["slots_used"], seen_by_gpus["slots"],
            seen_by_gpus["driver_read"]) == (used, outside, [node["pids"]["outside"]], 3072, 30, 2, 4, True)
    holders = [(h["id"], h["pod_namespace"], h["pod_name"], h["container_name"], h["request_source"],
                h["memory_mib"], h["cores"]) for h in seen_by_top["holders"]]
    assert holders == [(CID_A, "ml", "trainer-0", A_LABELS["container_name"], "annotation", 2048, 30),
                       (CID_B, "", "", "", "env", 1024, 0)]
    assert [(h["id"], h["pod_name"], h["request_source"]) for h in seen_by_gpus["containers"]] == [
        (h[0], h[2], h[4]) for h in holders]
    assert {c["id"]: (c["pod_namespace"], c["pod_name"], c["container_name"], c["request_source"])
            for c in top["containers"]} == {CID_A: ("ml", "trainer-0", A_LABELS["container_name"], "annotation"),
                                            CID_B: ("", "", "", "env")}


def test_top_and_gpus_tables(node, sim_env):
    shown_name = "ml/trainer-0/" + A_LABELS["container_name"].replace("\n", "?")
    table = hamictl(node, sim_env, "top", "--interval", "0")
    assert re.search(rf"^0\s+{UUID0}\s+{MODEL}\s+{sum(USED_MIB.values())} / 3072 / 24576\s+1324 \(pid {node['pids']['outside']}\)"
                     r"\s+0%\s+30%\s+2/4$", table, re.M), table
    assert re.search(rf"^aaaaaaaaaaaa\s.*\s1\s+{re.escape(shown_name)}$", table, re.M), table
    assert re.search(r"^bbbbbbbbbbbb\s.*\s1\s+-$", table, re.M), table
    table = hamictl(node, sim_env, "gpus")
    assert re.search(rf"^0\s+{UUID0}\s+{MODEL}\s+16384MiB\s+2/4\s+3072/24576MiB\s+30%\s+{sum(USED_MIB.values())}MiB\s+1324MiB\s+0%$",
                     table, re.M), table
    assert f"GPU 0: aaaaaaaaaaaa {shown_name} 2048MiB 30% (request from annotation)" in table
    assert "GPU 0: bbbbbbbbbbbb - 1024MiB 0% (request from env)" in table
    assert f"GPU 0: 1324MiB held outside every slice by pid {node['pids']['outside']}" in table


DASHBOARD = ROOT / "examples" / "grafana" / "hami-node.json"
PROMQL_WORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "and", "or",
                "unless", "offset"}


def dashboard_queries(dashboard):
    for panel in dashboard["panels"]:
        for target in panel.get("targets", ()):
            yield target["expr"]
    for variable in dashboard["templating"]["list"]:
        if isinstance(variable.get("query"), dict):
            yield variable["query"]["query"]


def metric_names(expr):
    """The metric names a PromQL expression (or a Grafana label_values query) reads."""
    expr = re.sub(r"^label_values\((.*),\s*\w+\)$", r"\1", expr)
    expr = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    expr = re.sub(r"\{[^}]*\}|\[[^\]]*\]", "", expr)
    expr = re.sub(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", "", expr)
    return {m.group(1) for m in re.finditer(r"([A-Za-z_:][\w:]*)\s*(\()?", expr)
            if not m.group(2) and m.group(1) not in PROMQL_WORDS}


@pytest.mark.parametrize("expr,names", [
    ('hami_gpu_slots{instance=~"$instance"}', {"hami_gpu_slots"}),
    ('sum by (instance, uuid) (rate(a_total{x="y"}[$__rate_interval])) * 100', {"a_total"}),
    ('a / on(uuid) group_left(model) b > 0 < 100', {"a", "b"}),
    ('count by (i) (a == 0) or on(i) (0 * count by (i) (b))', {"a", "b"}),
    ('label_values(hami_gpu_info{instance=~"$instance"}, uuid)', {"hami_gpu_info"}),
])
def test_metric_names_of_a_query(expr, names):
    assert metric_names(expr) == names


def test_dashboard_reads_only_exported_series(node, serve):
    """Every query of the example dashboard reads series `hamictl metrics` exports."""
    dashboard = json.loads(DASHBOARD.read_text())
    panels = [p for p in dashboard["panels"] if p["type"] != "row"]
    assert panels and all(p.get("targets") for p in panels)
    exported = {name for name, _ in samples(serve(node["config"]).scrape()[0])}
    read = set()
    for expr in dashboard_queries(dashboard):
        names = metric_names(expr)
        assert names, expr
        assert names <= exported, (expr, names - exported)
        read |= names
    # the dashboard shows promised, used and physical per GPU, and use against limits per container
    assert {"hami_gpu_memory_promised_bytes", "hami_gpu_driver_memory_used_bytes",
            "hami_gpu_memory_physical_bytes", "hami_container_memory_used_bytes",
            "hami_container_memory_limit_bytes", "hami_container_sm_limit_percent",
            "hami_container_sm_throttled_seconds_total", "hami_container_sm_paused_seconds_total"} <= read


OTHER_SERIES = {"hami_container_region_readable", "hami_container_info", "hami_gpu_info",
                "hami_node_memory_scaling", "hami_node_info"}


def test_every_series_is_checked_here_and_documented(node, serve):
    """What a scrape exports is what these tests check, and docs/operations.md names each."""
    exported = {name for name, _ in samples(serve(node["config"]).scrape()[0])}
    hami = {name for row in HAMI_GPU_SERIES for name in row[:2]} | {
        "vGPU_device_memory_usage_in_bytes", "hami_vgpu_memory_used_bytes",
        "vGPU_device_memory_limit_in_bytes", "hami_vgpu_memory_limit_bytes"}
    assert exported == set(GPU_SERIES) | set(CONTAINER_SERIES) | OTHER_SERIES | hami
    docs = (ROOT / "docs" / "operations.md").read_text()
    assert [name for name in sorted(exported) if f"`{name}" not in docs] == []


def test_a_container_cannot_claim_a_host_process(node, serve):
    """B's region names the host process's pid as one of its own (a slot's host_pid is
    the container's word): the host matches pids in B's pid namespace, so the
    process stays outside every slice."""
    fake_process(node["state"] / "containers" / NAME_B / region.REGION_FILE_NAME, 5, pid=77,
                 host_pid=node["pids"]["outside"], usage={0: (2 * MiB, 0, 0, 0)})
    found = samples(serve(node["config"]).scrape()[0])
    assert series(found, "hami_gpu_memory_outside_slices_bytes")[0] == (GPU0, USED_MIB["outside"] * MiB)
    assert series(found, "hami_gpu_processes_outside_slices")[0] == (GPU0, 1)
