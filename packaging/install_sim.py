"""make install SIM=1: an installed runtime wired to the simulated GPU (tests/simgpu),
for a machine with no NVIDIA driver: a tour, a demo, a test of the installed files.

  install_sim.py install   --prefix P [--destdir D] [--sysconfdir /etc] [--build build]
  install_sim.py uninstall --prefix P [--destdir D] [--sysconfdir /etc]

After make install has put the runtime there, this copies the simulator that `make sim`
built (its libcuda.so.1, libnvidia-ml.so.1, nvidia-smi, stand-ins and ld cache, a driver
root of its own; the /proc/devices and MIG minors stand-ins; an empty dev root: no
nvidiactl, every card visible) to PREFIX/lib/hami/sim, and writes SYSCONFDIR/hami/config.toml
naming it, in place of the shipped example (an edited config is kept, and this says which
keys it needs). GPU containers get the simulator's state through /dev/shm, where host
processes (hamictl, the node agent, nvidia-smi) find it with no HAMI_SIM_STATE set, so both
sides see one simulated machine; the simulated driver learns the containers' host pids
itself (tests/simgpu/sim_pids.c). `hamictl doctor` passes on it. uninstall removes the
copy, and the config while it is the one written here.
"""
from __future__ import annotations

import argparse
import os
import shutil
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from install import CONFIG_EXAMPLE, InstallError, Layout, replace  # noqa: E402

SIM_DIRS = ("lib", "bin", "etc")        # the driver root's
SIM_FILES = ("proc-devices", "mig-minors")
HOST_SHM = "/dev/shm"                   # the simulator's default state, /dev/shm/hami-sim.state
CONTAINER_SHM = "/run/hami-sim"


def sim_dir(layout: Layout) -> str:
    return f"{layout.lib}/sim"


def config_text(layout: Layout) -> bytes:
    return (f"# {layout.config}: hami-runtime on the simulated GPU (make install SIM=1)\n"
            + driver_keys(sim_dir(layout)) + "\n"
            "# GPU containers share the host's simulated machine: its state file, where host\n"
            "# processes look with no HAMI_SIM_STATE set\n"
            "[extra_env]\n"
            f'HAMI_SIM_STATE = "{CONTAINER_SHM}/hami-sim.state"\n'
            "\n"
            "[[extra_mounts]]\n"
            f'source = "{HOST_SHM}"\n'
            f'destination = "{CONTAINER_SHM}"\n').encode()


def driver_keys(root) -> str:
    """The config keys naming a copy of the simulator at `root` (copy_driver's)."""
    return (f'driver_root = "{root}"\n'
            f'nvml_library = "{root}/lib/libnvidia-ml.so.1"\n'
            f'dev_root = "{root}/dev"\n'
            f'proc_devices = "{root}/proc-devices"\n'
            f'mig_minors = "{root}/mig-minors"\n')


def copy_driver(sim: Path, target: Path) -> None:
    """What make sim built at `sim` that a node needs, copied to `target` (made here): the
    driver root's dirs, the stand-in /proc files, an empty dev root (every card visible)."""
    target.mkdir(parents=True)
    for name in SIM_DIRS:
        shutil.copytree(sim / name, target / name, symlinks=True)
    for name in SIM_FILES:
        shutil.copy2(sim / name, target / name)
    (target / "dev").mkdir()


def install(layout: Layout, build: Path) -> None:
    sim = build / "sim"
    missing = [p for p in [sim / d for d in SIM_DIRS] + [sim / f for f in SIM_FILES] if not p.exists()]
    if missing:
        raise InstallError("SIM", "1", f"{missing[0]} is missing: run make sim first")
    target = layout.staged(sim_dir(layout))
    stage = target.with_name("sim.new")
    shutil.rmtree(stage, ignore_errors=True)
    copy_driver(sim, stage)
    shutil.rmtree(target, ignore_errors=True)
    os.rename(stage, target)
    config = layout.staged(layout.config)
    if config.exists() and config.read_bytes() not in (layout.config_text(), CONFIG_EXAMPLE.read_bytes(),
                                                        config_text(layout)):
        print(f"install: kept {layout.config} (edited): for the simulated GPU it needs these keys:\n"
              + config_text(layout).decode())
    else:
        replace(config, lambda p: p.write_bytes(config_text(layout)), 0o644)
        print(f"install: {layout.config} names the simulated GPU in {sim_dir(layout)}")


def uninstall(layout: Layout) -> None:
    target = layout.staged(sim_dir(layout))
    for path in (target, target.with_name("sim.new")):
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
    config = layout.staged(layout.config)
    if config.is_file() and config.read_bytes() == config_text(layout):
        config.unlink()
        if not any(config.parent.iterdir()):
            config.parent.rmdir()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="install_sim.py")
    parser.add_argument("action", choices=("install", "uninstall"))
    parser.add_argument("--prefix", default="/usr/local")
    parser.add_argument("--destdir", default="")
    parser.add_argument("--sysconfdir", default="/etc")
    parser.add_argument("--build", default=str(Path(__file__).resolve().parent.parent / "build"))
    args = parser.parse_args(argv)
    try:
        layout = Layout(args.prefix, args.destdir, args.sysconfdir)
        if args.action == "install":
            install(layout, Path(args.build).resolve())
        else:
            uninstall(layout)
    except InstallError as exc:
        print(f"{args.action}: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
