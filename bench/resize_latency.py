"""How soon a running process follows `hamictl update`.

  .venv/bin/python bench/resize_latency.py [--iterations 50]

One container is made by hami-runtime's create path on the simulated GPU; a
process of it (tests/libvgpu/resize_probe under libvgpu, finding the container's
limits and region where a runtime-made container does: scripts/runtime-made.sh,
as root) polls cuMemGetInfo in a tight loop. Each iteration resizes the
container between 1000 and 2000 MiB, either through the `hamictl update`
command as an operator or a controller runs it, or through the same function
called in-process, and records when the command started, when it returned and
when the process first saw the new total. Prints a markdown table (median and
p95 over the iterations).
"""
import argparse
import multiprocessing
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from sim_runtime import ROOT, private_config, sim_config_missing
from stats import percentile

PROBE = ROOT / "build" / "tests" / "resize_probe"
HAMICTL = ROOT / ".venv" / "bin" / "hamictl"
MIB = 1 << 20
SIZES = (1000, 2000)


def hold(config, root, bundle, cid, ready, done):
    """The create path, then stay alive: the allocation lives while its creator does."""
    os.environ["HAMI_CONFIG"] = config
    from hami_runtime import argv, config as config_mod
    from hami_runtime.lifecycle.commands import create
    create.prepare(config_mod.load(), argv.parse(["--root", root, "create", "--bundle", bundle, cid]))
    ready.set()
    done.wait(600)


class Probe:
    def __init__(self, state_dir, name, sim_state):
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"),
               "LD_LIBRARY_PATH": str(ROOT / "build" / "sim" / "lib"),
               "LD_PRELOAD": str(ROOT / "build" / "libvgpu.so"),
               "HAMI_SIM_STATE": str(sim_state)}
        inside = [str(ROOT / "scripts" / "runtime-made.sh"), str(state_dir / "private" / name / "limits"),
                  str(state_dir / "containers" / name), "", "ro"]
        self.proc = subprocess.Popen(inside + [str(PROBE)], env=env, stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout.readline().strip() == "ready"

    def send(self, line):
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()

    def answer(self):
        return dict(w.split("=") for w in self.proc.stdout.readline().split()[1:])

    def close(self):
        self.proc.stdin.close()
        self.proc.wait(30)


def measure(probe, resize, iterations):
    """[(returned ms, seen ms)] after the start of each resize."""
    rows = []
    for i in range(iterations):
        size = SIZES[(i + 1) % 2]
        probe.send(f"wait_total {size * MIB} 20")
        time.sleep(0.02)                      # the probe is polling before the resize starts
        start = time.monotonic_ns()           # CLOCK_MONOTONIC, as the probe's timestamps
        resize(size)
        returned = time.monotonic_ns()
        seen = int(probe.answer()["ns"])
        if not seen:
            raise RuntimeError(f"iteration {i}: the process never saw {size} MiB")
        rows.append(((returned - start) / 1e6, (seen - start) / 1e6))
    return rows


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--iterations", type=int, default=50)
    n = parser.parse_args().iterations
    if sim_config_missing():
        return 1
    if not PROBE.exists():
        subprocess.run(["make", "-s", "-C", str(ROOT), "libvgpu-tests"], check=True)
    work = Path(tempfile.mkdtemp(prefix="hami-resize-bench-"))
    ctx = multiprocessing.get_context("fork")
    ready, done = ctx.Event(), ctx.Event()
    holder = probe = None
    try:
        config = private_config(work)
        os.environ["HAMI_CONFIG"] = str(config)
        os.environ["HAMI_SIM_STATE"] = str(work / "sim.state")
        bundle = work / "bundle"
        bundle.mkdir()
        (bundle / "config.json").write_text(
            '{"ociVersion": "1.0.2", "process": {"args": ["true"], "env": []}, '
            f'"root": {{"path": "rootfs"}}, "annotations": {{"hami.io/gpumem": "{SIZES[0]}"}}}}')
        holder = ctx.Process(target=hold, args=(str(config), str(work / "runc"), str(bundle),
                                                "resized", ready, done))
        holder.start()
        if not ready.wait(60):
            raise RuntimeError("the create path did not finish")
        from hami_runtime import config as config_mod
        from hami_runtime.lifecycle.commands import resize
        from hami_runtime.lifecycle.node_state import state_layout
        from hami_runtime.tools import update
        name = state_layout.alloc_name(str(work / "runc"), "resized")
        probe = Probe(work / "state", name, work / "sim.state")
        cfg = config_mod.load(str(config))

        def by_command(size):
            subprocess.run([str(HAMICTL), "--config", str(config), "update", "resized",
                            "--gpumem", str(size)], check=True, stdout=subprocess.DEVNULL)

        def in_process(size):
            update.update(cfg, "resized", resize.Change(mem_mib=size))

        results = [("`hamictl update` (command)", measure(probe, by_command, n)),
                   ("`update.update()` (in-process)", measure(probe, in_process, n))]
    finally:
        if probe:
            probe.close()
        done.set()
        if holder:
            holder.join(30)
        shutil.rmtree(work, ignore_errors=True)
    print(f"resize latency: {n} resizes {SIZES[0]} <-> {SIZES[1]} MiB per row, simulated GPU, "
          f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f}\n")
    print("| resize through | returned median ms | returned p95 ms | seen median ms | "
          "seen p95 ms | seen after return |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    for label, rows in results:
        returned, seen = [r for r, _ in rows], [s for _, s in rows]
        late = sum(1 for r, s in rows if s > r)
        print(f"| {label} | {statistics.median(returned):.1f} | {percentile(returned, 95):.1f} | "
              f"{statistics.median(seen):.1f} | {percentile(seen, 95):.1f} | {late} of {n} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
