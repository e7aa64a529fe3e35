"""hami-runtime with real runc on the simulated GPU: what a GPU container gets,
what hamictl shows, and that delete frees everything."""
import json
import os
import re
import subprocess
import time

import jsonschema
import pytest

from tests.conftest import ROOT
from .node import CUDA_ALLOC

SCHEMAS = ROOT / "schemas"
GPU = {"hami.io/gpumem": "3000", "hami.io/gpucores": "30"}
CHECKS = ("test -c /dev/nvidia0 && echo DEV=ok; env; echo PRELOAD=$(cat /etc/ld.so.preload); "
          "test -f /.hami/libvgpu.so && cmp /.hami/libvgpu.so /usr/local/vgpu/libvgpu.so && echo LIB=ok; "
          "test -f $CUDA_DEVICE_MEMORY_SHARED_CACHE && echo REGION=ok")


def check_inside(output):
    lines = output.splitlines()
    for expected in ("DEV=ok", "CUDA_DEVICE_MEMORY_LIMIT_0=3000m", "CUDA_DEVICE_SM_LIMIT=30",
                     "LIB=ok", "PRELOAD=/.hami/libvgpu.so", "REGION=ok",
                     "CUDA_DEVICE_MEMORY_SHARED_CACHE=/.hami/shared/vgpu.region"):
        assert expected in lines, (expected, output)


def test_run_foreground_then_released(node):
    bundle = node.bundle("fg", GPU, args=("sh", "-c", CHECKS))
    proc = node.runtime("run", "--bundle", str(bundle), "fg")
    assert proc.returncode == 0, proc.stderr
    check_inside(proc.stdout)
    assert node.ps() == []  # runc run removed it: dead, not shown
    node.reconcile()  # the next create or delete frees it
    assert node.allocations() == {}
    assert os.listdir(node.state_dir / "containers") == []


def test_detached_container_shown_then_deleted(node):
    bundle = node.bundle("c1", GPU)
    proc = node.runtime("run", "--detach", "--bundle", str(bundle), "c1")
    assert proc.returncode == 0, proc.stderr
    inside = node.runtime("exec", "c1", "sh", "-c", CHECKS)
    assert inside.returncode == 0, inside.stderr
    check_inside(inside.stdout)
    [row] = node.ps()
    assert (row["container"], row["gpu"], row["memory_mib"], row["cores"]) == ("c1", 0, 3000, 30)
    assert row["pid"] > 0  # recorded by the createRuntime hook
    table = node.hamictl("ps").stdout
    assert "c1" in table and "3000MiB" in table
    gpus = json.loads(node.hamictl("gpus", "--json").stdout)
    assert (gpus[0]["slots_used"], gpus[0]["memory_allocated_mib"]) == (1, 3000)
    # The edited spec and the state file match their schemas.
    spec = json.loads((bundle / "config.json").read_text())
    jsonschema.validate(spec, json.loads((SCHEMAS / "oci-spec.schema.json").read_text()))
    jsonschema.validate(json.loads((node.state_dir / "allocations.json").read_text()),
                        json.loads((SCHEMAS / "state.schema.json").read_text()))
    assert node.runtime("delete", "--force", "c1").returncode == 0
    assert node.ps() == [] and node.containers() == []
    assert os.listdir(node.state_dir / "containers") == os.listdir(node.state_dir / "private") == []


@pytest.mark.parametrize("annotations,logged", [
    ({}, "no GPU request, passed through"),
    ({"hami.io/priority": "0"}, "passed through untouched: hami.io/priority ask(s) for no GPU"),
    ({"nvidia.com/core-policy": "force", "hami.io/use-gputype": "A100"},
     "passed through untouched: hami.io/use-gputype, nvidia.com/core-policy ask(s) for no GPU"),
])
def test_no_request_spec_untouched(node, annotations, logged):
    """A container that asks for no GPU runs with its spec byte for byte; keys
    that only shape a request say so in the runtime log."""
    log = node.tmp / "hami.log"
    node.write_config(log_file=str(log), log_level="debug")
    bundle = node.bundle("plain", annotations, args=("true",))
    before = (bundle / "config.json").read_bytes()
    proc = node.runtime("run", "--bundle", str(bundle), "plain")
    assert proc.returncode == 0, proc.stderr
    assert (bundle / "config.json").read_bytes() == before
    assert node.allocations() == {}
    assert f"plain: {logged}" in log.read_text()


@pytest.mark.skipif(not CUDA_ALLOC.exists(), reason="make sim builds the test program")
@pytest.mark.parametrize("uid", [0, 1000])
def test_full_chain_limit_enforced_in_container(node, uid):
    """annotation -> allocator -> spec -> libvgpu -> refusal past the limit,
    as root and as an unprivileged container user."""
    bundle = node.bundle("chain", GPU, args=("cuda_alloc", "1000", "1000", "1500", "500"))
    spec = json.loads((bundle / "config.json").read_text())
    spec["process"]["user"] = {"uid": uid, "gid": uid}
    (bundle / "config.json").write_text(json.dumps(spec))
    proc = node.runtime("run", "--bundle", str(bundle), "chain")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    results = [line.split() for line in proc.stdout.splitlines() if line.startswith("alloc ")]
    assert results[0] == ["alloc", "1000", "0"] and results[1] == ["alloc", "1000", "0"]
    assert results[2] == ["alloc", "1500", "2"]  # CUDA_ERROR_OUT_OF_MEMORY: past 3000 MiB
    assert "total 3000" in proc.stdout.splitlines()


@pytest.mark.parametrize("request_kind", ["env", "scheduler"])
def test_second_gpu_by_env_or_scheduler_decision(node, request_kind):
    gpus = json.loads(node.hamictl("gpus", "--json").stdout)
    uuid = gpus[1]["uuid"]
    if request_kind == "env":
        bundle = node.bundle("e", env=["NVIDIA_VISIBLE_DEVICES=1", "HAMI_GPUMEM=512"],
                             args=("sh", "-c", "ls /dev; env"))
    else:
        bundle = node.bundle("e", {"hami.io/vgpu-devices-allocated": f"{uuid},NVIDIA,512,20:;"},
                             args=("sh", "-c", "ls /dev; env"))
    proc = node.runtime("run", "--bundle", str(bundle), "e")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert "nvidia1" in lines and "nvidia0" not in lines
    assert f"NVIDIA_VISIBLE_DEVICES={uuid}" in lines and "CUDA_DEVICE_MEMORY_LIMIT_0=512m" in lines


def test_runtime_log_file(node):
    log = node.tmp / "hami.log"
    node.write_config(log_file=str(log), log_level="debug")
    bundle = node.bundle("logged", GPU, args=("true",))
    assert node.runtime("run", "--bundle", str(bundle), "logged").returncode == 0
    plain = node.bundle("unlogged", args=("true",))
    assert node.runtime("run", "--bundle", str(plain), "unlogged").returncode == 0
    text = log.read_text()
    assert "logged: allocated GPU 0 3000MiB 30%" in text
    assert "unlogged: no GPU request, passed through" in text


@pytest.mark.parametrize("annotations,policy", [
    (GPU, "force"),                                          # the node's
    ({**GPU, "hami.io/core-policy": "disable"}, "disable"),  # the request's
])
def test_node_core_policy_unless_the_request_names_one(node, annotations, policy):
    node.write_config(core_policy="force")
    bundle = node.bundle("pol", annotations, args=("env",))
    proc = node.runtime("run", "--bundle", str(bundle), "pol")
    assert proc.returncode == 0, proc.stderr
    assert f"GPU_CORE_UTILIZATION_POLICY={policy}" in proc.stdout.splitlines()


@pytest.mark.skipif(not CUDA_ALLOC.exists(), reason="make sim builds the test program")
def test_top_shows_the_host_pids_of_a_containers_processes(node):
    """The container counts its processes by its own pids; the host finds them in its
    namespace, and NVML on the host (the simulated driver, as a real one) names the
    same process by the same host pid."""
    bundle = node.bundle("seen", GPU, args=("cuda_alloc", "keep", "64", "20"))
    assert node.runtime("run", "--detach", "--bundle", str(bundle), "seen").returncode == 0
    shown = []
    deadline = time.monotonic() + 20
    while not shown and time.monotonic() < deadline:
        time.sleep(0.1)
        top = json.loads(node.hamictl("top", "--json", "--interval", "0").stdout)
        shown = [p for c in top["containers"] for p in c["processes"]]
    [proc] = shown
    [row] = node.ps()
    assert (proc["pid"], proc["host_pid"], proc["alive"]) == (1, row["pid"], True)
    smi = subprocess.run([str(node.sim_root / "bin" / "nvidia-smi")], capture_output=True, text=True,
                         env={**node.env, "LD_LIBRARY_PATH": str(node.sim_root / "lib")}, timeout=30)
    assert re.search(rf"^\|\s+0\s+{row['pid']}\s+C\s+cuda_alloc", smi.stdout, re.M), smi.stdout


def test_containers_starting_together_are_each_charged_their_own_context(node):
    """Three containers make their contexts at the same moment on one GPU, each
    creation taking 200 ms as a real driver's do: each is charged its own context
    once, not its neighbours' too (the driver's count names processes by host pid,
    which a container cannot see: the creations are serialised across containers,
    so each one sees only its own process appear)."""
    from hami_runtime.lifecycle.node_state import container_files, state_layout
    node.simulate(context_us=200000)
    context = 300 << 20  # the simulated driver's context_mib
    context_at = time.monotonic_ns() + int(2e9)
    cids = ("c0", "c1", "c2")
    procs = {cid: node.start_load(cid, {"hami.io/gpumem": "1000"}, 1.0, context_at + int(1e9),
                                  context_at=context_at) for cid in cids}
    charged = {}
    deadline = time.monotonic() + 20
    while len(charged) < len(cids) and time.monotonic() < deadline:
        time.sleep(0.1)
        for cid in cids:
            name = state_layout.alloc_name(str(node.runc_root), cid)
            try:
                with container_files.open_region(str(node.state_dir), name) as reg:
                    slots = reg.processes(1)
            except Exception:  # not made yet
                continue
            if slots and slots[0].devices[0].ctx_used:
                charged[cid] = [s.devices[0].ctx_used for s in slots]
    for cid, proc in procs.items():
        node.load_result(cid, proc)
    assert charged == {cid: [context] for cid in cids}
