"""Bad input: exit 1, one clear line naming the field and the value, the runc
JSON log line, and the state exactly as it was (one live GPU container in it)."""
import json
import os
import subprocess

import pytest

from .node import RUNC

GPU_UUID_UNKNOWN = "GPU-ffffffff-0000-0000-0000-000000000000"


def annotated(node, name, annotations, env=()):
    return node.bundle(name, annotations, env=env)


def raw_bundle(node, name, text):
    path = node.tmp / "bundles" / name
    path.mkdir(parents=True)
    (path / "config.json").write_text(text)
    return path


def config_with(node, name, **overrides):
    saved = node.config
    node.config = node.tmp / f"{name}.toml"
    node.write_config(**overrides)
    path, node.config = node.config, saved
    return path


CASES = [
    # (case id, how to make the bundle, container id, config overrides, expected field, value)
    ("mem-not-number", {"hami.io/gpumem": "3g"}, None, None, "hami.io/gpumem", "3g"),
    ("mem-negative", {"hami.io/gpumem": "-100"}, None, None, "hami.io/gpumem",
     "'-100': negative: must be in"),
    ("cores-out-of-range", {"hami.io/gpucores": "150"}, None, None, "hami.io/gpucores", "150"),
    ("gpu-zero", {"hami.io/gpu": "0"}, None, None, "hami.io/gpu", "0"),
    ("mem-too-big", {"hami.io/gpumem": "20000"}, None, None, "request", "hami.io/gpumem=20000"),
    ("unknown-uuid", {"hami.io/gpu-uuid": GPU_UUID_UNKNOWN, "hami.io/gpumem": "10"}, None, None,
     "hami.io/gpu-uuid", GPU_UUID_UNKNOWN),
    ("unknown-uuid-alone", {"hami.io/gpu-uuid": GPU_UUID_UNKNOWN}, None, None,
     "hami.io/gpu-uuid", GPU_UUID_UNKNOWN),
    ("unknown-uuid-alias", {"nvidia.com/gpu-uuid": GPU_UUID_UNKNOWN}, None, None,
     "nvidia.com/gpu-uuid", GPU_UUID_UNKNOWN),
    ("mem-trailing-newline", {"hami.io/gpumem": "100\n"}, None, None, "hami.io/gpumem", "100\\n"),
    ("mem-and-percentage", {"hami.io/gpumem": "10", "hami.io/gpumem-percentage": "10"}, None, None,
     "hami.io/gpumem-percentage", "10"),
    ("alias-conflict", {"hami.io/gpumem": "10", "nvidia.com/gpumem": "20"}, None, None,
     "nvidia.com/gpumem", "20"),
    ("bad-policy", {"hami.io/gpumem": "10", "hami.io/core-policy": "max"}, None, None,
     "hami.io/core-policy", "max"),
    ("bad-oversubscribe", {"hami.io/gpumem": "10", "hami.io/oversubscribe": "yes"}, None, None,
     "hami.io/oversubscribe", "yes"),
    ("ambiguous-decision", {"hami.io/vgpu-devices-allocated": "GPU-a,NVIDIA,1,1:;GPU-b,NVIDIA,1,1:;"},
     None, None, "hami.io/vgpu-devices-allocated", None),
    ("misspelt-key", {"hami.io/gpumemory": "100"}, None, None, "annotation",
     "'hami.io/gpumemory': not a request key of this runtime nor one HAMi's scheduler writes; "
     "the nearest is hami.io/gpumem"),
    ("misspelt-key-beside-a-request", {"hami.io/gpumem": "100", "hami.io/gpucore": "30"}, None, None,
     "annotation", "the nearest is hami.io/gpucores"),
    ("misspelt-container-key", {"hami.io/gpumem": "100", "app.hami.io/prioirty": "0"}, None, None,
     "annotation", "the nearest is app.hami.io/priority"),
    ("env-unknown-index", "env:NVIDIA_VISIBLE_DEVICES=7", None, None, "NVIDIA_VISIBLE_DEVICES", "7"),
    ("env-bad-mem", "env:HAMI_GPUMEM=lots", None, None, "HAMI_GPUMEM", "lots"),
    ("id-dotdot", {"hami.io/gpumem": "10"}, "../x", None, "container id", "../x"),
    ("id-slash", {"hami.io/gpumem": "10"}, "a/b", None, "container id", "a/b"),
    ("id-dot", {"hami.io/gpumem": "10"}, ".hidden", None, "container id", ".hidden"),
    ("id-in-use", {"hami.io/gpumem": "10"}, "live", None, "container id", "live"),
    ("id-exists-in-runc", {"hami.io/gpumem": "10"}, "plain-live", None, "container id", "plain-live"),
    ("malformed-config-json", "raw:{not json", None, None, "config.json", None),
    ("annotations-not-strings", 'raw:{"ociVersion":"1.0.2","annotations":{"hami.io/gpu":1}}',
     None, None, "config.json annotations", None),
    ("no-config-json", "raw:", None, None, "bundle", None),
    ("unreadable-config", {"hami.io/gpumem": "10"}, None, "missing", "HAMI_CONFIG", None),
    ("bad-config-value", {"hami.io/gpumem": "10"}, None, {"split_count": 0}, "config split_count", "0"),
    ("unknown-config-key", {"hami.io/gpumem": "10"}, None, {"colour": "red"}, "config colour", "red"),
    ("missing-runc", {"hami.io/gpumem": "10"}, None, {"runtime": ["/nonexistent/runc"]},
     "config runtime", "/nonexistent/runc"),
    ("missing-libvgpu", {"hami.io/gpumem": "10"}, None, {"libvgpu": "/nonexistent/libvgpu.so"},
     "config libvgpu", "/nonexistent/libvgpu.so"),
]


@pytest.fixture(scope="module")
def busy(module_node):
    """A node with one live GPU container, so 'unchanged' means something."""
    bundle = module_node.bundle("live", {"hami.io/gpumem": "1000"})
    proc = module_node.create("live", bundle)
    assert proc.returncode == 0, proc.stderr
    plain = module_node.bundle("plain-live")
    proc = subprocess.run([RUNC, "--root", str(module_node.runc_root), "create", "--bundle", str(plain),
                           "plain-live"], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                          stderr=subprocess.DEVNULL, timeout=60)
    assert proc.returncode == 0
    return module_node


def snapshot(node):
    files = {}
    for sub in ("containers", "private"):
        base = node.state_dir / sub
        for cid in sorted(os.listdir(base)):
            files[f"{sub}/{cid}"] = sorted(os.listdir(base / cid))
    return (node.state_dir / "allocations.json").read_bytes(), files, node.containers()


@pytest.mark.parametrize("case,make,cid,config,field,value", CASES, ids=[c[0] for c in CASES])
def test_bad_input(busy, case, make, cid, config, field, value):
    node = busy
    if isinstance(make, dict):
        bundle = annotated(node, case, make)
    elif make.startswith("env:"):
        bundle = annotated(node, case, None, env=[make[4:]])
    elif make == "raw:":
        bundle = node.tmp / "bundles" / case
        bundle.mkdir(parents=True)
    else:
        bundle = raw_bundle(node, case, make[4:])
    env = {}
    if config == "missing":
        env["HAMI_CONFIG"] = str(node.tmp / "no-such-config.toml")
    elif config:
        env["HAMI_CONFIG"] = str(config_with(node, case, **config))
    before = snapshot(node)
    log = node.tmp / "runc.log"
    log.write_text("")
    proc = node.create(cid or case, bundle, log_format="json", env=env)
    assert proc.returncode == 1
    lines = proc.stderr.splitlines()
    assert len(lines) == 1, proc.stderr
    assert field in lines[0] and (value is None or value in lines[0]), lines[0]
    [logged] = log.read_text().splitlines()
    entry = json.loads(logged)
    assert entry["level"] == "error" and field in entry["msg"] and entry["time"]
    assert snapshot(node) == before


def test_unexpected_failure_is_one_line(node, monkeypatch, capsys):
    """Whatever breaks inside create (here the region layer) still ends as one
    line and exit 1, with nothing left behind."""
    from hami_runtime import cli
    from hami_runtime.node import region

    def broken(*args, **kwargs):
        raise region.RegionError("disk on fire\nsecond line")

    monkeypatch.setattr(region, "write_new", broken)
    monkeypatch.setenv("HAMI_CONFIG", str(node.config))
    monkeypatch.setenv("HAMI_SIM_STATE", str(node.sim_state / "gpu.state"))
    bundle = node.bundle("boom", {"hami.io/gpumem": "10"})
    before = (bundle / "config.json").read_bytes()
    assert cli.main(["--root", str(node.runc_root), "create", "--bundle", str(bundle), "boom"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "RegionError: disk on fire second line" in err
    assert (bundle / "config.json").read_bytes() == before
    assert node.allocations() == {} and os.listdir(node.state_dir / "containers") == []


KNOWN_KEYS = [
    # annotations that are not a request and must not be refused as misspelt ones
    {"hami.io/allocation": "{}"},                                   # this runtime's own record
    {"hami.io/vgpu-node": "n1", "hami.io/bind-phase": "success", "hami.io/bind-time": "1",
     "hami.io/vgpu-time": "1", "hami.io/vgpu-devices-to-allocate": ";"},  # HAMi's scheduler
    {"hami.io/dcu-devices-allocated": ";", "hami.io/node-handshake": "x"},
    {"nvidia.com/gpumemory": "1", "example.com/gpumem": "1", "hamiXio/gpumem": "1"},  # not ours
    {"io.kubernetes.cri.container-type": "sandbox", "hami.io/gpumemory": "1"},  # a pod's sandbox
]


@pytest.mark.parametrize("annotations", KNOWN_KEYS)
def test_keys_that_are_not_misspelt_requests(annotations):
    from hami_runtime.lifecycle.request import request_keys
    found = request_keys.unknown_key(annotations)
    assert found is None or request_keys.is_pod_sandbox(annotations), found
