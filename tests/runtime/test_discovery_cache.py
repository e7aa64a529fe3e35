"""The discovery cache: a hit loads neither NVML nor ldconfig; any change of
its key, or a damaged cache file, discovers again."""
import json
import os
import subprocess
import sys

import pytest

from hami_runtime.node import discovery_cache

from .node import TIMEOUT

# One create's discovery in a fresh interpreter; reports what it found and
# what it had to load or run for it.
PROBE = r"""
import json, os, sys
from hami_runtime import config
from hami_runtime.node import discovery, discovery_cache
boot_id = os.environ.get("PROBE_BOOT_ID")
if boot_id:
    discovery_cache.BOOT_ID = boot_id
ran = []
real_driver_files = discovery.driver_files
def counting(root):
    ran.append("ldconfig")
    return real_driver_files(root)
discovery.driver_files = counting
cfg = config.load()
gpus = discovery_cache.gpus(cfg)
files = discovery_cache.driver_files(cfg)
print(json.dumps({"gpus": [list(g) for g in gpus],
                  "files": sorted(f.container_path for f in files),
                  "nvml": "pynvml" in sys.modules, "ldconfig": bool(ran)}))
"""


def probe(node, **env):
    proc = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True,
                          env={**node.env, **env}, timeout=TIMEOUT)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def cache_file(node, name=discovery_cache.GPUS_FILE):
    return node.state_dir / discovery_cache.CACHE_DIR / name


def test_a_hit_loads_no_nvml_and_runs_no_ldconfig(node):
    first = probe(node)
    assert first["nvml"] and first["ldconfig"] and len(first["gpus"]) == 2
    assert cache_file(node).is_file() and cache_file(node, discovery_cache.DRIVER_FILES_FILE).is_file()
    second = probe(node)
    assert (second["gpus"], second["files"]) == (first["gpus"], first["files"])
    assert not second["nvml"] and not second["ldconfig"]


def test_mig_instances_are_cached_with_their_gpu(node):
    node.simulate(mig="1:4096")
    first = probe(node)
    assert first["nvml"] and [(g[0], g[1][:4], g[3]) for g in first["gpus"]] == [
        (0, "GPU-", 16384), (1, "GPU-", 16384), (1, "MIG-", 4096)]
    second = probe(node)
    assert not second["nvml"] and second["gpus"] == first["gpus"]


def _touch(path):
    st = os.stat(path)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))


CHANGES = {
    "nvml library rewritten": lambda node: _touch(node.sim_root / "lib" / "libnvidia-ml.so.1"),
    "ld cache rebuilt": lambda node: _touch(node.sim_root / "etc" / "ld.so.cache"),
    "cache file damaged": lambda node: cache_file(node).write_text('{"key": {}, "value": [1'),
    "cache value foreign": lambda node: cache_file(node).write_text(json.dumps(
        {**json.loads(cache_file(node).read_text()), "value": [{"index": "0"}]})),
    "cache value of a wrong type": lambda node: cache_file(node).write_text(json.dumps(
        {**json.loads(cache_file(node).read_text()),
         "value": [{**g, "mig_mode": 0} for g in json.loads(cache_file(node).read_text())["value"]]})),
    # cache files are state files: never opened through a link, never blocking
    "cache file a FIFO": lambda node: _replace(cache_file(node), os.mkfifo),
    "cache file a link to /dev/zero": lambda node: _replace(cache_file(node),
                                                            lambda p: os.symlink("/dev/zero", p)),
}


def _replace(path, make):
    path.unlink()
    make(path)


@pytest.mark.parametrize("change", CHANGES, ids=list(CHANGES))
def test_a_change_discovers_again(node, change):
    first = probe(node)
    CHANGES[change](node)
    again = probe(node)
    assert again["nvml"] and again["gpus"] == first["gpus"]
    assert not probe(node)["nvml"]  # and the new entry is a hit


def test_a_reboot_discovers_again(node, tmp_path):
    boot = tmp_path / "boot_id"
    boot.write_text("one\n")
    assert probe(node, PROBE_BOOT_ID=str(boot))["nvml"]
    assert not probe(node, PROBE_BOOT_ID=str(boot))["nvml"]
    boot.write_text("two\n")
    assert probe(node, PROBE_BOOT_ID=str(boot))["nvml"]


def test_another_environment_sees_another_machine(node, tmp_path):
    """The simulated driver's shape comes from the environment, like any
    loader setting: the cache follows it instead of answering for it."""
    assert len(probe(node)["gpus"]) == 2
    shape = tmp_path / "sim.conf"
    shape.write_text("devices = 3\n")
    env = {"HAMI_SIM_CONFIG": str(shape), "HAMI_SIM_STATE": str(tmp_path / "three.state")}
    three = probe(node, **env)
    assert three["nvml"] and len(three["gpus"]) == 3
    assert not probe(node, **env)["nvml"]


def test_driver_files_gone_discovers_again(node):
    first = probe(node)
    cached = json.loads(cache_file(node, discovery_cache.DRIVER_FILES_FILE).read_text())
    host = next(h for h, c, *_ in cached["value"] if os.path.basename(c).startswith("libcuda.so"))
    os.rename(host, host + ".moved")
    try:  # not served from the cache: discovery runs and finds no libcuda
        proc = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True,
                              env=node.env, timeout=TIMEOUT)
        assert proc.returncode == 1 and "lists no libcuda.so" in proc.stderr
    finally:
        os.rename(host + ".moved", host)
    assert probe(node)["files"] == first["files"]


def test_an_unwritable_cache_is_no_error(node):
    node.state_dir.mkdir(parents=True, exist_ok=True)
    (node.state_dir / discovery_cache.CACHE_DIR).write_text("not a dir")
    first = probe(node)
    assert first["nvml"] and probe(node)["gpus"] == first["gpus"]


def test_temps_of_killed_writers_are_removed(node):
    cache = node.state_dir / discovery_cache.CACHE_DIR
    cache.mkdir(parents=True)
    old, young = cache / ".hami-old", cache / ".hami-young"
    for path in (old, young):
        path.write_text("{")
    os.utime(old, (0, 0))
    probe(node)  # a miss writes, and sweeps what a killed writer left long ago
    assert not old.exists() and young.exists()


def test_a_device_node_that_comes_or_goes_discovers_again(node):
    dev = node.tmp / "dev"
    dev.mkdir()
    node.write_config(dev_root=str(dev))
    first = probe(node)
    assert first["nvml"] and not probe(node)["nvml"]
    (dev / "nvidia7").symlink_to("/dev/null")  # a new card's node
    assert probe(node)["nvml"]
    assert not probe(node)["nvml"]
    (dev / "nvidia7").unlink()
    assert probe(node)["nvml"]


# The caller's side of gpus_beside on a miss, NVML's init made slow (the simulator's nvml_init_us).
BESIDE = r"""
import json, os, sys, threading, time
from hami_runtime import config
from hami_runtime.node import discovery_cache
cfg = config.load()
entered = time.monotonic()
said = {}
try:
    with discovery_cache.gpus_beside(cfg) as found:
        sum(range(100000))  # the caller's own work, while NVML starts
        said["worked_s"] = time.monotonic() - entered
        if os.environ.get("PROBE_RAISE"):
            raise ValueError("the caller's own error")
        said["gpus"] = len(found())
        said["found_s"] = time.monotonic() - entered
except Exception as exc:
    said["raised"] = f"{type(exc).__name__}: {exc}"
said["threads_left"] = [t.name for t in threading.enumerate() if t is not threading.main_thread()]
print(json.dumps(said))
"""


def beside(node, **env):
    proc = subprocess.run([sys.executable, "-c", BESIDE], capture_output=True, text=True,
                          env={**node.env, **env}, timeout=TIMEOUT)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_a_miss_leaves_the_caller_its_work_while_nvml_starts(node):
    node.simulate(nvml_init_us=2000000)
    said = beside(node)
    assert said["worked_s"] < 1.0 <= 2.0 <= said["found_s"], said  # the work ran within NVML's init
    assert said["gpus"] == 2 and said["threads_left"] == []
    assert cache_file(node).exists()
    node.simulate()  # the same machine, NVML quick again: the entry holds
    assert beside(node)["found_s"] < 1.0


@pytest.mark.parametrize("keys, env, raised", [
    ({"nvml_library": "/nonexistent/libnvidia-ml.so.1"}, {}, "HamiError: config nvml_library"),
    ({}, {"PROBE_RAISE": "1"}, "ValueError: the caller's own error"),
])
def test_what_goes_wrong_beside_nvml_is_raised_and_no_thread_is_left(node, keys, env, raised):
    """NVML's failure is raised where the caller asks for the GPUs; the caller's own error
    ends the block, which waits for NVML (no thread outlives it)."""
    node.simulate(nvml_init_us=300000)
    node.write_config(**keys)
    said = beside(node, **env)
    assert said["raised"].startswith(raised), said
    assert said["threads_left"] == [] and "gpus" not in said
