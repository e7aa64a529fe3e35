"""The shared region from Python: create, read and update it through cffi.

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
import time
from collections import namedtuple  # not typing.NamedTuple: importing typing costs each create ms

from .. import installed

TYPE_CHECKING = False  # as typing.TYPE_CHECKING, without importing typing

if TYPE_CHECKING:
    from collections.abc import Sequence
    from pathlib import Path


def Path(*parts):  # noqa: N802 - pathlib.Path, loaded on first use (the create path needs none)
    from pathlib import Path as _Path
    return _Path(*parts)

REGION_FILE_NAME = "vgpu.region"

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
    return prebuilt if prebuilt is not None else _parsed_ffi(header_text)


def emit_module(out_path, header_path=None) -> None:
    """Write the out-of-line ABI module for the header (default: the one found
    now) with the header's text; atomic, so a reader never sees half of it."""
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


MAGIC = _const("HAMI_REGION_MAGIC")
VERSION = _const("HAMI_REGION_VERSION")
MAX_DEVICES = _const("HAMI_MAX_DEVICES")
MAX_PROCS = _const("HAMI_MAX_PROCS")
UUID_LEN = _const("HAMI_UUID_LEN")
STATE_READY = _const("HAMI_REGION_READY")
OWNER_RECLAIMING = _const("HAMI_OWNER_RECLAIMING")
DEVICE_SPILL = _const("HAMI_DEVICE_SPILL")  # allocations the card cannot hold may use managed memory
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


# Named tuples, not dataclasses: the runtime's create path writes a region,
# and dataclasses loads inspect.
class DeviceLimit(namedtuple("DeviceLimit", "uuid mem_limit_bytes sm_limit_pct flags", defaults=(0,))):
    __slots__ = ()
    uuid: str
    mem_limit_bytes: int  # 0 = no limit
    sm_limit_pct: int  # 0 or >= 100 = no limit
    flags: int  # HAMI_DEVICE_* bits (DEVICE_SPILL); written as given, also by set_limits

    @property
    def spill(self) -> bool:
        return bool(self.flags & DEVICE_SPILL)


class DeviceUsage(namedtuple("DeviceUsage", "mem_used ctx_used sm_busy_ns launches")):
    __slots__ = ()
    mem_used: int
    ctx_used: int
    sm_busy_ns: int
    launches: int


class SmTimes(namedtuple("SmTimes", "busy_ns throttled_ns paused_ns")):
    """A device's SM counters for the whole container, cumulative nanoseconds."""
    __slots__ = ()
    busy_ns: int  # measured kernel time
    throttled_ns: int  # launches waiting for the SM share
    paused_ns: int  # launches waiting for high-priority work


class ProcessUsage(namedtuple("ProcessUsage", "slot pid host_pid started_ns devices owner", defaults=((), 0,))):
    __slots__ = ()
    slot: int
    pid: int  # as the container sees it
    host_pid: int  # 0 when not known
    started_ns: int
    devices: Sequence[DeviceUsage]
    owner: int  # (pid << 32) | (start time in clock ticks & 0xffffffff)

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


# ---- pure checks ---------------------------------------------------------

def validate_limits(devices: Sequence[DeviceLimit], core_policy: str, priority: int) -> None:
    """Raises ValueError naming the field and the value for anything the header cannot hold."""
    if len(devices) > MAX_DEVICES:
        raise ValueError(f"devices: {len(devices)} devices, at most {MAX_DEVICES}")
    for i, dev in enumerate(devices):
        if len(dev.uuid.encode()) >= UUID_LEN:
            raise ValueError(f"devices[{i}].uuid: {dev.uuid!r} longer than {UUID_LEN - 1} bytes")
        if not isinstance(dev.mem_limit_bytes, int) or not 0 <= dev.mem_limit_bytes < 2**64:
            raise ValueError(f"devices[{i}].mem_limit_bytes: {dev.mem_limit_bytes!r} not a byte count")
        if not isinstance(dev.sm_limit_pct, int) or not 0 <= dev.sm_limit_pct <= 100:
            raise ValueError(f"devices[{i}].sm_limit_pct: {dev.sm_limit_pct!r} not in 0..100")
        if not isinstance(dev.flags, int) or isinstance(dev.flags, bool) or not 0 <= dev.flags < 2**32:
            raise ValueError(f"devices[{i}].flags: {dev.flags!r} not a 32-bit set of HAMI_DEVICE_* bits")
    if core_policy not in POLICIES:
        raise ValueError(f"core_policy: {core_policy!r} not one of {', '.join(POLICIES)}")
    if priority not in (0, 1):
        raise ValueError(f"priority: {priority!r} not 0 (high) or 1 (low)")


def _fill_limits(cregion, devices: Sequence[DeviceLimit], core_policy: str, priority: int) -> None:
    cregion.device_count = len(devices)
    cregion.core_policy = POLICIES[core_policy]
    cregion.priority = priority
    for i in range(MAX_DEVICES):
        target = cregion.devices[i]
        if i < len(devices):
            uuid = devices[i].uuid.encode()
            target.uuid = uuid + b"\0" * (UUID_LEN - len(uuid))
            target.mem_limit = devices[i].mem_limit_bytes
            target.sm_limit = devices[i].sm_limit_pct
            target.flags = devices[i].flags
        else:
            target.uuid = b"\0" * UUID_LEN
            target.mem_limit = 0
            target.sm_limit = 0
            target.flags = 0


def image(devices: Sequence[DeviceLimit], core_policy: str = "default", priority: int = 1,
          created_ns: int | None = None) -> bytes:
    """The bytes of a complete READY region with these limits and no process."""
    validate_limits(devices, core_policy, priority)
    cregion = ffi.new("struct hami_region *")
    cregion.magic = MAGIC
    cregion.version = VERSION
    cregion.state = STATE_READY
    cregion.created_ns = time.time_ns() if created_ns is None else created_ns
    _fill_limits(cregion, devices, core_policy, priority)
    return bytes(ffi.buffer(cregion))


# ---- file edges ------------------------------------------------------------

def create(path, devices: Sequence[DeviceLimit], core_policy: str = "default",
           priority: int = 1) -> Path:
    """Writes a READY region at `path` atomically (temp file, fsync, rename), mode 0666."""
    write_new(os.fspath(path), devices, core_policy, priority)
    return Path(path)


def write_new(path: str, devices: Sequence[DeviceLimit], core_policy: str = "default",
              priority: int = 1) -> None:
    """create() without pathlib (the runtime's create path)."""
    data = image(devices, core_policy, priority)
    from ..files import temp_beside
    fd, tmp = temp_beside(path, prefix=f".{os.path.basename(path)}.")
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(data)
            out.flush()
            os.fsync(out.fileno())
            os.fchmod(out.fileno(), 0o666)
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


class Region:
    """A mapped region file. Readers see the live counters libvgpu maintains."""

    def __init__(self, path, writable: bool = False):
        self.path = Path(path)
        self.writable = writable
        try:
            fd = os.open(self.path, os.O_RDWR if writable else os.O_RDONLY)
        except OSError as exc:
            raise RegionError(f"region {self.path}: {exc.strerror}") from None
        try:
            size = os.fstat(fd).st_size
            if size < REGION_SIZE:
                raise RegionError(
                    f"region {self.path}: truncated ({size} bytes, expected {REGION_SIZE})")
            access = mmap.ACCESS_WRITE if writable else mmap.ACCESS_READ
            self._map = mmap.mmap(fd, REGION_SIZE, access=access)
        finally:
            os.close(fd)
        if writable:
            self._c = ffi.from_buffer("struct hami_region *", self._map)
        else:
            # Read-only maps expose no writable buffer; a read-only cdata view over it.
            self._c = ffi.from_buffer("struct hami_region *", self._map, require_writable=False)
        try:
            if self._c.magic != MAGIC:
                raise RegionError(
                    f"region {self.path}: bad magic {self._c.magic:#x} (expected {MAGIC:#x})")
            if self._c.version != VERSION:
                raise RegionError(
                    f"region {self.path}: version {self._c.version} (this build reads {VERSION})")
            if self._c.device_count > MAX_DEVICES:
                raise RegionError(
                    f"region {self.path}: device_count {self._c.device_count} "
                    f"(at most {MAX_DEVICES})")
        except RegionError:
            self.close()
            raise

    # -- context manager
    def __enter__(self) -> "Region":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        if self._c is not None:
            ffi.release(self._c)
            self._c = None
            self._map.close()

    def _region(self):
        if self._c is None:
            raise RegionError(f"region {self.path}: closed")
        return self._c

    # -- header
    @property
    def state(self) -> str:
        return STATES.get(self._region().state, str(self._region().state))

    @property
    def created_ns(self) -> int:
        return self._region().created_ns

    @property
    def core_policy(self) -> str:
        value = self._region().core_policy
        return _POLICY_NAMES.get(value, str(value))

    @property
    def priority(self) -> int:
        return self._region().priority

    @property
    def devices(self) -> list[DeviceLimit]:
        c = self._region()
        return [
            DeviceLimit(
                uuid=ffi.string(c.devices[i].uuid, UUID_LEN).decode(errors="replace"),
                mem_limit_bytes=c.devices[i].mem_limit,
                sm_limit_pct=c.devices[i].sm_limit,
                flags=c.devices[i].flags,
            )
            for i in range(c.device_count)
        ]

    # -- usage
    def processes(self) -> list[ProcessUsage]:
        """Slots held by a process (free and being-reclaimed slots left out)."""
        c = self._region()
        count = c.device_count
        found = []
        for i in range(MAX_PROCS):
            slot = c.procs[i]
            owner = slot.owner
            if owner == 0 or owner == OWNER_RECLAIMING:
                continue
            found.append(ProcessUsage(
                slot=i, pid=slot.pid, host_pid=slot.host_pid, started_ns=slot.started_ns, owner=owner,
                devices=[DeviceUsage(slot.mem_used[d], slot.ctx_used[d], slot.sm_busy_ns[d],
                                     slot.launches[d]) for d in range(count)],
            ))
        return found

    def used_bytes(self, device: int) -> int:
        """What the limiter counts on `device`: the sum over every slot."""
        self._check_device(device)
        procs = self._region().procs
        return sum(procs[i].mem_used[device] for i in range(MAX_PROCS))

    def sm_times(self, device: int) -> SmTimes:
        """The SM counters libvgpu keeps for `device`; their deltas over a wall
        interval give the share used and whether launches were held."""
        self._check_device(device)
        st = self._region().sm[device]
        return SmTimes(st.busy_ns, st.throttled_ns, st.paused_ns)

    def _check_device(self, device: int) -> None:
        count = self._region().device_count
        if not 0 <= device < count:
            raise IndexError(f"device: {device} not in 0..{count - 1}")

    # -- updates (the runtime and hook own these; libvgpu only reads limits)
    def _writable(self):
        if not self.writable:
            raise RegionError(f"region {self.path}: opened read-only")
        return self._region()

    def set_limits(self, devices: Sequence[DeviceLimit], core_policy: str | None = None,
                   priority: int | None = None) -> None:
        c = self._writable()
        core_policy = self.core_policy if core_policy is None else core_policy
        priority = self.priority if priority is None else priority
        validate_limits(devices, core_policy, priority)
        _fill_limits(c, devices, core_policy, priority)

    def update_live(self, mem_limits: dict[int, int] | None = None,
                    sm_limits: dict[int, int] | None = None, core_policy: str | None = None,
                    priority: int | None = None) -> None:
        """Changes the limits of a region in use (hamictl update): only the fields
        given, each with one aligned store (a uint64_t or uint32_t field of a cffi
        struct is written whole; region.h's protocol says why no order between
        fields is needed). The UUIDs and the device count never change here."""
        c = self._writable()
        count = c.device_count
        mem_limits, sm_limits = mem_limits or {}, sm_limits or {}
        for i, value in list(mem_limits.items()) + list(sm_limits.items()):
            if not 0 <= i < count:
                raise IndexError(f"device: {i} not in 0..{count - 1}")
        current = self.devices
        validate_limits([d._replace(mem_limit_bytes=mem_limits.get(i, d.mem_limit_bytes),
                                    sm_limit_pct=sm_limits.get(i, d.sm_limit_pct))
                         for i, d in enumerate(current)],
                        self.core_policy if core_policy is None else core_policy,
                        self.priority if priority is None else priority)
        for i, pct in sm_limits.items():
            c.devices[i].sm_limit = pct
        if core_policy is not None:
            c.core_policy = POLICIES[core_policy]
        if priority is not None:
            c.priority = priority
        for i, limit in mem_limits.items():
            c.devices[i].mem_limit = limit

    def set_host_pid(self, pid: int, host_pid: int) -> int:
        """Records the host pid of every live slot of container pid `pid`; returns how many."""
        c = self._writable()
        updated = 0
        for i in range(MAX_PROCS):
            slot = c.procs[i]
            if slot.owner not in (0, OWNER_RECLAIMING) and slot.pid == pid:
                slot.host_pid = host_pid
                updated += 1
        return updated


def open(path, writable: bool = False) -> Region:  # noqa: A001 - module-level API name
    return Region(path, writable=writable)


def region_path(container_dir) -> Path:
    return Path(container_dir) / REGION_FILE_NAME

