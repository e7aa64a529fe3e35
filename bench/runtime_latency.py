"""Added latency of hami-runtime against runc, measured side by side in one run.

  .venv/bin/python bench/runtime_latency.py [--iterations N]

Runs on the simulated GPU (build/sim/hami.toml, state in a temp dir) with a
busybox bundle and a private runc --root. Each pair of commands is timed
alternately (runc, then hami-runtime) so that both see the same machine load.
Prints a markdown table: median and p90 wall time in ms, added ms (difference of
the medians, and of the means: runc's own create time is bimodal on some
machines, which moves medians by whole steps) and ratio,
the median CPU time (user + system of the command and the processes it waited
for, hooks included: steadier than wall time on a shared box), and the load average before and after (the numbers mean little on a busy box).
hami-runtime is the C launcher as `make build` makes it (Python without site
processing, the createRuntime hook in C, no poststop hook; delete returns with
runc's and the allocation is freed by a detached release, whose CPU time the
CPU columns do not see); GPU creates after the first one find the discovery
cache in the state dir, as on a node that has run a container. The state dir, the
runc root and the bundles are on a tmpfs (/dev/shm), as /run is on a node.
"""
import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from sim_runtime import ROOT, private_config, sim_config_missing

# What an engine calls: the C launcher (make build) in front of the Python runtime.
LAUNCHER = ROOT / "build" / "hami-runtime"
PY_ENTRY = [str(ROOT / ".venv" / "bin" / "hami-runtime")]
HAMI = [str(LAUNCHER)] if LAUNCHER.exists() else PY_ENTRY
RUNC = shutil.which("runc") or "/usr/sbin/runc"
GPU = {"hami.io/gpumem": "1000", "hami.io/gpucores": "30"}


def _children_cpu():
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def timed(argv, env):
    """(wall ms, CPU ms of the command and what it waited for, hooks included)."""
    cpu, start = _children_cpu(), time.perf_counter()
    subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL, env=env, check=True, timeout=60)
    return (time.perf_counter() - start) * 1000, (_children_cpu() - cpu) * 1000


def plus(a, b):
    return a[0] + b[0], a[1] + b[1]


def quiet(argv, env):
    subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL, env=env, timeout=60)


class Setup:
    def __init__(self, work: Path):
        self.work = work
        self.root = work / "runc-root"
        self.rootfs = work / "rootfs"
        (self.rootfs / "bin").mkdir(parents=True)
        shutil.copy2(shutil.which("busybox") or "/bin/busybox", self.rootfs / "bin" / "busybox")
        for applet in ("sh", "sleep", "true"):
            (self.rootfs / "bin" / applet).symlink_to("busybox")
        subprocess.run([RUNC, "spec"], cwd=work, check=True)
        self.template = json.loads((work / "config.json").read_text())
        self.template["process"]["terminal"] = False
        self.template["root"] = {"path": str(self.rootfs), "readonly": False}
        config = private_config(work)
        (work / "simstate").mkdir()
        config.write_text(config.read_text().replace(
            f'"{ROOT / "build" / "sim" / "shared"}"', f'"{work / "simstate"}"'))
        self.env = {**os.environ, "HAMI_CONFIG": str(config),
                    "HAMI_SIM_STATE": str(work / "simstate" / "gpu.state")}

    def bundle(self, name, annotations=None, args=("sleep", "60")):
        path = self.work / name
        path.mkdir(exist_ok=True)
        spec = json.loads(json.dumps(self.template))
        spec["process"]["args"] = list(args)
        if annotations:
            spec["annotations"] = annotations
        (path / "config.json").write_text(json.dumps(spec))
        return path

    def g(self, *args):
        return ["--root", str(self.root)] + list(args)


def stats(samples):
    ordered = sorted(samples)
    return statistics.median(ordered), ordered[min(len(ordered) - 1, int(len(ordered) * 0.9))]


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--iterations", type=int, default=20)
    n = parser.parse_args().iterations
    if sim_config_missing():
        return 1
    load_before = os.getloadavg()
    # state dir, runc root and bundles on a tmpfs, as on a node (/run/hami, /run/runc)
    work = Path(tempfile.mkdtemp(prefix="hami-bench-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None))
    s = Setup(work)
    env = s.env
    try:
        plain = s.bundle("plain")
        gpu = s.bundle("gpu", GPU)
        gpu_spec = (gpu / "config.json").read_bytes()
        cycle_plain = s.bundle("cycle-plain", args=("true",))
        cycle_gpu = s.bundle("cycle-gpu", GPU, args=("true",))
        cycle_gpu_spec = (cycle_gpu / "config.json").read_bytes()
        quiet([RUNC] + s.g("create", "--bundle", str(plain), "resident"), env)
        results = {k: ([], []) for k in ("list", "list-py", "state", "create", "create-plain",
                                         "create-delete", "cycle")}
        for i in range(n):
            results["list-py"][0].append(timed([RUNC] + s.g("list"), env))
            results["list-py"][1].append(timed(PY_ENTRY + s.g("list"), env))
            results["list"][0].append(timed([RUNC] + s.g("list"), env))
            results["list"][1].append(timed(HAMI + s.g("list"), env))
            results["state"][0].append(timed([RUNC] + s.g("state", "resident"), env))
            results["state"][1].append(timed(HAMI + s.g("state", "resident"), env))
            # create of a plain bundle (no request) and of a GPU bundle, each against runc's
            results["create-plain"][0].append(timed([RUNC] + s.g("create", "--bundle", str(plain), "a"), env))
            quiet([RUNC] + s.g("delete", "-f", "a"), env)
            results["create-plain"][1].append(timed(HAMI + s.g("create", "--bundle", str(plain), "a"), env))
            quiet([RUNC] + s.g("delete", "-f", "a"), env)
            results["create"][0].append(timed([RUNC] + s.g("create", "--bundle", str(plain), "b"), env))
            quiet([RUNC] + s.g("delete", "-f", "b"), env)
            (gpu / "config.json").write_bytes(gpu_spec)
            results["create"][1].append(timed(HAMI + s.g("create", "--bundle", str(gpu), "b"), env))
            quiet(HAMI + s.g("delete", "-f", "b"), env)
            # create + delete of a GPU container (the bar), against runc's of the plain bundle
            t = timed([RUNC] + s.g("create", "--bundle", str(plain), "d"), env)
            results["create-delete"][0].append(plus(t, timed([RUNC] + s.g("delete", "-f", "d"), env)))
            (gpu / "config.json").write_bytes(gpu_spec)
            t = timed(HAMI + s.g("create", "--bundle", str(gpu), "d"), env)
            results["create-delete"][1].append(plus(t, timed(HAMI + s.g("delete", "-f", "d"), env)))
            # a whole create / start / delete cycle
            t = timed([RUNC] + s.g("create", "--bundle", str(cycle_plain), "c"), env)
            t = plus(t, timed([RUNC] + s.g("start", "c"), env))
            t = plus(t, timed([RUNC] + s.g("delete", "-f", "c"), env))
            results["cycle"][0].append(t)
            (cycle_gpu / "config.json").write_bytes(cycle_gpu_spec)
            t = timed(HAMI + s.g("create", "--bundle", str(cycle_gpu), "c"), env)
            t = plus(t, timed(HAMI + s.g("start", "c"), env))
            t = plus(t, timed(HAMI + s.g("delete", "-f", "c"), env))
            results["cycle"][1].append(t)
        labels = {
            "list": "passthrough `list`",
            "list-py": "passthrough `list`, Python entry point (no launcher)",
            "state": "passthrough `state <id>`",
            "create-plain": "`create`, no GPU request",
            "create": "`create`, GPU request (gpumem 1000, gpucores 30)",
            "create-delete": "`create` + `delete -f`, GPU request (the bar: <= 60 ms added)",
            "cycle": "`create` + `start` + `delete`, GPU request",
        }
        print(f"runtime latency, {n} iterations each, alternating runc / hami-runtime "
              f"({os.path.relpath(HAMI[0], ROOT)}; {os.cpu_count()} CPUs; load average {load_before[0]:.2f} before, "
              f"{os.getloadavg()[0]:.2f} after)\n")
        print("| operation | runc median ms | hami median ms | runc p90 ms | hami p90 ms | added ms (median) "
              "| added ms (mean) | ratio | runc CPU ms | hami CPU ms | added CPU ms |")
        print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
        for key, label in labels.items():
            runc_runs, hami_runs = results[key]
            (rm, rp), (hm, hp) = stats([w for w, _ in runc_runs]), stats([w for w, _ in hami_runs])
            rc, hc = stats([c for _, c in runc_runs])[0], stats([c for _, c in hami_runs])[0]
            mean = statistics.mean(w for w, _ in hami_runs) - statistics.mean(w for w, _ in runc_runs)
            print(f"| {label} | {rm:.1f} | {hm:.1f} | {rp:.1f} | {hp:.1f} | {hm - rm:+.1f} | {mean:+.1f} | {hm / rm:.2f} "
                  f"| {rc:.1f} | {hc:.1f} | {hc - rc:+.1f} |")
    finally:
        for cid in ("resident", "a", "b", "c", "d"):
            quiet([RUNC] + s.g("delete", "-f", cid), env)
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
