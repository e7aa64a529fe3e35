"""The launcher's fast path (spec_scan.c): a create or run whose spec surely asks
for no GPU is runc's at once; any spec that asks, or that the launcher cannot
read exactly as Python's json does, goes to the Python runtime. Through the
real launcher with real runc: the node's log (level debug) gets a line from
every create Python handles, and Python's refusals start "hami-runtime:"."""
import json
import os
import subprocess
import time

import pytest

from hami_runtime.lifecycle.request import docker_gpus, launcher_keys, request_keys
from tests.conftest import BUILD

from .node import LAUNCHER, RUNC

pytestmark = pytest.mark.skipif(not LAUNCHER.exists(), reason="make build builds the launcher")

# Every key the request parser reads, and then some that it does not.
PY_KEYS = ([p + k for p in request_keys.PREFIXES for k in request_keys.KEYS]
           + [f"main{request_keys.CONTAINER_DOMAIN}/{k}" for k in request_keys.CONTAINER_KEYS]
           + [request_keys.CDI_ANNOTATION_PREFIX + "vendor", request_keys.CDI_ANNOTATION_PREFIX])
OTHER_KEYS = ["hami.io/unknown", "HAMI.IO/gpu", "x.hami.io/gpu", "nvidia.com", "cdi.k8s.io",
              "io.kubernetes.cri.container-type", "example.com/hami.io/gpu", "hami.io", "gpu"]


@pytest.mark.parametrize("key", PY_KEYS + OTHER_KEYS)
def test_every_request_key_is_a_mark(key):
    """Whatever key the Python side reads as a request, the launcher sends to Python."""
    if request_keys.split_key(key) or request_keys.is_cdi_key(key):
        assert launcher_keys.covers_annotation(key)
        assert request_keys.mentions_request({key: "1"}, [], True)
    if request_keys.unknown_key({key: "1"}):  # a misspelt request: Python refuses it
        assert launcher_keys.covers_annotation(key)


@pytest.mark.parametrize("name", (request_keys.VISIBLE,) + request_keys.ENV_KEYS
                         + ("NVIDIA_DRIVER_CAPABILITIES", "NVIDIA_REQUIRE_CUDA", "nvidia_visible_devices"))
def test_every_env_request_is_a_prefix(name):
    assert launcher_keys.covers_env(f"{name}=0") and launcher_keys.covers_env(name)


def test_every_gpu_hook_is_named():
    for name in docker_gpus.HOOK_NAMES:
        assert docker_gpus.is_gpu_hook({"path": f"/usr/bin/{name}", "args": [name, "prestart"]})
        assert name in launcher_keys.c_header()


def test_the_header_is_the_python_sides():
    header = BUILD / "launcher" / "spec_keys.h"
    if not header.exists():
        pytest.skip("make build writes it")
    assert header.read_text() == launcher_keys.c_header()


def dumps(spec) -> bytes:
    return json.dumps(spec).encode()


def with_annotations(annotations):
    return lambda s: dumps({**s, "annotations": annotations})


def with_env(*entries):
    return lambda s: dumps({**s, "process": {**s["process"], "env": s["process"]["env"] + list(entries)}})


def with_hook(hook):
    return lambda s: dumps({**s, "hooks": {"prestart": [hook]}})


def raw(text_of):
    """The spec's JSON text, changed by text_of(text) (escapes, duplicates, breakage)."""
    return lambda s: text_of(json.dumps(s)).encode()


def nested(depth):
    return lambda s: json.dumps(s)[:-1].encode() + b', "x-deep": ' + b"[" * depth + b"]" * depth + b"}"


RUNC_CASES = [
    # (case, spec from the template, extra argv before the id, expected: "runc" or "python")
    ("plain", dumps, ()),
    ("key-names-in-values", with_annotations({"note": "hami.io/gpu=1 nvidia.com/gpu NVIDIA_VISIBLE_DEVICES"}), ()),
    ("key-names-in-args", lambda s: dumps({**s, "process": {**s["process"], "args": [
        "true", "NVIDIA_VISIBLE_DEVICES=all", "hami.io/gpu"]}}), ()),
    ("env-lookalikes", with_env("CUDA_VERSION=12.4", "MY_NVIDIA_VISIBLE_DEVICES=0", "XHAMI_GPUMEM=1",
                                "LANG=\u00fc\U0001f600"), ()),
    ("request-nested-elsewhere", lambda s: dumps({**s, "x-ext": {"annotations": {"hami.io/gpu": "1"},
                                                                 "env": ["NVIDIA_VISIBLE_DEVICES=all"]}}), ()),
    ("ordinary-hook", with_hook({"path": "/bin/true", "args": ["true", "nvidia"]}), ()),
    ("sandbox", with_annotations({"io.kubernetes.cri.container-type": "sandbox"}), ()),
    ("escaped-other-key", raw(lambda t: t[:-1] + ', "annotations": {"io.kubernetes.\\u0063ri.x": "\\u00e9\\n"}}'), ()),
    ("numbers-and-literals", raw(lambda t: t[:-1] + ', "x": [0, -1.5e+3, 1E2, true, false, null, {}, []]}'), ()),
    ("bundle-short-flag", dumps, ("-b",)),
    ("flags-after-id", dumps, ("after",)),
    ("run-detached", dumps, ("run",)),
]

PYTHON_CASES = [
    ("gpumem", with_annotations({"hami.io/gpumem": "100"}), ()),
    ("alias", with_annotations({"nvidia.com/gpu": "1"}), ()),
    ("pod-container-key", with_annotations({"main.hami.io/gpucores": "20"}), ()),
    ("cdi", with_annotations({"cdi.k8s.io/gpu": "nvidia.com/gpu=0"}), ()),
    ("shape-only-key", with_annotations({"hami.io/priority": "0"}), ()),
    ("upper-case-key", with_annotations({"HAMI.IO/gpu": "1"}), ()),
    ("escaped-dot", raw(lambda t: t[:-1] + ', "annotations": {"hami\\u002eio/gpumem": "100"}}'), ()),
    ("escaped-letter", raw(lambda t: t[:-1] + ', "annotations": {"\\u0068ami.io/gpumem": "100"}}'), ()),
    ("escaped-solidus", raw(lambda t: t[:-1] + ', "annotations": {"nvidia.com\\/gpu": "1"}}'), ()),
    ("env-visible", with_env("NVIDIA_VISIBLE_DEVICES=all"), ()),
    ("env-hami", with_env("HAMI_GPUMEM=100"), ()),
    ("env-other-nvidia", with_env("NVIDIA_DRIVER_CAPABILITIES=all"), ()),
    ("env-lower-case", with_env("nvidia_visible_devices=0"), ()),
    ("env-no-equals", with_env("NVIDIA_VISIBLE_DEVICES"), ()),
    ("env-escaped", raw(lambda t: t.replace('"env": [', '"env": ["\\u004eVIDIA_VISIBLE_DEVICES=0", ', 1)), ()),
    ("env-not-strings", raw(lambda t: t.replace('"env": [', '"env": [1, ', 1)), ()),
    ("env-twice", raw(lambda t: t.replace('"env": [', '"env": ["NVIDIA_VISIBLE_DEVICES=0"], "env": [', 1)), ()),
    ("annotations-twice", raw(lambda t: t[:-1] + ', "annotations": {"hami.io/gpumem": "100"}, "annotations": {}}'), ()),
    ("process-twice", raw(lambda t: t[:-1] + ', "process": {"env": ["HAMI_GPUMEM=1"]}}'), ()),
    ("annotation-not-string", with_annotations({"a": 1}), ()),
    ("annotations-list", with_annotations([]), ()),
    ("annotations-null", with_annotations(None), ()),
    ("process-string", lambda s: dumps({**s, "process": "x"}), ()),
    ("hooks-list", lambda s: dumps({**s, "hooks": []}), ()),
    ("linux-list", lambda s: dumps({**s, "linux": []}), ()),
    ("mounts-object", lambda s: dumps({**s, "mounts": {}}), ()),
    ("gpu-hook-path", with_hook({"path": "/usr/bin/nvidia-container-runtime-hook", "args": [
        "nvidia-container-runtime-hook", "prestart"]}), ()),
    ("gpu-hook-arg", with_hook({"path": "/usr/bin/env", "args": ["nvidia-container-toolkit", "prestart"]}), ()),
    ("gpu-hook-escaped", raw(lambda t: t[:-1] + ', "hooks": {"prestart": [{"path": '
                                                 '"/usr/bin/nvidia\\u002dcontainer-runtime-hook"}]}}'), ()),
    ("truncated", lambda s: dumps(s)[:-40], ()),
    ("trailing-data", lambda s: dumps(s) + b" {}", ()),
    ("empty", lambda s: b"", ()),
    ("nan", raw(lambda t: t[:-1] + ', "x": NaN}'), ()),
    ("long-number", raw(lambda t: t[:-1] + ', "x": ' + "1" * 5000 + "}"), ()),
    ("leading-zero", raw(lambda t: t[:-1] + ', "x": 01}'), ()),
    ("trailing-comma", raw(lambda t: t[:-1] + ', "x": [1,]}'), ()),
    ("byte-order-mark", lambda s: b"\xef\xbb\xbf" + dumps(s), ()),
    ("utf-16", lambda s: json.dumps(s).encode("utf-16"), ()),
    ("bad-utf-8", lambda s: dumps(s)[:-1] + b', "x": "\xff"}', ()),
    ("overlong-utf-8", lambda s: dumps(s)[:-1] + b', "x": "\xc0\xaf"}', ()),
    ("lone-surrogate", raw(lambda t: t[:-1] + ', "x": "\\ud800"}'), ()),
    ("nul-escape", raw(lambda t: t[:-1] + ', "x": "a\\u0000b"}'), ()),
    ("control-character", lambda s: dumps(s)[:-1] + b', "x": "a\tb"}', ()),
    ("deep", nested(100), ()),
    ("huge", raw(lambda t: t[:-1] + ', "x": "' + "a" * (5 << 20) + '"}'), ()),
    ("bad-id", dumps, ("id:a..b",)),
    ("unknown-flag", dumps, ("--frobnicate",)),
    ("two-ids", dumps, ("extra",)),
    ("both-bundle-flags", dumps, ("both",)),
    ("double-dash", dumps, ("--",)),
    ("no-config-json", None, ()),
]

CASES = [(c, make, how, "runc") for c, make, how in RUNC_CASES] + \
        [(c, make, how, "python") for c, make, how in PYTHON_CASES]


@pytest.fixture(scope="module")
def fast_node(module_node):
    module_node.write_config(log_file=str(module_node.tmp / "hami.log"), log_level="debug")
    (module_node.tmp / "hami.log").write_text("")
    base = json.loads(json.dumps(module_node.template))
    base["root"] = {"path": str(module_node.rootfs), "readonly": False}
    base["process"]["args"] = ["true"]
    return module_node, base


def argv_for(how, bundle, cid):
    command, args = "create", ["--bundle", str(bundle), cid]
    for item in how:
        if item == "run":
            command, args = "run", ["--detach"] + args
        elif item == "-b":
            args = ["-b", str(bundle), cid]
        elif item == "after":
            args = [cid, "--bundle", str(bundle)]
        elif item.startswith("id:"):
            args = args[:-1] + [item[3:]]
        elif item == "extra":
            args = args + ["extra"]
        elif item == "both":
            args = ["-b", str(bundle)] + args
        else:
            args = [item] + args
    return [command] + args


@pytest.mark.parametrize("case,make,how,expected", CASES, ids=[c[0] for c in CASES])
def test_who_decides(fast_node, case, make, how, expected):
    node, base = fast_node
    cid = f"fp-{case}"
    bundle = node.tmp / "bundles" / cid
    bundle.mkdir(parents=True)
    if make is not None:
        (bundle / "config.json").write_bytes(make(base))
    before = (bundle / "config.json").read_bytes() if make is not None else None
    log = node.tmp / "hami.log"
    logged = len(log.read_text().splitlines())
    try:
        proc = node.runtime(*argv_for(how, bundle, cid), cmd=[str(LAUNCHER)])
        python = len(log.read_text().splitlines()) > logged or proc.stderr.startswith("hami-runtime:")
        assert ("python" if python else "runc") == expected, proc.stderr
        if expected == "runc":
            assert proc.returncode == 0, proc.stderr
            assert (bundle / "config.json").read_bytes() == before
            assert cid in node.containers() or "run" in how
    finally:
        node.runtime("delete", "-f", cid, cmd=[str(LAUNCHER)])
        node.runtime("delete", "-f", cid, cmd=[RUNC])


def settled(node):
    """Waits until the node's config is old enough for the config cache, so that
    any Python run leaves <state dir>/cache/ behind."""
    age = time.time() - node.config.stat().st_ctime
    time.sleep(max(0.0, 2.2 - age))


def warmed(node, timeout=60.0):
    """Waits for the detached warm-up's caches; True when they are all there."""
    cache = node.state_dir / "cache"
    deadline = time.monotonic() + timeout
    names = ("config.json", "gpus.json", "driver-files.json")
    while not all((cache / n).exists() for n in names) and time.monotonic() < deadline:
        time.sleep(0.05)
    return all((cache / n).exists() for n in names)


@pytest.mark.parametrize("annotations,python", [({}, False), ({"hami.io/gpumem": "100"}, True)],
                         ids=["no-request", "gpu"])
def test_delete_starts_python_only_for_an_allocation(node, annotations, python):
    """delete through the launcher: the detached release (an allocator
    transaction, which makes allocations.lock) runs where the state dir holds
    the id's allocation dirs, and only there."""
    settled(node)
    bundle = node.bundle("del", annotations, args=("true",))
    assert node.create("del", bundle, cmd=[str(LAUNCHER)]).returncode == 0
    assert warmed(node)
    assert (node.state_dir / "allocations.lock").exists() == python
    assert node.runtime("delete", "del", cmd=[str(LAUNCHER)]).returncode == 0
    deadline = time.monotonic() + 10
    while python and node.allocations() and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.5 if not python else 0)
    assert node.allocations() == {}
    assert (node.state_dir / "allocations.lock").exists() == python


# With the create server (the default), it warms the caches as it starts; without, the one-off warm-up.
WARMERS = [({}, "server/socket"), ({"create_server_idle_s": 0}, "cache/.warm-up")]


@pytest.mark.parametrize("keys,mark", WARMERS, ids=["server", "warm-up"])
def test_a_fresh_state_dir_is_warmed_by_a_create_without_request(node, keys, mark):
    """The first create on a fresh state dir that starts no Python (it asks for
    no GPU) starts the create server, or the warm-up, detached: the config
    validated and the GPUs and driver files found, so that the next GPU create
    loads neither pydantic nor NVML; it is started once per state dir."""
    from .test_discovery_cache import probe
    node.write_config(**keys)
    settled(node)
    assert not node.state_dir.exists()
    for cid in ("w1", "w2"):
        bundle = node.bundle(cid, args=("true",))
        assert node.create(cid, bundle, cmd=[str(LAUNCHER)]).returncode == 0
    assert warmed(node)
    deadline = time.monotonic() + 60
    while not (node.state_dir / mark).exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert (node.state_dir / mark).exists()
    found = probe(node)
    assert not found["nvml"] and not found["ldconfig"] and len(found["gpus"]) == 2
    (node.state_dir / "cache" / "config.json").unlink()
    bundle = node.bundle("w3", args=("true",))
    assert node.create("w3", bundle, cmd=[str(LAUNCHER)]).returncode == 0
    time.sleep(1.0)
    assert not (node.state_dir / "cache" / "config.json").exists()  # once per state dir


def holders(inode: str) -> set:
    """The pids (but ours) with an fd on this pipe."""
    found = set()
    for pid in (p for p in os.listdir("/proc") if p.isdigit() and int(p) != os.getpid()):
        try:
            if any(os.readlink(f"/proc/{pid}/fd/{fd}") == inode for fd in os.listdir(f"/proc/{pid}/fd")):
                found.add(int(pid))
        except OSError:
            continue
    return found


@pytest.mark.parametrize("keys,mark", WARMERS, ids=["server", "warm-up"])
def test_the_warm_up_holds_none_of_the_engines_fds(node, keys, mark):
    """A pipe the engine passes the create (here as fd 3) is not kept open by
    the detached server or warm-up: the engine sees its end as soon as runc is done."""
    node.write_config(**keys)
    settled(node)
    bundle = node.bundle("fds", args=("true",))
    read_end, write_end = os.pipe()
    inode = os.readlink(f"/proc/self/fd/{write_end}")
    try:
        proc = subprocess.run([str(LAUNCHER), "--root", str(node.runc_root), "create", "--bundle", str(bundle),
                               "fds"], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL, env=node.env, pass_fds=(write_end,), timeout=60)
        assert proc.returncode == 0
        assert holders(inode) == set()
        assert warmed(node)
        deadline = time.monotonic() + 60
        while not (node.state_dir / mark).exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert holders(inode) == set()
    finally:
        os.close(read_end)
        os.close(write_end)


# Random specs, each read by Python as the runtime reads it: wherever that
# reading finds a request, a dockerd GPU hook or a spec it refuses, the
# launcher must have handed the create to Python.
VOCABULARY_KEYS = PY_KEYS[::3] + OTHER_KEYS + ["io.kubernetes.cri.container-type", "note", "hami.io/"]
VOCABULARY_ENV = ["NVIDIA_VISIBLE_DEVICES=all", "NVIDIA_VISIBLE_DEVICES=none", "HAMI_GPUMEM=10",
                  "NVIDIA_DRIVER_CAPABILITIES=compute", "CUDA_VERSION=12.4", "PATH=/bin", "NVIDIA_X",
                  "LANG=C.UTF-8", "hami_gpumem=1"]
HOOKS = [{"path": "/usr/bin/nvidia-container-runtime-hook", "args": ["x", "prestart"]},
         {"path": "/bin/true"}, {"path": "/usr/bin/env", "args": ["nvidia-container-toolkit"]}]


def escaped(text: str, rng) -> str:
    """A JSON string literal with some characters written as \\u escapes."""
    return '"' + "".join(f"\\u{ord(c):04x}" if rng.random() < 0.2 else
                         json.dumps(c)[1:-1] for c in text) + '"'


def random_spec(rng, base) -> bytes:
    spec = json.loads(json.dumps(base))
    if rng.random() < 0.6:
        spec["annotations"] = {rng.choice(VOCABULARY_KEYS): rng.choice(["1", "10", "sandbox", "x"])
                               for _ in range(rng.randrange(4))}
    if rng.random() < 0.6:
        spec["process"]["env"] = spec["process"]["env"] + rng.sample(VOCABULARY_ENV, rng.randrange(3))
    if rng.random() < 0.2:
        spec["hooks"] = {rng.choice(["prestart", "poststart"]): [rng.choice(HOOKS)]}
    if rng.random() < 0.1:
        spec[rng.choice(["annotations", "process", "hooks"])] = rng.choice([None, [], "x", 1])
    text = json.dumps(spec, ensure_ascii=rng.random() < 0.5)
    if rng.random() < 0.3:  # keys and env entries written with escapes
        for key in list(spec.get("annotations") or {}) if isinstance(spec.get("annotations"), dict) else []:
            text = text.replace(json.dumps(key), escaped(key, rng), 1)
        for entry in (spec.get("process") or {}).get("env") or [] if isinstance(spec.get("process"), dict) else []:
            text = text.replace(json.dumps(entry), escaped(entry, rng), 1)
    if rng.random() < 0.1:  # a key given twice
        text = text[:-1] + ', "annotations": {"hami.io/gpumem": "10"}, "annotations": {}}'
    if rng.random() < 0.05:
        text = text[:rng.randrange(len(text))]
    return text.encode()


def python_needed(text: bytes) -> bool:
    from hami_runtime.lifecycle.request.request_keys import mentions_request
    try:
        spec = json.loads(text)
    except ValueError:
        return True
    if not isinstance(spec, dict):
        return True
    annotations, process = spec.get("annotations", {}), spec.get("process", {})
    if annotations is not None and (not isinstance(annotations, dict) or
                                    not all(isinstance(v, str) for v in annotations.values())):
        return True
    if process is not None and not isinstance(process, dict):
        return True
    env = (process or {}).get("env", [])
    if env is not None and (not isinstance(env, list) or not all(isinstance(e, str) for e in env)):
        return True
    if spec.get("hooks") is not None and not isinstance(spec["hooks"], dict):
        return True
    return mentions_request(annotations or {}, env or [], True) or bool(docker_gpus.gpu_hooks(spec))


def test_random_specs_never_skip_python(node):
    import random
    rng = random.Random(29)
    log = node.tmp / "hami.log"
    node.write_config(runtime="/bin/true", log_file=str(log), log_level="debug")
    log.write_text("")
    base = json.loads(json.dumps(node.template))
    base["root"] = {"path": str(node.rootfs), "readonly": False}
    fast = needed = 0
    for n in range(150):
        text = random_spec(rng, base)
        bundle = node.tmp / "bundles" / f"r{n}"
        bundle.mkdir(parents=True)
        (bundle / "config.json").write_bytes(text)
        logged = len(log.read_text().splitlines())
        proc = node.runtime("create", "--bundle", str(bundle), f"r{n}", cmd=[str(LAUNCHER)])
        python = len(log.read_text().splitlines()) > logged or proc.stderr.startswith("hami-runtime:")
        if python_needed(text):
            needed += 1
            assert python, text
        fast += not python
    assert needed > 30 and fast > 30  # both sides of the line were tried
