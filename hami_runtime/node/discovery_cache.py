"""What discovery found, kept in the state dir so that a create need not start
NVML (hundreds of ms on a real driver) or run ldconfig every time.

An entry is used only while its key is what the node shows now, so it cannot
be stale: the boot, the NVML library file (path, inode, size, times), both ld
caches, the GPUs the kernel driver lists, the nvidia* device nodes under the
dev root, the config values discovery reads
and the whole environment (LD_LIBRARY_PATH and the like; kept as a hash) but
for what a shell sets for every command it starts (SHELL_NOISE: the working
directory's name, the command's path), which no loader or driver reads: an
engine run from a shell (podman) would otherwise miss at every new directory;
nor the markers the launcher sets for the runtime (LAUNCHER_MARKERS): a create
takes them out before discovery, but the create server inherits those of the
GPU create that started it, and its warm-up's entry would miss at the next
create, which then started NVML itself.
Anything unreadable, unexpected or different is a miss: discover again and
replace the entry atomically. A cache that cannot be written is not an error.
"""
from __future__ import annotations

import contextlib
import json
import os
import threading
import time

from .. import phases
from ..errors import HamiError
from ..files import BOOT_ID, atomic_write, boot_id, file_key, read_state_file, sha256_hex
from ..path_trust import make_state_dir
from . import discovery
from .gpu import GpuInfo

CACHE_DIR = "cache"
GPUS_FILE = "gpus.json"
DRIVER_FILES_FILE = "driver-files.json"
VERSION = 4
HOST_LD_CACHE = "/etc/ld.so.cache"
KERNEL_GPUS = "/proc/driver/nvidia/gpus"
KERNEL_CAPABILITIES = "/proc/driver/nvidia/capabilities"  # gpu<minor>/mig/gi<id>/ci<id>
GPU_FIELDS = GpuInfo._fields
GPU_DEFAULTS = GpuInfo(0, "", "", 0, 0)._asdict()  # a field's type is its default's
STALE_TEMP_S = 60
MAX_ENTRY_BYTES = 4 << 20


def _file_id(path: str):
    """What changes when the file is replaced or rewritten; None when absent."""
    try:
        st = os.stat(path)  # first: most places looked at hold no file, and realpath is slow
    except OSError:
        return None
    return file_key(os.path.realpath(path), st)


def _kernel_gpus():
    try:
        return sorted(os.listdir(KERNEL_GPUS))
    except OSError:
        return None


def _mig_instances():
    """The MIG GPU and compute instances the kernel driver lists: making or
    destroying one changes them."""
    found = []
    for top, dirs, _ in os.walk(KERNEL_CAPABILITIES):
        dirs.sort()
        found += [os.path.relpath(os.path.join(top, d), KERNEL_CAPABILITIES) for d in dirs]
    return found


def _device_nodes(dev_root: str):
    """The nvidia* nodes (name, device number): a GPU that comes or goes changes them."""
    try:
        names = sorted(n for n in os.listdir(dev_root) if n.startswith("nvidia"))
    except OSError:
        return None
    nodes = []
    for name in names:
        try:
            nodes.append([name, os.stat(os.path.join(dev_root, name)).st_rdev])
        except OSError:
            nodes.append([name, None])
    return nodes


SHELL_NOISE = frozenset({"_", "PWD", "OLDPWD", "SHLVL"})
# hami_runtime/launcher/hook.h: what the launcher tells the runtime, never a loader's or a driver's
LAUNCHER_MARKERS = frozenset({"HAMI_LAUNCHER", phases.LAUNCHER_STARTED_ENV, "HAMI_CREATE_SERVER",
                              "HAMI_WARM_UP", "HAMI_DELETE_DONE"})


def _environment_hash() -> str:
    text = json.dumps(sorted(item for item in os.environ.items()
                             if item[0] not in SHELL_NOISE and item[0] not in LAUNCHER_MARKERS))
    return sha256_hex(text.encode("utf-8", "surrogateescape"))


def _base_key(cfg) -> dict:
    return {
        "version": VERSION,
        "boot_id": boot_id(BOOT_ID) or None,
        "environment": _environment_hash(),
        "host_ld_cache": _file_id(HOST_LD_CACHE),
        "driver_ld_cache": _file_id(os.path.join(cfg.driver_root, "etc", "ld.so.cache")),
        "driver_root": os.path.realpath(cfg.driver_root),
    }


def gpus_key(cfg, nvml_path: str) -> dict:
    return dict(_base_key(cfg), nvml_library=cfg.nvml_library,
                nvml_file=_file_id(nvml_path) if nvml_path else None,
                kernel_gpus=_kernel_gpus(), mig_instances=_mig_instances(),
                device_nodes=_device_nodes(cfg.dev_root))


def driver_files_key(cfg) -> dict:
    programs = {place: _file_id(os.path.join(cfg.driver_root, place)) for place in discovery.program_places()}
    return dict(_base_key(cfg), programs=programs)


def _path(cfg, name: str) -> str:
    return os.path.join(cfg.state_dir, CACHE_DIR, name)


def _read(path: str) -> dict | None:
    """An entry, read as the state file it is (no link followed, no FIFO waited on)."""
    try:
        data = json.loads(read_state_file(path, MAX_ENTRY_BYTES))
    except (HamiError, OSError, ValueError):
        return None
    return data if isinstance(data, dict) and isinstance(data.get("key"), dict) else None


def _remove_stale_temps(directory: str) -> None:
    """Temp files of writers killed before their rename (atomic_write's prefix)."""
    now = time.time()
    for name in os.listdir(directory):
        if name.startswith(".hami-"):
            path = os.path.join(directory, name)
            with contextlib.suppress(OSError):
                if now - os.lstat(path).st_mtime > STALE_TEMP_S:
                    os.unlink(path)


def _write(cfg, name: str, key: dict, value) -> None:
    if key.get("boot_id") is None:
        return  # no boot id: a reboot could not be told apart
    directory = os.path.join(cfg.state_dir, CACHE_DIR)
    try:
        if make_state_dir(cfg.state_dir):
            return  # a state dir others could replace: nothing is kept there
        os.makedirs(directory, mode=0o755, exist_ok=True)
        _remove_stale_temps(directory)
        atomic_write(os.path.join(directory, name),
                     json.dumps({"key": key, "value": value}).encode(), 0o644)
    except OSError:
        pass


def _loaded_nvml() -> str | None:
    """The NVML library this process mapped (the loader's choice for the soname)."""
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as handle:
            for line in handle:
                path = line.rstrip("\n").split(None, 5)[-1]
                if os.path.basename(path).startswith("libnvidia-ml.so") and os.path.isabs(path):
                    return path
    except OSError:
        pass
    return None


def _gpus_from(value) -> list[GpuInfo] | None:
    if not isinstance(value, list):
        return None
    gpus = []
    for item in value:
        if not isinstance(item, dict) or set(item) != set(GPU_FIELDS):
            return None
        if not all(type(item[k]) is type(default) for k, default in GPU_DEFAULTS.items()):
            return None
        gpus.append(GpuInfo(**item))
    return gpus


def last_found(state_dir: str) -> list[GpuInfo]:
    """The GPUs discovery last found, whatever the node shows now ([] when none
    were kept): for a reader that must not wait on the driver to name them."""
    cached = _read(os.path.join(state_dir, CACHE_DIR, GPUS_FILE))
    return (_gpus_from(cached.get("value")) if cached else None) or []


def _miss(cached: dict | None, key: dict | None) -> str:
    """Why an entry was not used, for the create's trace (phases.note)."""
    if cached is None:
        return "no entry"
    if key is None or cached["key"] == key:
        return "its value unusable"
    return "its key differs: " + ", ".join(sorted(k for k in set(cached["key"]) | set(key)
                                                   if cached["key"].get(k) != key.get(k)))


def gpus(cfg) -> list[GpuInfo]:
    """discovery.load_gpus, from the cache while its key holds."""
    with gpus_beside(cfg) as found:
        return found()


@contextlib.contextmanager
def gpus_beside(cfg):
    """gpus(cfg) while the caller goes on: yields a function that returns them.
    From the cache they are there at once; on a miss NVML runs on a thread of
    its own, whose calls into the driver (its load, init and first device access:
    tens of ms on a node) leave the interpreter to the caller, which has that
    long for its own work. The thread is joined by that function, or when the
    block ends however it ends."""
    cached, now = _read(_path(cfg, GPUS_FILE)), None
    if cached is not None:
        nvml_file = cached["key"].get("nvml_file")
        if isinstance(nvml_file, list) and nvml_file and isinstance(nvml_file[0], str):
            now = gpus_key(cfg, cfg.nvml_library or nvml_file[0])
            if cached["key"] == now:
                found = _gpus_from(cached.get("value"))
                if found is not None:
                    phases.note("GPUs from the discovery cache")
                    yield lambda: found
                    return
    # The key is taken before discovery: a change while it runs is a later miss.
    key = gpus_key(cfg, cfg.nvml_library)
    phases.note(f"GPUs discovered through NVML (discovery cache: {_miss(cached, now)})")
    importing = time.monotonic_ns()
    # Imported here: an import is the interpreter's work, which on the thread would
    # only take turns with the caller's; the driver's part is what runs beside it.
    import pynvml  # noqa: F401
    phases.note(f"pynvml imported in {phases.since_ms(importing):.2f}ms")
    outcome = []

    def discover():
        try:
            outcome.append(_discovered(cfg, key))
        except BaseException as exc:  # handed to the caller, raised there
            outcome.append(exc)
    thread = threading.Thread(target=discover, name="hami-nvml")

    def found() -> list[GpuInfo]:
        thread.join()
        if isinstance(outcome[0], BaseException):
            raise outcome[0]
        return outcome[0]
    thread.start()
    try:
        yield found
    finally:
        thread.join()


def _discovered(cfg, key: dict) -> list[GpuInfo]:
    found = discovery.load_gpus(cfg.nvml_library)
    if not cfg.nvml_library:
        loaded = _loaded_nvml()  # known only now; the ld caches above pin the choice
        key["nvml_file"] = _file_id(loaded) if loaded else None
    if key["nvml_file"] is not None:
        _write(cfg, GPUS_FILE, key, [{k: getattr(g, k) for k in GPU_FIELDS} for g in found])
    return found


def driver_files(cfg) -> list[discovery.DriverFile]:
    """discovery.driver_files, from the cache while its key holds and every
    listed file is still there."""
    cached = _read(_path(cfg, DRIVER_FILES_FILE))
    now = driver_files_key(cfg) if cached is not None else None
    if cached is not None and cached["key"] == now:
        value = cached.get("value")
        if (isinstance(value, list) and value
                and all(isinstance(p, list) and len(p) == 4 and all(isinstance(s, str) for s in p[:3])
                        and p[3] in (32, 64) for p in value)
                and all(os.path.isfile(p[0]) for p in value)):
            phases.note("driver files from the discovery cache")
            return [discovery.DriverFile(*p) for p in value]
    phases.note(f"driver files found from the ld cache (discovery cache: {_miss(cached, now)})")
    key = driver_files_key(cfg)
    found = discovery.driver_files(cfg.driver_root)
    _write(cfg, DRIVER_FILES_FILE, key, [list(f) for f in found])
    return found
