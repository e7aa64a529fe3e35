"""A node for tests and benchmarks that drive hami-runtime with real runc on the
simulated GPU: a busybox (+ glibc) rootfs with the test programs, a runc spec
template, a private copy of the simulated driver root, and Node (one node's
config, state dir, runc root, bundles, commands). Plain functions: the fixtures
in conftest.py wrap them, bench/sm_accuracy.py uses them directly."""
import json
import os
import shutil
import subprocess
import sys
import time

from tests.conftest import BUILD, LIBVGPU, ROOT, SIM, PidService

RUNC = shutil.which("runc") or "/usr/sbin/runc"
SM_LOAD = BUILD / "tests" / "sm" / "sm_load"  # tests/libvgpu/sm_load.c: a kernel loop that counts
BUSYBOX = shutil.which("busybox") or "/bin/busybox"
SIM_CONFIG = SIM / "hami.toml"
CUDA_ALLOC = BUILD / "runtime-tests" / "cuda_alloc"
RUNTIME = [sys.executable, "-m", "hami_runtime"]
LAUNCHER = BUILD / "hami-runtime"  # the C front (make build); falls back to RUNTIME
HAMICTL = [sys.executable, "-c", "import sys; from hami_runtime.tools.hamictl import main; sys.exit(main())"]
APPLETS = ("sh", "ls", "cat", "env", "sleep", "grep", "test", "echo", "true", "stat", "readlink",
           "dd", "rm", "mv", "ln", "cp", "truncate", "mount", "umount", "mkdir", "chroot", "cmp", "id",
           "sed", "touch", "whoami", "cut", "dpkg", "su", "head", "wc", "find", "mknod", "unshare")
TIMEOUT = 60
SIM_CONF = "sim.conf"  # a node's simulated-driver config, beside its state file


def sim_missing():
    """The first of what `make build sim` makes that is missing, or None."""
    return next((p for p in (SIM_CONFIG, SIM / "lib" / "libnvidia-ml.so.1", SIM / "lib" / "libcuda.so.1",
                             LIBVGPU) if not p.exists()), None)


def copy_sim(root):
    """A private copy of the simulated driver root and libvgpu, so that a
    rebuild of build/ while they run cannot change them underfoot."""
    for sub in ("lib", "bin", "etc"):
        shutil.copytree(SIM / sub, root / sub, symlinks=True)
    shutil.copy2(LIBVGPU, root / "libvgpu.so")
    return root


def make_rootfs(root):
    """busybox, glibc (the host's, at its paths) and the test programs."""
    (root / "bin").mkdir()
    shutil.copy2(BUSYBOX, root / "bin" / "busybox")
    for applet in APPLETS:
        (root / "bin" / applet).symlink_to("busybox")
    for lib in ("/lib/x86_64-linux-gnu/libc.so.6", "/lib64/ld-linux-x86-64.so.2"):
        if os.path.exists(lib):
            target = root / lib.lstrip("/")
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(os.path.realpath(lib), target)
    if CUDA_ALLOC.exists():
        shutil.copy2(CUDA_ALLOC, root / "bin" / "cuda_alloc")
    subprocess.run(["make", "-s", "-C", str(ROOT), "sm-tests"], check=True, timeout=240,
                   stdout=subprocess.DEVNULL)
    shutil.copy2(SM_LOAD, root / "bin" / "sm_load")
    for d in ("proc", "sys", "dev", "tmp", "etc"):
        (root / d).mkdir(exist_ok=True)
    for d in [root] + [p for p in root.rglob("*") if p.is_dir() and not p.is_symlink()]:
        d.chmod(0o755)  # any container user may walk it
    (root / "tmp").chmod(0o1777)
    return root


def spec_template(where):
    subprocess.run([RUNC, "spec"], cwd=where, check=True, timeout=TIMEOUT)
    spec = json.loads((where / "config.json").read_text())
    spec["process"]["terminal"] = False
    return spec


def _special_files(directory, names):
    """copytree's ignore: what is neither a regular file, a dir nor a link."""
    import stat
    return [n for n in names
            if not stat.S_ISREG(mode := os.lstat(os.path.join(directory, n)).st_mode)
            and not stat.S_ISDIR(mode) and not stat.S_ISLNK(mode)]


class Node:
    """One test's node: config, state dir, runc root, bundles, commands."""

    def __init__(self, tmp, rootfs, template, sim_root, pid_service=True):
        self.tmp = tmp
        self.sim_root = sim_root
        self.sim_state = tmp / "simstate"  # the simulator's cross-process state, this test's own
        self.sim_state.mkdir()
        self.sim_state.chmod(0o1777)
        # containers' processes learn their host pids from it, as a real driver knows them
        # (without it, host readers find them in /proc: tests/simgpu/sim_pids.c)
        self.pids = PidService(self.sim_state) if pid_service else None
        self.rootfs = rootfs
        self.template = template
        self.state_dir = tmp / "state"
        self.runc_root = tmp / "runc-root"
        self.config = tmp / "hami.toml"
        self.write_config()

    def write_config(self, **overrides):
        text = SIM_CONFIG.read_text().replace(str(SIM / "state"), str(self.state_dir))
        for sub in ("lib", "bin", "etc"):
            text = text.replace(f"{SIM}/{sub}/", f"{self.sim_root}/{sub}/")
        text = text.replace(f'"{SIM}"', f'"{self.sim_root}"')
        text = text.replace(f'"{SIM}/shared"', f'"{self.sim_state}"')
        text = text.replace(str(LIBVGPU), str(self.sim_root / "libvgpu.so"))
        if (self.sim_state / SIM_CONF).exists():   # containers read it where they find the state
            text = text.replace("[extra_env]\n", f'[extra_env]\nHAMI_SIM_CONFIG = "/run/hami-sim/{SIM_CONF}"\n')
        lines = []
        for line in text.splitlines():
            key = line.split("=", 1)[0].strip()
            if key in overrides:
                continue
            lines.append(line)
        head = [f"{k} = {json.dumps(v)}" for k, v in overrides.items()]
        self.config.write_text("\n".join(head + lines) + "\n")

    def simulate(self, **keys):
        """The simulated driver's config for this node (tests/simgpu/README.md), its
        processes on the host and in containers alike."""
        (self.sim_state / SIM_CONF).write_text("".join(f"{k} = {v}\n" for k, v in keys.items()))
        self.write_config()

    @property
    def env(self):
        env = dict(os.environ)
        env["HAMI_CONFIG"] = str(self.config)
        env["HAMI_SIM_STATE"] = str(self.sim_state / "gpu.state")
        if (self.sim_state / SIM_CONF).exists():
            env["HAMI_SIM_CONFIG"] = str(self.sim_state / SIM_CONF)
        return env

    def private_rootfs(self, name):
        """A copy of the rootfs for one container that changes it (the shared one
        stays as made). Device nodes, FIFOs and sockets that earlier containers left in
        the shared one (a tenant's mknod in /tmp) are not the image's: not copied."""
        path = self.tmp / "rootfs" / name
        shutil.copytree(self.rootfs, path, symlinks=True, ignore=_special_files)
        return path

    def bundle(self, name, annotations=None, env=(), args=("sleep", "60"), rootfs=None, readonly=False):
        path = self.tmp / "bundles" / name
        path.mkdir(parents=True)
        spec = json.loads(json.dumps(self.template))
        spec["root"] = {"path": str(rootfs or self.rootfs), "readonly": readonly}
        spec["process"]["args"] = list(args)
        spec["process"]["env"] += list(env)
        if annotations:
            spec["annotations"] = dict(annotations)
        (path / "config.json").write_text(json.dumps(spec, indent=2))
        return path

    def runtime_argv(self, *args, log_format=None, cmd=None):
        argv = list(cmd or RUNTIME) + ["--root", str(self.runc_root), "--log", str(self.tmp / "runc.log")]
        if log_format:
            argv += ["--log-format", log_format]
        return argv + list(args)

    def runtime(self, *args, log_format=None, timeout=TIMEOUT, cmd=None, env=None):
        """hami-runtime with our root; stdio are files, never pipes (create's
        container inherits them)."""
        argv = self.runtime_argv(log_format=log_format, cmd=cmd)
        out, err = self.tmp / "out", self.tmp / "err"
        with open(out, "wb") as o, open(err, "wb") as e:
            proc = subprocess.run(argv + list(args), stdin=subprocess.DEVNULL, stdout=o, stderr=e,
                                  env={**self.env, **(env or {})}, timeout=timeout, cwd=self.tmp)
        return subprocess.CompletedProcess(proc.args, proc.returncode, out.read_text(),
                                           err.read_text())

    def create(self, cid, bundle, **kw):
        return self.runtime("create", "--bundle", str(bundle), cid, **kw)

    def start_load(self, cid, annotations, seconds, start_at, kernel_us=10000, context_at=0):
        """A container running sm_load (kernels of `kernel_us`, counted over `seconds`
        from `start_at`, its context made at `context_at` if given, CLOCK_MONOTONIC ns),
        in the background; load_result() ends it."""
        bundle = self.bundle(cid, annotations, args=("sm_load", "-u", str(kernel_us), "-t", str(seconds),
                                                     "-s", str(start_at), "-c", str(context_at)))
        out = open(self.tmp / f"{cid}.out", "wb")
        proc = subprocess.Popen(self.runtime_argv("run", "--bundle", str(bundle), cid),
                                stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                env=self.env, cwd=self.tmp)
        out.close()
        return proc

    def load_result(self, cid, proc, timeout=120):
        """sm_load's report (tests/libvgpu/sm_load.c) once its container has run."""
        text = lambda: (self.tmp / f"{cid}.out").read_text()
        assert proc.wait(timeout) == 0, text()
        return json.loads(text().strip().splitlines()[-1])

    def hamictl(self, *args):
        proc = subprocess.run(HAMICTL + list(args), capture_output=True, text=True, env=self.env,
                              timeout=TIMEOUT)
        return proc

    def ps(self):
        proc = self.hamictl("ps", "--json")
        assert proc.returncode == 0, proc.stderr
        return json.loads(proc.stdout)

    def reconcile(self):
        """What every create and delete does first: free the entries whose
        container is gone (hamictl ps, gpus and doctor only read the state)."""
        from hami_runtime.lifecycle.node_state import store
        with store.transaction(str(self.state_dir)):
            pass

    def leave_dead_entry(self, gpu_uuid, cid="gone"):
        """An entry whose container runc no longer has (its state.json gone, as
        after a node crash): dead, freed by the next create or delete."""
        from hami_runtime.lifecycle.node_state import state_layout, store
        root = self.runc_root / cid
        root.mkdir(parents=True)
        (root / "state.json").write_text("{}")
        entry = {"id": cid, "runc_root": str(self.runc_root), "bundle": f"/bundles/{cid}",
                 "devices": [{"index": 0, "uuid": gpu_uuid, "mem_mib": 1000, "cores": 0}],
                 "core_policy": "default", "priority": 1, "pid": 0}
        with store.transaction(str(self.state_dir)) as state:
            state.allocations[state_layout.alloc_name(str(self.runc_root), cid)] = entry
        shutil.rmtree(root)

    def released(self, timeout=10):
        """No allocation left, within `timeout` s (the launcher releases after
        runc's delete, detached)."""
        deadline = time.monotonic() + timeout
        while self.allocations() and time.monotonic() < deadline:
            time.sleep(0.05)
        return self.allocations() == {}

    def state(self):
        try:
            return json.loads((self.state_dir / "allocations.json").read_text())
        except FileNotFoundError:
            return {"allocations": {}}

    def allocations(self):
        """container id -> entry (this node's tests use one runc root)."""
        return {e["id"]: e for e in self.state()["allocations"].values()}

    def containers(self):
        proc = subprocess.run([RUNC, "--root", str(self.runc_root), "list", "-q"],
                              capture_output=True, text=True, timeout=TIMEOUT)
        return proc.stdout.split()

    def cleanup(self):
        for cid in self.containers():
            subprocess.run([RUNC, "--root", str(self.runc_root), "delete", "-f", cid],
                           capture_output=True, timeout=TIMEOUT)
        if self.pids:
            self.pids.stop()
        # a create server the launcher started ends within a second of its socket's removal
        (self.state_dir / "server" / "socket").unlink(missing_ok=True)


