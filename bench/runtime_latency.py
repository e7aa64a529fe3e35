"""Added latency of hami-runtime against runc, side by side in one run.

  .venv/bin/python bench/runtime_latency.py [--iterations N] [--phases] [--real-driver | --slow-nvml]

Runs on the simulated GPU (build/sim/hami.toml, state in a temp dir) with a
busybox bundle whose command is `true` and a private runc --root. Three
kinds, timed in turn within every iteration so that all see the same load
(which goes first turns with each iteration: what one leaves behind, such as
the kernel's cleanup after a delete, falls on each in turn):

  runc     runc itself, the plain bundle
  none     hami-runtime (the C launcher as `make build` makes it), the plain
           bundle: a container that asks for no GPU
  gpu      hami-runtime, the bundle with hami.io/gpumem 1000, gpucores 30

and two operations: `create` + `delete`, and `run` (foreground, `true`
exits; its delete follows, untimed). Each is timed warm (the state dir as
the previous iteration left it: the config and discovery caches there, and
the create server listening) and cold (a fresh state dir, as /run/hami is
after every reboot; the config file itself is older than the config cache's
settling time, as on a node); and the GPU kind alone in three more rows
(GPU_ROWS): on a fresh state dir after a container without request (untimed),
as a Kubernetes pod's sandbox comes before its containers: that create starts
the create server, which the bench lets start; on a warm state dir whose create
server has ended (killed, as it ends after create_server_idle_s without a
request: the first GPU create after a quiet spell); and the same after a
container without request. The first create on a fresh state dir starts the server
(once that create's runc has exited), and after a GPU container's delete the
allocation is freed by a detached release (the server's); the bench waits
until the server listens and serves nothing, and no detached Python runs,
before the next command, so that they take no CPU from whatever is timed next.

Prints a markdown table: median and p90 wall ms per kind; the added ms of
each hami kind, the median of its differences to runc's sample of the same
iteration (paired: both saw the same moment's load); runc's median CPU ms
(user + system of the command and what it waited for, hooks included) and
each kind's added CPU ms, paired the same way, the GPU kind's plus the
create server's CPU (its own and its children's, which served the creates
and releases: all it used during the row's samples, per GPU sample, as /proc
counts it in 10 ms clock ticks); then the create and the delete of `create` + `delete` apart (wall, added
medians paired the same way); then passthrough `list`/`state` rows; then the
launcher's own cost on the fast path (a create without request, with
/bin/true as the runtime, against /bin/true alone: its exec, and the config
and the spec read).
The state dir, the runc root and the bundles are on a tmpfs (/dev/shm), as
/run is on a node.

--phases: the runtime's log at debug, so that each GPU create writes its
phases (hami_runtime/phases.py); a table of each phase's median per row, and
what follows the trace (the launcher's exec of runc, runc's create and the
createRuntime hook: the create's wall time less the traced total) against
runc's own create, of the plain spec and of the spec the runtime wrote, its hook
taken out (run beside each GPU create, untimed otherwise): the mounts and devices
the runtime adds apart from the launcher's exec of runc and the hook.
--slow-nvml: the simulated NVML as slow as an H200 node's (sim_runtime.SLOW_NVML:
its first nvmlInit and first device handle), so that a cold create waits for
NVML as a node's does.
--real-driver: the node's own NVIDIA driver instead of the simulator (driver
files from the host's ld cache, NVML through the loader, /dev, /proc/devices;
libvgpu from build/), and a rootfs holding the host's dynamically linked
`true` and its libraries (so the container's process loads libvgpu through
/etc/ld.so.preload, as a workload does). Needs root, runc and a GPU.
"""
import argparse
import json
import os
import re
import resource
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from sim_runtime import ROOT, SLOW_NVML, private_config, sim_config_missing, slow_nvml_env

sys.path.insert(0, str(ROOT))
from tests.conftest import is_spare, processes_with_env, serving_children  # noqa: E402

LAUNCHER = ROOT / "build" / "hami-runtime"
RUNC = shutil.which("runc") or "/usr/sbin/runc"
GPU = {"hami.io/gpumem": "1000", "hami.io/gpucores": "30"}
SETTLED_S = 2.5  # config_cache.SETTLED_NS, and some
# The GPU kind's own rows: (the runc samples it is set against, what the table calls it).
GPU_ROWS = {
    "sandbox first": ("cold", "cold, a container without request first"),
    "server ended": ("warm", "warm, the create server ended"),
    "server ended then sandbox first": ("warm", "warm, the create server ended, a container without request first"),
}


def _children_cpu():
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def timed(argv, env):
    """(wall ms, CPU ms of the command and what it waited for, hooks included).
    The wait blocks in waitpid: a wait with a timeout polls, with sleeps that
    double up to 50 ms, and would round every time up to its next poll."""
    cpu, start = _children_cpu(), time.perf_counter()
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, env=env)
    watchdog = threading.Timer(60, proc.kill)
    watchdog.start()
    try:
        rc = proc.wait()
    finally:
        watchdog.cancel()
    wall, used = (time.perf_counter() - start) * 1000, (_children_cpu() - cpu) * 1000
    if rc != 0:
        raise subprocess.CalledProcessError(rc, argv)
    return wall, used


def quiet(argv, env):
    subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL, env=env, timeout=60)


def dynamic_rootfs(rootfs: Path) -> None:
    """rootfs/bin/true, the host's, with the libraries ldd names, at their paths."""
    true = Path(shutil.which("true") or "/bin/true").resolve()
    (rootfs / "bin").mkdir(parents=True, exist_ok=True)
    shutil.copy2(true, rootfs / "bin" / "true")
    listed = subprocess.run(["ldd", str(true)], capture_output=True, text=True).stdout
    for path in re.findall(r"(/\S+) \(0x", listed):
        target = rootfs / path.lstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(os.path.realpath(path), target)


def nvidia_gpus() -> list:
    """The GPUs the NVIDIA kernel driver lists (none without the driver)."""
    try:
        return os.listdir("/proc/driver/nvidia/gpus")
    except OSError:
        return []


def real_driver_config(work: Path) -> Path:
    """The node's driver at its defaults (driver_root /, /dev, the loader's NVML)."""
    config = work / "hami.toml"
    config.write_text(f'runtime = "{RUNC}"\nstate_dir = "{work / "state"}"\n'
                      f'libvgpu = "{ROOT / "build" / "libvgpu.so"}"\n')
    return config


class Setup:
    def __init__(self, work: Path, phases=False, real_driver=False, slow_nvml=False):
        self.work = work
        self.root = work / "runc-root"
        self.rootfs = work / "rootfs"
        self.state = work / "state"
        self.log = work / "hami.log" if phases else None
        if real_driver:
            dynamic_rootfs(self.rootfs)
        else:
            (self.rootfs / "bin").mkdir(parents=True)
            shutil.copy2(shutil.which("busybox") or "/bin/busybox", self.rootfs / "bin" / "busybox")
            for applet in ("sh", "sleep", "true"):
                (self.rootfs / "bin" / applet).symlink_to("busybox")
        subprocess.run([RUNC, "spec"], cwd=work, check=True)
        self.template = json.loads((work / "config.json").read_text())
        self.template["process"]["terminal"] = False
        self.template["process"]["args"] = ["true"]
        self.template["root"] = {"path": str(self.rootfs), "readonly": False}
        if real_driver:
            config = real_driver_config(work)
            self.env = {**os.environ, "HAMI_CONFIG": str(config)}
        else:
            config = private_config(work)
            (work / "simstate").mkdir()
            config.write_text(config.read_text().replace(
                f'"{ROOT / "build" / "sim" / "shared"}"', f'"{work / "simstate"}"'))
            self.env = {**os.environ, "HAMI_CONFIG": str(config),
                        "HAMI_SIM_STATE": str(work / "simstate" / "gpu.state")}
            if slow_nvml:
                self.env.update(slow_nvml_env(work))
        if phases:  # top-level keys, ahead of any table
            config.write_text(f'log_level = "debug"\nlog_file = "{self.log}"\n' + config.read_text())
        self.env.pop("HAMI_LAUNCHER", None)
        self.specs = {}
        self.edited = work / "edited"
        self.edited.mkdir()

    def bundle(self, name, annotations=None):
        path = self.work / name
        path.mkdir(exist_ok=True)
        spec = json.loads(json.dumps(self.template))
        if annotations:
            spec["annotations"] = annotations
        self.specs[path] = json.dumps(spec).encode()
        return path

    def fresh_spec(self, bundle):
        """The bundle's spec as the engine wrote it (a GPU create edits it)."""
        (bundle / "config.json").write_bytes(self.specs[bundle])

    def g(self, *args):
        return ["--root", str(self.root)] + list(args)

    def released(self, timeout=10.0):
        """Waits until no allocation is left (the detached release is done)."""
        deadline = time.monotonic() + timeout
        path = self.state / "allocations.json"
        while time.monotonic() < deadline:
            try:
                if not json.loads(path.read_text()).get("allocations"):
                    return
            except (OSError, ValueError):
                return
            time.sleep(0.005)

    def warmed(self, timeout=20.0):
        """Waits until a warm-up the launcher started (cache/.warm-up) has filled the caches."""
        cache = self.state / "cache"
        if not (cache / ".warm-up").exists():
            return
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and not all(
                (cache / name).exists() for name in ("config.json", "gpus.json", "driver-files.json")):
            time.sleep(0.005)

    def server_processes(self) -> list:
        """The create servers of this bench's config, their spares and children serving a request."""
        return processes_with_env(b"HAMI_CREATE_SERVER=1", f"HAMI_CONFIG={self.env['HAMI_CONFIG']}".encode())

    def servers(self) -> list:
        """The create servers of this bench's config (and children serving a request; not a spare)."""
        return [pid for pid in self.server_processes() if not is_spare(pid)]

    def server_answers(self) -> bool:
        """The server accepts a connection (which it serves as a request it declines)."""
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
            try:
                probe.connect(str(self.state / "server" / "socket"))
            except OSError:
                return False
        return True

    def server_lock_held(self) -> bool:
        """Someone holds the state dir's server lock: a server runs or is about
        to start (read in /proc/locks: taking the lock could keep one from starting)."""
        try:
            inode = os.stat(self.state / "server" / "lock").st_ino
        except OSError:
            return False
        with open("/proc/locks") as locks:
            return any(f":{inode}" == token[token.rfind(":"):] for line in locks if "FLOCK" in line
                       for token in line.split() if token.count(":") == 2)

    def server_quiet(self) -> bool:
        """No create server of ours has a child serving a request (or one not yet reaped)."""
        return not any(serving_children(pid) for pid in self.servers())

    def background_gone(self, timeout=20.0):
        """Waits until no detached release or warm-up the launcher started is
        still running, a create server it started is listening (or none was
        started), and none serves a request."""
        deadline = time.monotonic() + timeout

        def until(done):
            while not done() and time.monotonic() < deadline:
                time.sleep(0.005)
        until(lambda: not processes_with_env(b"HAMI_WARM_UP=1") and not processes_with_env(b"HAMI_DELETE_DONE=1"))
        until(lambda: not self.server_lock_held() or self.server_answers())
        until(self.server_quiet)

    def server_cpu(self) -> dict:
        """pid -> CPU ms each create server and the children it reaped have
        used (in /proc's clock ticks)."""
        used = {}
        for pid in self.servers():
            try:
                with open(f"/proc/{pid}/stat", "rb") as handle:
                    fields = handle.read().rpartition(b")")[2].split()
            except OSError:
                continue
            used[pid] = sum(int(f) for f in fields[11:15]) * 1000 / os.sysconf("SC_CLK_TCK")  # u+s, children's
        return used

    def server_ended(self, timeout=10.0):
        """Ends the create server and its spare, as create_server_idle_s does (its socket left)."""
        deadline = time.monotonic() + timeout
        while (pids := self.server_processes()) and time.monotonic() < deadline:
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            time.sleep(0.005)

    def fresh_state(self):
        self.released()
        self.warmed()
        self.background_gone()
        shutil.rmtree(self.state, ignore_errors=True)


def served_cpu(before: dict, after: dict) -> float:
    """CPU ms a create server spent between two server_cpu() readings (one that
    started or ended between them served nothing: it is not counted)."""
    return sum(after[pid] - before[pid] for pid in after if pid in before)


def server_share(served: dict, op: str, warmth: str) -> float:
    """The create server's CPU over every sample of a row (whatever kind's
    sample its clock ticks fell in), per GPU sample: all of it is the GPU
    containers' (their creates and releases, and its own accepts and forks).
    A cold row's GPU container runs a Python of its own: no server serves it."""
    total = sum(sum(samples) for (o, w, _), samples in served.items() if (o, w) == (op, warmth))
    return total / len(served[(op, warmth, "gpu")]) if total else 0.0


def stats(samples):
    ordered = sorted(samples)
    return statistics.median(ordered), ordered[min(len(ordered) - 1, int(len(ordered) * 0.9))]


PHASE_LINE = re.compile(r"create (\S+) phases: (.*?) total=([\d.]+)ms(.*)$")
SPAN = re.compile(r"(\w+)=([\d.]+)ms")


def read_phases(log: Path) -> dict:
    """container id -> ({phase: ms}, traced total ms, [notes]) from the runtime's debug lines."""
    found = {}
    for line in log.read_text(errors="replace").splitlines():
        got = PHASE_LINE.search(line)
        if got:
            spans = {name: float(ms) for name, ms in SPAN.findall(got.group(2))}
            notes = [n.strip() for n in got.group(4).split(";") if n.strip()]
            found[got.group(1)] = (spans, float(got.group(3)), notes)
    return found


def print_phases(found: dict, traced: dict, runc_create: dict, edited: dict) -> None:
    """Each phase's median per row (operation, state dir) of the GPU kind; then
    what followed the trace (wall less traced: the launcher's exec of runc,
    runc's create or run, the createRuntime hook) against runc's own create,
    of the plain spec and of the runtime's edited one without its hook."""
    rows = {}  # (op, warmth) -> [(spans, total, notes, wall)]
    for cid, (op, warmth, wall) in traced.items():
        if cid in found:
            rows.setdefault((op, warmth), []).append((*found[cid], wall))
    if not rows:
        print("\nno create phases in the runtime's log (its log_level debug, log_file)")
        return
    keys = [k for k in ((o, w) for o in ("create+delete", "run") for w in ("warm", "cold", *GPU_ROWS))
            if k in rows]
    names = []
    for key in keys:
        for spans, *_ in rows[key]:
            names += [name for name in spans if name not in names]
    first = ("launcher", "launcher_python", "handoff")  # the way in: served, or a Python of its own
    names = [n for n in first if n in names] + [n for n in names if n not in first]
    heads = [f"`{'create' if o == 'create+delete' else o}` {w}" for o, w in keys]
    print("\nGPU create phases, median ms of each (hami_runtime/phases.py; runtime log at debug); "
          "samples per column: " + ", ".join(str(len(rows[k])) for k in keys) + "\n")
    print("| phase | " + " | ".join(heads) + " |")
    print("| --- | " + " | ".join("---:" for _ in keys) + " |")

    def cell(values):
        return f"{statistics.median(values):.2f}" if values else ""
    for name in names:
        print(f"| {name} | " + " | ".join(cell([sp[name] for sp, *_ in rows[k] if name in sp]) for k in keys) + " |")
    print("| traced total | " + " | ".join(cell([t for _, t, _, _ in rows[k]]) for k in keys) + " |")
    print("| wall less traced (runc's exec and create, the hook; for `run` the container too) | "
          + " | ".join(cell([w - t for _, t, _, w in rows[k]]) for k in keys) + " |")
    print("| runc's own `create`, the same iterations | "
          + " | ".join(f"{runc_create[GPU_ROWS.get(w, (w,))[0]]:.2f}" if o == "create+delete" else ""
                       for o, w in keys) + " |")
    for at, what in ((0, "runc's own `create`, beside each GPU create"),
                     (1, "the same, the runtime's edited spec without its hook")):
        print(f"| {what} | " + " | ".join(cell([pair[at] for pair in edited.get(w, [])]) if o == "create+delete"
                                          else "" for o, w in keys) + " |")
    print("\nwhat the creates noted (how many of each column's samples; numbers are medians):\n")
    for key, head in zip(keys, heads):
        kinds = {}
        for _, _, notes, _ in rows[key]:
            for text in notes:
                kinds.setdefault(re.sub(r"[\d.]+ms", "#ms", re.sub(r"^\d+ ", "# ", text)), []).append(text)
        said = []
        for shape, texts in kinds.items():
            numbers = [[float(x) for x in re.findall(r"(?:^|\s)([\d.]+)(?=ms|\s)", t)] for t in texts]
            medians = [statistics.median(col) for col in zip(*numbers)] if all(numbers) else []
            filled = shape
            for value in medians:
                filled = filled.replace("#", f"{value:g}", 1)
            said.append(f"{filled} ({len(texts)})")
        print(f"- {head}: " + "; ".join(said))


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--iterations", type=int, default=20)
    parser.add_argument("--phases", action="store_true", help="each GPU create's phases, from the runtime's debug log")
    parser.add_argument("--real-driver", action="store_true", help="the node's NVIDIA driver, not the simulator")
    parser.add_argument("--slow-nvml", action="store_true", help="the simulated NVML as slow as an H200 node's")
    options = parser.parse_args()
    n = options.iterations
    if not options.real_driver and sim_config_missing():
        return 1
    if options.real_driver and not nvidia_gpus():
        print("runtime_latency --real-driver: no GPU (/proc/driver/nvidia/gpus lists none); nothing measured")
        return 0
    if not os.access(RUNC, os.X_OK) or os.geteuid() != 0:
        print(f"runtime_latency: needs root and runc ({RUNC} not found)" if os.geteuid() == 0 else
              "runtime_latency: needs root (runc makes the containers)", file=sys.stderr)
        return 1
    from hami_runtime.node import region
    if not LAUNCHER.exists() or not (ROOT / "build" / "libvgpu.so").exists() or not region.prebuilt():
        print("run `make build` first (build/hami-runtime, build/libvgpu.so, and the region layout "
              "hami_runtime/node/_region_ffi.py made from libvgpu_src/region.h: without it each cold "
              "create parses the header, ~30 ms)", file=sys.stderr)
        return 1
    work = Path(tempfile.mkdtemp(prefix="hami-bench-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None))
    if options.real_driver and options.slow_nvml:
        parser.error("--slow-nvml is the simulator's; --real-driver has the node's own NVML")
    s = Setup(work, phases=options.phases, real_driver=options.real_driver, slow_nvml=options.slow_nvml)
    env = s.env
    hami = [str(LAUNCHER)]
    plain = s.bundle("plain")
    gpu = s.bundle("gpu", GPU)
    kinds = {"runc": ([RUNC], plain), "none": (hami, plain), "gpu": (hami, gpu)}
    results = {}  # (operation, warmth, kind) -> [(wall, cpu)]
    served = {}   # (operation, warmth, kind) -> [CPU ms of the create server]
    parts = {}    # (warmth, kind) -> [(create wall ms, delete wall ms)]
    traced = {}   # GPU container id -> (operation, warmth, the create's (or run's) wall ms)
    edited = {}   # warmth -> [(runc's own create of the plain spec, of a GPU create's edited one
                  #              without its hooks), ms, side by side]

    def edited_spec_create(warmth, bundle, cid):
        """runc's own create of the spec the runtime just wrote, its hooks taken out, and of the
        plain spec, in turn, beside the GPU container (the edited spec's host files are that
        allocation's): what the mounts and devices the runtime adds cost runc, apart from the
        launcher's exec of runc and the hook."""
        spec = json.loads((bundle / "config.json").read_text())
        spec.pop("hooks", None)
        (s.edited / "config.json").write_text(json.dumps(spec))
        walls = {}
        turn = len(edited.get(warmth, [])) % 2  # which goes first changes with each of the row's samples
        for name, path in sorted({"plain": plain, "edited": s.edited}.items(), reverse=turn == 1):
            walls[name], _ = timed([RUNC] + s.g("create", "--bundle", str(path), f"{name}-{cid}"), env)
            quiet([RUNC] + s.g("delete", "-f", f"{name}-{cid}"), env)
        edited.setdefault(warmth, []).append((walls["plain"], walls["edited"]))

    def sample(op, warmth, kind, i):
        cmd, bundle = kinds[kind]
        cid = f"{kind}-{op}-{warmth}-{i}".replace(" ", "-").replace("+", "-")
        s.fresh_spec(bundle)
        if warmth in ("cold", "sandbox first"):
            s.fresh_state()
        if warmth.startswith("server ended"):
            s.server_ended()
        if warmth.endswith("sandbox first"):  # a pod's: a container without request, untimed, then the GPU one
            quiet(hami + s.g("create", "--bundle", str(plain), f"sandbox-{cid}"), env)
            quiet(hami + s.g("delete", "-f", f"sandbox-{cid}"), env)
            s.warmed()
            s.background_gone()
        served_before = s.server_cpu()
        if op == "create+delete":
            wall, cpu = timed(cmd + s.g("create", "--bundle", str(bundle), cid), env)
            if s.log is not None and kind == "gpu":
                edited_spec_create(warmth, bundle, cid)
            w2, c2 = timed(cmd + s.g("delete", cid), env)
            parts.setdefault((warmth, kind), []).append((wall, w2))
            traced[cid] = (op, warmth, wall)
            wall, cpu = wall + w2, cpu + c2
        else:
            wall, cpu = timed(cmd + s.g("run", "--bundle", str(bundle), cid), env)
            traced[cid] = (op, warmth, wall)
            quiet(cmd + s.g("delete", "-f", cid), env)
        s.released()
        s.warmed()
        deadline = time.monotonic() + 20
        while not s.server_quiet() and time.monotonic() < deadline:
            time.sleep(0.005)
        served_after = s.server_cpu()
        s.background_gone()
        if warmth != "cold":  # a cold one starts the server
            served.setdefault((op, warmth, kind), []).append(served_cpu(served_before, served_after))
        results.setdefault((op, warmth, kind), []).append((wall, cpu))

    try:
        # the config older than the cache's settling time, as a node's is; one
        # warm-up of each kind, untimed
        time.sleep(SETTLED_S)
        for kind in kinds:
            sample("create+delete", "warm", kind, "warmup")
        results.clear()
        served.clear()
        parts.clear()
        traced.clear()
        edited.clear()
        load_before = os.getloadavg()
        passthrough = {"list": ([], []), "state": ([], [])}
        quiet([RUNC] + s.g("create", "--bundle", str(plain), "resident"), env)
        for i in range(n):
            for op in ("create+delete", "run"):
                for warmth in ("warm", "cold"):
                    order = list(kinds)[i % 3:] + list(kinds)[:i % 3]  # each kind first, second, third in turn
                    for kind in order:
                        sample(op, warmth, kind, i)
                for warmth in GPU_ROWS:
                    sample(op, warmth, "gpu", i)
            for name, args in (("list", ("list",)), ("state", ("state", "resident"))):
                passthrough[name][0].append(timed([RUNC] + s.g(*args), env))
                passthrough[name][1].append(timed(hami + s.g(*args), env))
        # the launcher's own cost on the fast path (its exec, the config and the spec
        # read): a config whose runtime is /bin/true, against /bin/true alone
        true_config = work / "true.toml"
        true_config.write_text(f'runtime = "/bin/true"\nstate_dir = "{s.state}"\n')
        true_env = {**env, "HAMI_CONFIG": str(true_config)}
        alone = ([], [])
        for i in range(200):
            alone[0].append(timed(["/bin/true"] + s.g("create", "--bundle", str(plain), "t"), true_env))
            alone[1].append(timed(hami + s.g("create", "--bundle", str(plain), "t"), true_env))
        load_after = os.getloadavg()
        driver = ("the node's NVIDIA driver" if options.real_driver else
                  "the simulated GPU" + (f" (its NVML as slow as an H200 node's: {SLOW_NVML})" if options.slow_nvml else ""))
        print(f"runtime latency on {driver}, {n} iterations, kinds in turn within each, the first changing with each "
              f"(runc; hami-runtime "
              f"{os.path.relpath(LAUNCHER, ROOT)}, no request; the same, GPU request); {os.cpu_count()} CPUs; "
              f"load average {load_before[0]:.2f} before, {load_after[0]:.2f} after\n")
        print("| operation | state dir | runc ms | no request ms | GPU ms | no request added | GPU added "
              "| runc p90 | no request p90 | GPU p90 | runc CPU ms | no request added CPU | GPU added CPU |")
        print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
        for op in ("create+delete", "run"):
            for warmth in ("warm", "cold"):
                runs = {k: results[(op, warmth, k)] for k in kinds}
                walls = {k: stats([w for w, _ in runs[k]]) for k in kinds}
                # added: the median of each iteration's difference to runc's sample
                added = {k: statistics.median(h[0] - r[0] for h, r in zip(runs[k], runs["runc"]))
                         for k in ("none", "gpu")}
                cpu_added = {k: statistics.median(h[1] - r[1] for h, r in zip(runs[k], runs["runc"]))
                             for k in ("none", "gpu")}
                cpu_added["gpu"] += server_share(served, op, warmth)
                runc_cpu = statistics.median(c for _, c in runs["runc"])
                print(f"| `{op}` | {warmth} | {walls['runc'][0]:.1f} | {walls['none'][0]:.1f} | {walls['gpu'][0]:.1f} "
                      f"| {added['none']:+.1f} | {added['gpu']:+.1f} "
                      f"| {walls['runc'][1]:.1f} | {walls['none'][1]:.1f} | {walls['gpu'][1]:.1f} "
                      f"| {runc_cpu:.1f} | {cpu_added['none']:+.1f} | {cpu_added['gpu']:+.1f} |")
            # the GPU kind's own rows, against runc's samples of the same iterations
            for warmth, (against, title) in GPU_ROWS.items():
                gpu_runs, runc_runs = results[(op, warmth, "gpu")], results[(op, against, "runc")]
                median, p90 = stats([w for w, _ in gpu_runs])
                added = statistics.median(h[0] - r[0] for h, r in zip(gpu_runs, runc_runs))
                cpu_added = statistics.median(h[1] - r[1] for h, r in zip(gpu_runs, runc_runs)) + \
                    server_share(served, op, warmth)
                print(f"| `{op}` | {title} | | | {median:.1f} | | {added:+.1f} "
                      f"| | | {p90:.1f} | | | {cpu_added:+.1f} |")
        print("\n| `create+delete`, each part | state dir | runc ms | no request added | GPU added |")
        print("| --- | --- | ---: | ---: | ---: |")
        for at, name in ((0, "`create`"), (1, "`delete`")):
            for warmth in ("warm", "cold"):
                runc_part = [p[at] for p in parts[(warmth, "runc")]]
                added = {k: statistics.median(h[at] - r for h, r in zip(parts[(warmth, k)], runc_part))
                         for k in ("none", "gpu")}
                print(f"| {name} | {warmth} | {statistics.median(runc_part):.1f} | {added['none']:+.1f} "
                      f"| {added['gpu']:+.1f} |")
        print("\n| passthrough | runc ms | hami ms | added | runc CPU ms | hami CPU ms |")
        print("| --- | ---: | ---: | ---: | ---: | ---: |")
        for name, (runc_runs, hami_runs) in passthrough.items():
            rm, hm = stats([w for w, _ in runc_runs])[0], stats([w for w, _ in hami_runs])[0]
            rc, hc = stats([c for _, c in runc_runs])[0], stats([c for _, c in hami_runs])[0]
            print(f"| `{name}` | {rm:.1f} | {hm:.1f} | {hm - rm:+.1f} | {rc:.1f} | {hc:.1f} |")
        base, launched = stats([w for w, _ in alone[0]])[0], stats([w for w, _ in alone[1]])[0]
        low, low_launched = min(w for w, _ in alone[0]), min(w for w, _ in alone[1])
        print(f"\nthe launcher alone (create without request, /bin/true as the runtime, 200 runs each, "
              f"alternating): median {launched:.2f} ms against {base:.2f} ms for /bin/true alone "
              f"({launched - base:+.2f} ms); fastest {low_launched:.2f} against {low:.2f} ms "
              f"({low_launched - low:+.2f} ms)")
        if s.log is not None:
            runc_create = {w: statistics.median(p[0] for p in parts[(w, "runc")]) for w in ("warm", "cold")}
            print_phases(read_phases(s.log), traced, runc_create, edited)
    except subprocess.CalledProcessError:
        if s.log is not None and s.log.exists():  # why, where the runtime said it
            print("the runtime's log, its end:\n" + "\n".join(s.log.read_text().splitlines()[-5:]), file=sys.stderr)
        raise
    finally:
        quiet([RUNC] + s.g("delete", "-f", "resident"), env)
        for cid in (subprocess.run([RUNC] + s.g("list", "-q"), capture_output=True, text=True).stdout.split()):
            quiet([RUNC] + s.g("delete", "-f", cid), env)
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
