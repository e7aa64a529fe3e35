"""A container's limits and region files from Python (region.h says what each is
for and who may write it): create, read and update them through cffi.

The layout is read at import time from the one C header that libvgpu is built
from (``libvgpu_src/region.h``), so there is no second copy of it here: only
``#define NAME <integer>`` lines of its preprocessor part are kept, the rest of
the header is handed to ``ffi.cdef`` as it is (cffi ABI mode, no compiler).
``make build`` writes the same cdef once as an out-of-line ABI module
(``hami_runtime/node/_region_ffi.py``, see ``emit_module``) holding the header
text it was made from; it is used only when that text is the header found
now byte for byte, otherwise the header is parsed here as before (pycparser is slow to load).

Header lookup order: ``$HAMI_REGION_HEADER``, the source tree's
``libvgpu_src/region.h`` beside this package, and the installed environment's
``share/hami/region.h`` (what ``make install`` puts there, ``installed.py``).
"""
from __future__ import annotations

import builtins
import mmap
import os
import stat
import sys
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, NamedTuple

from .. import installed, phases

if TYPE_CHECKING:
    from pathlib import Path


REGION_FILE_NAME = "vgpu.region"  # in the container dir (read-write inside)
LIMITS_FILE_NAME = "limits"  # in the private dir (host-only; read-only inside)

# compiled where the header is parsed: a create with the prebuilt layout loads no re
_INTEGER_DEFINE = (
    r"^\s*#\s*define\s+[A-Za-z_]\w*\s+(?:0[xX][0-9a-fA-F]+|\d+)[uUlL]*\s*(?:/\*.*\*/\s*|//.*)?$"
)


class RegionError(Exception):
    """A region file that cannot be used (missing, truncated, foreign, wrong version)."""


def _header_candidates() -> list[str]:
    env = os.environ.get("HAMI_REGION_HEADER")
    candidates = [env] if env else []
    tree = os.path.dirname(os.path.dirname(os.path.dirname(os.path.realpath(__file__))))
    candidates.append(os.path.join(tree, "libvgpu_src", "region.h"))
    if installed.REGION_HEADER:
        candidates.append(installed.REGION_HEADER)
    return candidates


def header_candidates() -> list[Path]:
    from pathlib import Path
    return [Path(c) for c in _header_candidates()]


def _find_header() -> str:
    env = os.environ.get("HAMI_REGION_HEADER")
    if env and not os.path.isfile(env):
        raise RegionError(f"HAMI_REGION_HEADER: no such file: {env}")
    for candidate in _header_candidates():
        if os.path.isfile(candidate):
            return candidate
    tried = ", ".join(_header_candidates())
    raise RegionError(f"region.h not found (tried {tried})")


def find_header() -> Path:
    from pathlib import Path
    return Path(_find_header())


def _read(path: str) -> bytes:
    with builtins.open(path, "rb") as handle:
        return handle.read()


def cdef_source(header_text: str) -> str:
    """The header as cffi's cdef takes it: integer #defines kept, other # lines dropped."""
    import re
    lines = []
    for line in header_text.splitlines():
        if line.lstrip().startswith("#") and not re.match(_INTEGER_DEFINE, line):
            continue
        lines.append(line)
    return "\n".join(lines) + "\n"


FFI_MODULE = "hami_runtime.node._region_ffi"


def _prebuilt_ffi(header_text: bytes):
    """The build's module, when it was made from exactly this header."""
    try:
        from . import _region_ffi
    except ImportError:
        return None
    if getattr(_region_ffi, "HEADER_TEXT", None) != header_text:
        return None
    return _region_ffi.ffi


def _parsed_ffi(header_text: bytes):
    import cffi
    parsed = cffi.FFI()
    parsed.cdef(cdef_source(header_text.decode()))
    return parsed


def _load_ffi():
    header_text = _read(_find_header())
    prebuilt = _prebuilt_ffi(header_text)
    if prebuilt is not None:
        return prebuilt
    # ~30 ms: where a create pays it (a Python of its own), its trace says so
    phases.note("the region layout parsed from its header (no module from make build matches it)")
    return _parsed_ffi(header_text)


def prebuilt() -> bool:
    """Whether the layout in use is make build's module (not the header parsed)."""
    return ffi is getattr(sys.modules.get(FFI_MODULE), "ffi", None)


def emit_module(out_path, header_path=None) -> None:
    """Write the out-of-line ABI module for the header (default: the one found
    now) with the header's text; atomic, so a reader never sees half of it."""
    from pathlib import Path
    header_text = Path(header_path).read_bytes() if header_path else find_header().read_bytes()
    builder = _parsed_ffi(header_text)
    builder.set_source(FFI_MODULE, None)
    out_path = Path(out_path)
    tmp = out_path.with_name(f".{out_path.name}.{os.getpid()}.tmp")
    try:
        builder.emit_python_code(str(tmp))
        with builtins.open(tmp, "a", encoding="ascii") as handle:
            handle.write(f"\n# The header this was made from; any other header is parsed instead.\n"
                         f"HEADER_TEXT = {header_text!r}\n")
        os.replace(tmp, out_path)
    finally:
        if tmp.exists():
            tmp.unlink()


ffi = _load_ffi()
# The header's integer #defines, as attributes (no symbol of the process is used).
_consts = ffi.dlopen(None)


def _const(name: str) -> int:
    return getattr(_consts, name)


LIMITS_MAGIC = _const("HAMI_LIMITS_MAGIC")
LIMITS_VERSION = _const("HAMI_LIMITS_VERSION")
MAGIC = _const("HAMI_REGION_MAGIC")
VERSION = _const("HAMI_REGION_VERSION")
MAX_DEVICES = _const("HAMI_MAX_DEVICES")
MAX_PROCS = _const("HAMI_MAX_PROCS")
UUID_LEN = _const("HAMI_UUID_LEN")
STATE_READY = _const("HAMI_REGION_READY")
OWNER_RECLAIMING = _const("HAMI_OWNER_RECLAIMING")
DEVICE_SPILL = _const("HAMI_DEVICE_SPILL")  # allocations the card cannot hold may use managed memory
PRIORITY_IDLE_MS_DEFAULT = _const("HAMI_PRIORITY_IDLE_MS_DEFAULT")
PRIORITY_IDLE_MS_MAX = _const("HAMI_PRIORITY_IDLE_MS_MAX")
LIMITS_SIZE = ffi.sizeof("struct hami_limits")
REGION_SIZE = ffi.sizeof("struct hami_region")

POLICIES = {
    "default": _const("HAMI_POLICY_DEFAULT"),
    "force": _const("HAMI_POLICY_FORCE"),
    "disable": _const("HAMI_POLICY_DISABLE"),
}
_POLICY_NAMES = {value: name for name, value in POLICIES.items()}
STATES = {
    _const("HAMI_REGION_EMPTY"): "empty",
    _const("HAMI_REGION_INITIALIZING"): "initializing",
    STATE_READY: "ready",
}


class DeviceLimit(NamedTuple):
    uuid: str
    mem_limit_bytes: int  # 0 = no limit
    sm_limit_pct: int  # 0 or >= 100 = no limit
    flags: int = 0  # HAMI_DEVICE_* bits (DEVICE_SPILL)

    @property
    def spill(self) -> bool:
        return bool(self.flags & DEVICE_SPILL)


class DeviceUsage(NamedTuple):
    mem_used: int
    ctx_used: int
    sm_busy_ns: int
    launches: int


class SmTimes(NamedTuple):
    """A device's SM counters for the whole container, cumulative nanoseconds."""
    busy_ns: int  # measured kernel time
    throttled_ns: int  # launches waiting for the SM share
    paused_ns: int  # launches waiting for high-priority work


class ProcessUsage(NamedTuple):
    slot: int
    pid: int  # as the container sees it
    host_pid: int  # 0 when not known
    started_ns: int
    devices: Sequence[DeviceUsage] = ()
    owner: int = 0  # (pid << 32) | (start time in clock ticks & 0xffffffff)

    @property
    def mem_used(self) -> int:
        return sum(d.mem_used for d in self.devices)

    def alive(self, proc_root: str = "/proc") -> bool | None:
        """Whether the slot's process still runs, as the host can tell: by its host
        pid and start time (None when the host pid is not known)."""
        if self.host_pid <= 0:
            return None
        start = process_start_ticks(self.host_pid, proc_root)
        return start is not None and (start & 0xFFFFFFFF) == (self.owner & 0xFFFFFFFF)


def process_start_ticks(pid: int, proc_root: str = "/proc") -> int | None:
    """Field 22 of /proc/<pid>/stat (None for a process gone or a zombie)."""
    try:
        with builtins.open(f"{proc_root}/{pid}/stat") as stat:  # `open` here is Region's
            text = stat.read()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2:].split()
    if fields[0] in ("Z", "X"):
        return None
    return int(fields[19])


# ---- pure checks and images -------------------------------------------------

def validate_limits(devices: Sequence[DeviceLimit], core_policy: str, priority: int,
                    priority_idle_ms: int = PRIORITY_IDLE_MS_DEFAULT) -> None:
    """Raises ValueError naming the field and the value for anything the header cannot hold."""
    if not 1 <= len(devices) <= MAX_DEVICES:
        raise ValueError(f"devices: {len(devices)} devices, 1 to {MAX_DEVICES}")
    for i, dev in enumerate(devices):
        if not dev.uuid or len(dev.uuid.encode()) >= UUID_LEN:
            raise ValueError(f"devices[{i}].uuid: {dev.uuid!r} not 1 to {UUID_LEN - 1} bytes")
        if not isinstance(dev.mem_limit_bytes, int) or not 0 <= dev.mem_limit_bytes < 2**64:
            raise ValueError(f"devices[{i}].mem_limit_bytes: {dev.mem_limit_bytes!r} not a byte count")
        if not isinstance(dev.sm_limit_pct, int) or not 0 <= dev.sm_limit_pct <= 100:
            raise ValueError(f"devices[{i}].sm_limit_pct: {dev.sm_limit_pct!r} not in 0..100")
        if not isinstance(dev.flags, int) or isinstance(dev.flags, bool) or dev.flags & ~DEVICE_SPILL \
                or dev.flags < 0:
            raise ValueError(f"devices[{i}].flags: {dev.flags!r} not a set of HAMI_DEVICE_* bits")
    if core_policy not in POLICIES:
        raise ValueError(f"core_policy: {core_policy!r} not one of {', '.join(POLICIES)}")
    if priority not in (0, 1) or isinstance(priority, bool):
        raise ValueError(f"priority: {priority!r} not 0 (high) or 1 (low)")
    if isinstance(priority_idle_ms, bool) or not isinstance(priority_idle_ms, int) or \
            not 1 <= priority_idle_ms <= PRIORITY_IDLE_MS_MAX:
        raise ValueError(f"priority_idle_ms: {priority_idle_ms!r} not in 1..{PRIORITY_IDLE_MS_MAX}")


def limits_image(devices: Sequence[DeviceLimit], core_policy: str = "default", priority: int = 1,
                 priority_idle_ms: int = PRIORITY_IDLE_MS_DEFAULT, created_ns: int | None = None) -> bytes:
    """The bytes of a limits file granting these devices."""
    validate_limits(devices, core_policy, priority, priority_idle_ms)
    c = ffi.new("struct hami_limits *")
    c.magic = LIMITS_MAGIC
    c.version = LIMITS_VERSION
    c.device_count = len(devices)
    c.core_policy = POLICIES[core_policy]
    c.priority = priority
    c.priority_idle_ms = priority_idle_ms
    c.created_ns = time.time_ns() if created_ns is None else created_ns
    for i, dev in enumerate(devices):
        c.devices[i].uuid = dev.uuid.encode()
        c.devices[i].mem_limit = dev.mem_limit_bytes
        c.devices[i].sm_limit = dev.sm_limit_pct
        c.devices[i].flags = dev.flags
    return bytes(ffi.buffer(c))


def region_image(created_ns: int | None = None, whole: bool = True) -> bytes:
    """The bytes of a READY region with no process; not `whole`: only its header
    (the tables after it are all zero in a new region)."""
    c = ffi.new("struct hami_region *")
    c.magic = MAGIC
    c.version = VERSION
    c.state = STATE_READY
    c.created_ns = time.time_ns() if created_ns is None else created_ns
    return ffi.buffer(c)[:] if whole else ffi.buffer(c)[:ffi.offsetof("struct hami_region", "sm")]


# ---- file edges ------------------------------------------------------------

def write_new(path: str, data: bytes, mode: int, size: int | None = None) -> os.stat_result:
    """Writes `data` at `path` atomically (temp file, fsync, rename); returns the new
    file's stat (its device and inode name it from then on). `size`: the file's,
    zeros past `data`, allocated now (a full filesystem fails here, not a process
    that touches them later), which costs a third of writing them."""
    from ..files import temp_beside
    fd, tmp = temp_beside(path, prefix=f".{os.path.basename(path)}.")
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(data)
            out.flush()
            if size is not None:
                os.posix_fallocate(out.fileno(), 0, size)
            os.fchmod(out.fileno(), mode)
            os.fsync(out.fileno())
            made = os.fstat(out.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    dir_fd = os.open(os.path.dirname(os.path.abspath(path)), os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
    return made


def create_limits(path, devices: Sequence[DeviceLimit], core_policy: str = "default", priority: int = 1,
                  priority_idle_ms: int = PRIORITY_IDLE_MS_DEFAULT) -> os.stat_result:
    """A limits file at `path`, mode 0644 (every container user reads it)."""
    return write_new(os.fspath(path), limits_image(devices, core_policy, priority, priority_idle_ms), 0o644)


def create_region(path) -> os.stat_result:
    """An empty region at `path`, mode 0666 (every container user maps it)."""
    return write_new(os.fspath(path), region_image(whole=False), 0o666, REGION_SIZE)


def identity(st) -> list[int]:
    """What names a file the runtime made: its device and inode."""
    return [st.st_dev, st.st_ino]


class _Mapped:
    """A file of one C struct, mapped. Opened without following a symlink or
    blocking on a FIFO, relative to `dir_fd` when given (`label`: the path to name
    in messages); it must be a regular file of the struct's size and, with `expect`
    ([device, inode]), that very file."""
    CTYPE = ""
    SIZE = 0
    WHAT = ""

    def __init__(self, path, writable: bool = False, dir_fd: int | None = None, expect=None,
                 label: str | None = None):
        name = os.fspath(path)
        self.path = label or name
        self.writable = writable
        self._c = None
        flags = (os.O_RDWR if writable else os.O_RDONLY) | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
        try:
            fd = os.open(name, flags, dir_fd=dir_fd)
        except OSError as exc:
            why = "a symbolic link" if exc.errno == 40 else exc.strerror  # ELOOP
            raise RegionError(f"{self.WHAT} {self.path}: {why}") from None
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise RegionError(f"{self.WHAT} {self.path}: not a regular file")
            if expect is not None and identity(st) != list(expect):
                raise RegionError(f"{self.WHAT} {self.path}: replaced (not the file the runtime made)")
            if st.st_size != self.SIZE:
                raise RegionError(f"{self.WHAT} {self.path}: {st.st_size} bytes, expected {self.SIZE}")
            self._map = mmap.mmap(fd, self.SIZE, access=mmap.ACCESS_WRITE if writable else mmap.ACCESS_READ)
        finally:
            os.close(fd)
        # a read-only map gives a read-only cdata view
        self._c = ffi.from_buffer(self.CTYPE, self._map, require_writable=False)
        try:
            self._check(self._c)
        except RegionError:
            self.close()
            raise

    def _check(self, c) -> None:
        raise NotImplementedError

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        if self._c is not None:
            ffi.release(self._c)
            self._c = None
            self._map.close()

    def _struct(self):
        if self._c is None:
            raise RegionError(f"{self.WHAT} {self.path}: closed")
        return self._c

    def _writable(self):
        if not self.writable:
            raise RegionError(f"{self.WHAT} {self.path}: opened read-only")
        return self._struct()


class Limits(_Mapped):
    """A container's limits file (host-owned; libvgpu maps it read-only)."""
    CTYPE = "struct hami_limits *"
    SIZE = LIMITS_SIZE
    WHAT = "limits"

    def _check(self, c) -> None:
        if c.magic != LIMITS_MAGIC or c.version != LIMITS_VERSION:
            raise RegionError(f"limits {self.path}: magic {c.magic:#x} version {c.version} "
                              f"(this build reads {LIMITS_MAGIC:#x} version {LIMITS_VERSION})")
        if not 1 <= c.device_count <= MAX_DEVICES:
            raise RegionError(f"limits {self.path}: device_count {c.device_count} (1 to {MAX_DEVICES})")

    @property
    def core_policy(self) -> str:
        value = self._struct().core_policy
        return _POLICY_NAMES.get(value, str(value))

    @property
    def priority(self) -> int:
        return self._struct().priority

    @property
    def priority_idle_ms(self) -> int:
        return self._struct().priority_idle_ms

    @property
    def devices(self) -> list[DeviceLimit]:
        c = self._struct()
        return [
            DeviceLimit(
                uuid=ffi.string(c.devices[i].uuid, UUID_LEN).decode(errors="replace"),
                mem_limit_bytes=c.devices[i].mem_limit,
                sm_limit_pct=c.devices[i].sm_limit,
                flags=c.devices[i].flags,
            )
            for i in range(c.device_count)
        ]

    def update_live(self, mem_limits: dict[int, int] | None = None,
                    sm_limits: dict[int, int] | None = None, core_policy: str | None = None,
                    priority: int | None = None) -> None:
        """Changes the limits of a container in use (hamictl update): only the fields
        given, each with one aligned store (a uint64_t or uint32_t field of a cffi
        struct is written whole; region.h's protocol says why no order between
        fields is needed). The UUIDs and the device count never change here."""
        c = self._writable()
        count = c.device_count
        mem_limits, sm_limits = mem_limits or {}, sm_limits or {}
        for i in list(mem_limits) + list(sm_limits):
            if not 0 <= i < count:
                raise IndexError(f"device: {i} not in 0..{count - 1}")
        validate_limits([d._replace(mem_limit_bytes=mem_limits.get(i, d.mem_limit_bytes),
                                    sm_limit_pct=sm_limits.get(i, d.sm_limit_pct))
                         for i, d in enumerate(self.devices)],
                        self.core_policy if core_policy is None else core_policy,
                        self.priority if priority is None else priority, c.priority_idle_ms)
        for i, pct in sm_limits.items():
            c.devices[i].sm_limit = pct
        if core_policy is not None:
            c.core_policy = POLICIES[core_policy]
        if priority is not None:
            c.priority = priority
        for i, limit in mem_limits.items():
            c.devices[i].mem_limit = limit


class Region(_Mapped):
    """A container's region: the live counters its processes keep. It is theirs to
    write: every value is what the container says, read as plain integers."""
    CTYPE = "struct hami_region *"
    SIZE = REGION_SIZE
    WHAT = "region"

    def _check(self, c) -> None:
        if c.magic != MAGIC:
            raise RegionError(f"region {self.path}: bad magic {c.magic:#x} (expected {MAGIC:#x})")
        if c.version != VERSION:
            raise RegionError(f"region {self.path}: version {c.version} (this build reads {VERSION})")

    @property
    def state(self) -> str:
        return STATES.get(self._struct().state, str(self._struct().state))

    @property
    def created_ns(self) -> int:
        return self._struct().created_ns

    def processes(self, device_count: int) -> list[ProcessUsage]:
        """Slots held by a process (free and being-reclaimed slots left out), with
        the usage of devices [0, device_count)."""
        _check_device_count(device_count)
        c = self._struct()
        found = []
        for i in range(MAX_PROCS):
            slot = c.procs[i]
            owner = slot.owner
            if owner == 0 or owner == OWNER_RECLAIMING:
                continue
            found.append(ProcessUsage(
                slot=i, pid=slot.pid, host_pid=slot.host_pid, started_ns=slot.started_ns, owner=owner,
                devices=[DeviceUsage(slot.mem_used[d], slot.ctx_used[d], slot.sm_busy_ns[d],
                                     slot.launches[d]) for d in range(device_count)],
            ))
        return found

    def used_bytes(self, device: int) -> int:
        """What the limiter counts on `device`: the sum over every slot."""
        _check_device_count(device + 1)
        procs = self._struct().procs
        return sum(procs[i].mem_used[device] for i in range(MAX_PROCS))

    def sm_times(self, device: int) -> SmTimes:
        """The SM counters libvgpu keeps for `device`; their deltas over a wall
        interval give the share used and whether launches were held."""
        _check_device_count(device + 1)
        st = self._struct().sm[device]
        return SmTimes(st.busy_ns, st.throttled_ns, st.paused_ns)


def _check_device_count(count: int) -> None:
    if not 1 <= count <= MAX_DEVICES:
        raise IndexError(f"device: {count - 1} not in 0..{MAX_DEVICES - 1}")


def open(path, writable: bool = False, **where) -> Region:  # noqa: A001 - module-level API name
    """The region at `path` (`where`: dir_fd, expect, label, as _Mapped takes them)."""
    return Region(path, writable=writable, **where)


def open_limits(path, writable: bool = False, **where) -> Limits:
    return Limits(path, writable=writable, **where)


def region_path(container_dir) -> Path:
    from pathlib import Path
    return Path(container_dir) / REGION_FILE_NAME
