"""make install, make uninstall and make deb: hami-runtime in an environment of its own.

  install.py install   --prefix P [--destdir D] [--sysconfdir /etc] [--python python3] --launcher-cc CMD
  install.py uninstall --prefix P [--destdir D] [--sysconfdir /etc] [--node-root /]
  install.py deb       [--python /usr/bin/python3] --launcher-cc CMD --maintainer 'N <A>' [--out DIR]

(CMD: the launcher's compile command with its sources, as make has them.)

The layout under PREFIX (DESTDIR, when given, is only where it is written:
every installed file names PREFIX, so a DESTDIR tree works once copied there):

  lib/hami/venv/          a Python environment made with PYTHON (never pip into
                          the system's Python): the pinned dependencies
                          (packaging/requirements.txt) and the project's wheel,
                          installed from a wheelhouse under build/ with the build
                          environment's pip; region.h in its share/hami/
  lib/hami/hami-runtime   the C launcher, bound to that environment
  lib/hami/libvgpu.so
  bin/hami-runtime        a link to the launcher
  bin/hamictl, bin/hami-hook   the environment's entry points, run with -I
  bin/nvidia-container-runtime-hook  packaging/bin's, for `docker run --gpus`,
                          where no program of that name is on PATH (not in a .deb)
  lib/systemd/system/hami-agent.service  the node agent's unit (examples/systemd's,
                          naming this prefix's hamictl); systemctl enable --now
                          hami-agent starts it
  SYSCONFDIR/hami/config.toml  examples/config.toml, only where none is there,
                          its first line naming the path it is installed at

What the runtime makes on the node as it runs goes too: the config cache,
/var/cache/hami (copies of the validated config, kept over a reboot) and
/var/lib/hami/cache-key (the key whose MAC makes such a copy usable). Every
hami-runtime on the node shares them (a package, another PREFIX, a source
tree): one left behind only validates its config again and makes a new key.
These dirs may be reachable from a container (a hostPath), so only files named
as the runtime names its own, regular and root's (or ours), are removed, each
by name in a dir opened without following a link, and a dir only once empty;
a dir that a user other than root could replace (path_trust) is not touched.
What is left is named. --node-root puts those paths under another root (tests).

The installed runtime, launcher and hamictl read SYSCONFDIR/hami/config.toml
when HAMI_CONFIG is unset (the launcher is built with it, config.py's
DEFAULT_PATH is written with it).

A re-install builds the new environment beside the old one and swaps them, and
replaces files by rename: a running container keeps the libvgpu.so it mapped.
"""
from __future__ import annotations

import argparse
import errno
import hashlib
import os
import re
import shlex
import shutil
import stat
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
REQUIREMENTS = ROOT / "packaging" / "requirements.txt"
BUILD_REQUIREMENTS = ROOT / "packaging" / "build-requirements.txt"
CONFIG_EXAMPLE = ROOT / "examples" / "config.toml"
CONFIG_EXAMPLE_PATH = "/etc/hami/config.toml"  # what the example's first line names
# dockerd offers `docker run --gpus` only with a program of this name on its PATH
DOCKER_GPU_HOOK = ROOT / "packaging" / "bin" / "nvidia-container-runtime-hook"
# the node agent's systemd unit, its ExecStart naming the install's hamictl
AGENT_UNIT = ROOT / "examples" / "systemd" / "hami-agent.service"
AGENT_UNIT_EXEC = "/usr/local/bin/hamictl"
REGION_HEADER = ROOT / "libvgpu_src" / "region.h"
PACKAGE_SOURCES = ("pyproject.toml", "hami_runtime", "hami_hook")
ENTRY_POINTS = ("hamictl", "hami-hook")  # bin/hami-runtime is the launcher
BIN_ENTRIES = ("hami-runtime",) + ENTRY_POINTS + (DOCKER_GPU_HOOK.name,)
LIB_ENTRIES = ("venv", "hami-runtime", "libvgpu.so")  # under <prefix>/lib/hami
LAUNCHER_LINK = "../lib/hami/hami-runtime"  # bin/hami-runtime, relative: DESTDIR trees work
# paths end up in C string literals, a Python literal and sed-free rewrites: keep them plain
SAFE_PATH = re.compile(r"/[A-Za-z0-9._+@/-]*")
# config.py's default config, which an install sets to its SYSCONFDIR's
DEFAULT_PATH_LINE = re.compile(r'^DEFAULT_PATH = "[^"\n]*"', re.M)
# the node's config cache: hami_runtime/config_cache.py's PERSISTENT_DIR and KEY_DIR/KEY_FILE
NODE_CONFIG_CACHE = "/var/cache/hami"
NODE_CACHE_KEY = "/var/lib/hami/cache-key"
# the names the runtime gives its files there (config_cache.persistent_path, KEY_FILE,
# and files.temp_beside's temp files)
NODE_CACHE_NAMES = re.compile(r"config-[0-9a-f]{16}\.json|\.hami-[0-9]+-[0-9a-f]{12}")
NODE_KEY_NAMES = re.compile(r"cache-key|\.hami-[0-9]+-[0-9a-f]{12}")
PROBE = ("import os, platform, sys; print(os.path.realpath(sys.executable)); "
         "print('%d.%d' % sys.version_info[:2]); print(sys.implementation.cache_tag); "
         "print(platform.machine())")


class InstallError(Exception):
    def __init__(self, field, value, why):
        super().__init__(f"{field}={value!r}: {why}")


def run(argv, **kw):
    return subprocess.run([str(a) for a in argv], check=True, **kw)


class Layout:
    """Where each installed file lives (final paths) and where it is written."""

    def __init__(self, prefix, destdir="", sysconfdir="/etc", packaging=False):
        for field, value in (("PREFIX", prefix), ("SYSCONFDIR", sysconfdir), ("DESTDIR", destdir)):
            if not (field == "DESTDIR" and value == "") and not SAFE_PATH.fullmatch(value):
                raise InstallError(field, value, "must be an absolute path of letters, digits and ._+@/-")
        self.prefix = os.path.normpath(prefix)
        self.destdir = os.path.normpath(destdir) if destdir else ""
        self.lib = f"{self.prefix}/lib/hami"
        self.venv = f"{self.lib}/venv"
        self.launcher = f"{self.lib}/hami-runtime"
        self.libvgpu = f"{self.lib}/libvgpu.so"
        self.bin = f"{self.prefix}/bin"
        self.config = f"{os.path.normpath(sysconfdir)}/hami/config.toml"
        self.agent_unit = f"{self.prefix}/lib/systemd/system/{AGENT_UNIT.name}"
        self.packaging = packaging  # files for a .deb, not for this machine

    def config_text(self) -> bytes:
        """examples/config.toml as installed: its header names this install's path."""
        text = CONFIG_EXAMPLE.read_bytes()
        first, newline, rest = text.partition(b"\n")
        if CONFIG_EXAMPLE_PATH.encode() not in first:
            raise InstallError("config example", str(CONFIG_EXAMPLE),
                               f"its first line names no {CONFIG_EXAMPLE_PATH}")
        return first.replace(CONFIG_EXAMPLE_PATH.encode(), self.config.encode()) + newline + rest

    def staged(self, path) -> Path:
        """Where a file of the final path is written."""
        return Path(self.destdir + str(path))

    def agent_unit_text(self) -> str:
        """The agent's unit, naming this prefix's hamictl."""
        text = AGENT_UNIT.read_text()
        if f"ExecStart={AGENT_UNIT_EXEC} agent\n" not in text:
            raise InstallError("unit", str(AGENT_UNIT), f"has no ExecStart={AGENT_UNIT_EXEC} agent line")
        return text.replace(f"ExecStart={AGENT_UNIT_EXEC} ", f"ExecStart={self.bin}/hamictl ")

    def entry_point(self, name) -> str:
        """bin/<name>: the environment's own entry point, run isolated (-I) from any shell."""
        return (f"#!/bin/sh\n# {name} of the hami-runtime installed in {self.lib} (make install)\n"
                f'exec {self.venv}/bin/python3 -I {self.venv}/bin/{name} "$@"\n')


class Interpreter:
    """The Python the environment is made with, by its real (versioned) path, so
    that the environment does not follow a python3 link to another version."""

    def __init__(self, python):
        found = shutil.which(python)
        if not found:
            raise InstallError("PYTHON", python, "not found")
        try:
            out = subprocess.run([found, "-I", "-c", PROBE], capture_output=True, text=True,
                                 check=True, timeout=60).stdout.split("\n")
        except (subprocess.SubprocessError, OSError) as exc:
            raise InstallError("PYTHON", python, f"does not run as a Python interpreter: {exc}") from None
        self.path, self.version, self.cache_tag, self.machine = out[:4]


def version() -> str:
    text = (ROOT / "pyproject.toml").read_text()
    match = re.search(r'^version\s*=\s*"([^"]+)"', text, re.M)
    return match.group(1)


def wheelhouse(build: Path, interp: Interpreter) -> Path:
    """The pinned dependencies and the build's setuptools as wheels for this
    interpreter, downloaded (or built) once per set of pins."""
    pins = REQUIREMENTS.read_bytes() + BUILD_REQUIREMENTS.read_bytes()
    key = f"{interp.cache_tag}-{interp.machine}-{hashlib.sha256(pins).hexdigest()[:16]}"
    house = build / "wheelhouse" / key
    if (house / ".complete").exists():
        return house
    partial = house.with_name(key + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    print(f"install: filling the wheelhouse {house}")
    run([sys.executable, "-m", "pip", "--python", interp.path, "wheel", "-q",
         "--disable-pip-version-check", "-w", partial, "-r", REQUIREMENTS, "-r", BUILD_REQUIREMENTS])
    (partial / ".complete").touch()
    shutil.rmtree(house, ignore_errors=True)
    partial.rename(house)
    return house


def project_wheel(build: Path, house: Path) -> Path:
    """The project's wheel, built offline from a copy of its sources (setuptools
    builds in the tree it is given, and would keep a removed module in its build/)."""
    work = build / "install"
    shutil.rmtree(work, ignore_errors=True)
    for name in PACKAGE_SOURCES:
        source, target = ROOT / name, work / "src" / name
        if source.is_dir():
            shutil.copytree(source, target, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target)
    if not (work / "src" / "hami_runtime" / "node" / "_region_ffi.py").exists():
        raise InstallError("hami_runtime/node/_region_ffi.py", "", "missing: run make build first")
    run([sys.executable, "-m", "pip", "wheel", "-q", "--disable-pip-version-check", "--no-deps",
         "--no-index", "--find-links", house, "-w", work / "dist", work / "src"])
    return work / "dist"


def relocate(tree: Path, old: str, new: str) -> None:
    """Every text file and link under tree that names old names new instead (the
    environment's scripts, activate files, pyvenv.cfg); a binary naming it is an error."""
    old_b, new_b = old.encode(), new.encode()
    for path in sorted(tree.rglob("*")):
        if path.is_symlink():
            target = os.readlink(path)
            if old in target:
                path.unlink()
                path.symlink_to(target.replace(old, new))
            continue
        if not path.is_file():
            continue
        data = path.read_bytes()
        if old_b not in data:
            continue
        if b"\0" in data:
            raise InstallError("relocate", str(path), f"a binary file names {old}")
        path.write_bytes(data.replace(old_b, new_b))


def make_environment(layout: Layout, interp: Interpreter, house: Path, dist: Path):
    """The new environment, complete, at lib/hami/venv.new (written paths) but
    naming lib/hami/venv (final ones); with its site-packages, relative to it."""
    stage = layout.staged(layout.lib) / "venv.new"
    shutil.rmtree(stage, ignore_errors=True)
    run([interp.path, "-I", "-m", "venv", "--without-pip", "--prompt", "hami-runtime", stage])
    python = stage / "bin" / "python3"
    site = subprocess.run([python, "-I", "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    relative_site = os.path.relpath(site, stage)
    if relative_site.startswith(".."):
        raise InstallError("PYTHON", interp.path, f"its environments keep packages outside them ({site})")
    run([sys.executable, "-m", "pip", "--python", python, "install", "-q", "--disable-pip-version-check",
         "--root-user-action=ignore", "--no-compile", "--no-index", "--find-links", house,
         "--find-links", dist, "-r", REQUIREMENTS, f"hami-runtime=={version()}"])
    (stage / "share" / "hami").mkdir(parents=True)
    shutil.copyfile(REGION_HEADER, stage / "share" / "hami" / "region.h")
    relocate(stage, str(stage), layout.venv)
    bake_config_path(stage / relative_site, layout.config)
    # byte code now, naming the final paths (tracebacks), so that nothing is
    # written under the install when it runs
    run([python, "-I", "-m", "compileall", "-q", "-j0", "-d", f"{layout.venv}/{relative_site}",
         stage / relative_site], stdout=subprocess.DEVNULL)
    return stage, relative_site


def bake_config_path(site: Path, config: str) -> None:
    """The installed package reads this install's config (SYSCONFDIR's) when
    HAMI_CONFIG is unset: its config.DEFAULT_PATH line says so."""
    module = site / "hami_runtime" / "config.py"
    text = module.read_text()
    baked, count = DEFAULT_PATH_LINE.subn(f'DEFAULT_PATH = "{config}"', text)
    if count != 1:
        raise InstallError("config path", str(module), f"has {count} DEFAULT_PATH lines, not one")
    module.write_text(baked)


def build_launcher(layout: Layout, relative_site: str, cc: str, out: Path) -> Path:
    """The launcher bound to the installed environment: its python, and its
    site-packages put on the path so that Python starts without site (-S)."""
    run(shlex.split(cc) + [f'-DHAMI_PYTHON="{layout.venv}/bin/python3"',
                           f'-DHAMI_PYTHONPATH="{layout.venv}/{relative_site}"',
                           f'-DHAMI_CONFIG_FILE="{layout.config}"', "-o", out], cwd=ROOT)
    return out


def replace(path: Path, write, mode=None) -> None:
    """Writes path.new (write(path.new)) and renames it over path."""
    path.parent.mkdir(parents=True, exist_ok=True)
    new = path.with_name(path.name + ".new")
    if new.is_symlink() or new.exists():
        new.unlink()
    write(new)
    if mode is not None:
        new.chmod(mode)
    os.replace(new, path)


def stripped(source: Path, target: Path) -> None:
    """A copy without the debug sections (which name the build tree)."""
    run(["strip", "--strip-unneeded", "-o", target, source])


def swap_in(stage: Path, final: Path) -> None:
    old = final.with_name(final.name + ".old")
    shutil.rmtree(old, ignore_errors=True)
    if final.exists():
        final.rename(old)
    stage.rename(final)
    shutil.rmtree(old, ignore_errors=True)


def install(layout: Layout, interp: Interpreter, cc: str, build: Path) -> None:
    os.umask(0o022)
    house = wheelhouse(build, interp)
    dist = project_wheel(build, house)
    stage = layout.staged(layout.lib) / "venv.new"
    try:
        stage, relative_site = make_environment(layout, interp, house, dist)
        launcher = build_launcher(layout, relative_site, cc, build / "install" / "hami-runtime")
    except BaseException:
        shutil.rmtree(stage, ignore_errors=True)
        raise
    swap_in(stage, layout.staged(layout.venv))
    replace(layout.staged(layout.libvgpu), lambda p: stripped(build / "libvgpu.so", p), 0o644)
    replace(layout.staged(layout.launcher), lambda p: stripped(launcher, p), 0o755)
    bin_dir = layout.staged(layout.bin)
    replace(bin_dir / "hami-runtime", lambda p: p.symlink_to(LAUNCHER_LINK))
    for name in ENTRY_POINTS:
        replace(bin_dir / name, lambda p, n=name: p.write_text(layout.entry_point(n)), 0o755)
    install_docker_gpu_hook(layout, bin_dir / DOCKER_GPU_HOOK.name)
    replace(layout.staged(layout.agent_unit), lambda p: p.write_text(layout.agent_unit_text()), 0o644)
    config = layout.staged(layout.config)
    if config.exists():
        print(f"install: kept {layout.config} (an existing config is never replaced)")
    else:
        replace(config, lambda p: p.write_bytes(layout.config_text()), 0o644)
    print(f"install: hami-runtime {version()} in {layout.lib}, Python {interp.version} "
          f"({interp.path}); engines run {layout.bin}/hami-runtime")
    print(f"install: the node agent's unit is {layout.agent_unit}: start it with "
          f"systemctl enable --now hami-agent (or run {layout.bin}/hamictl agent)")
    print(f"install: hami-runtime and hamictl read {layout.config} "
          "(HAMI_CONFIG, where set, names another)")
    print(f"install: check the node with {layout.bin}/hamictl doctor")


def install_docker_gpu_hook(layout: Layout, target: Path) -> None:
    """Ours, where no other program of its name is on PATH (NVIDIA's toolkit
    installs one: dockerd then runs NVIDIA's, whose hook hami-runtime removes
    the same way), and never in a package (it would clash with NVIDIA's)."""
    found = shutil.which(DOCKER_GPU_HOOK.name)
    if found and Path(found).resolve() != target.resolve() or layout.packaging:
        print(f"install: left out {layout.bin}/{DOCKER_GPU_HOOK.name}"
              + (f": {found} is on PATH" if found and not layout.packaging else " (a package)"))
        return
    replace(target, lambda p: shutil.copyfile(DOCKER_GPU_HOOK, p), 0o755)


def ours(layout: Layout, path: Path) -> bool:
    """A bin entry that make install wrote for this layout."""
    if path.name == "hami-runtime":
        return path.is_symlink() and os.readlink(path) == LAUNCHER_LINK
    try:
        if path.name == DOCKER_GPU_HOOK.name:
            return path.read_bytes() == DOCKER_GPU_HOOK.read_bytes()
        return path.read_text() == layout.entry_point(path.name)
    except (OSError, UnicodeDecodeError):
        return False


def remove_runtime_files(path: str, names: re.Pattern) -> str:
    """Removes from the dir at `path` the regular files of root's (or ours) whose
    names match `names`, by name in the dir opened without following a link,
    then the dir once empty. '' when all went (or there was nothing), else one
    line: what was left and why."""
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    from hami_runtime.path_trust import replace_problem  # standard library only
    try:
        if not os.path.lexists(path):
            return ""
        problem = replace_problem(path)
        if problem:
            return f"left {path}: {problem}"
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        link = exc.errno in (errno.ELOOP, errno.ENOTDIR)
        return f"left {path}: {'not a directory (a symbolic link?)' if link else exc.strerror}"
    left = []
    try:
        for entry in sorted(os.listdir(fd)):
            st = os.stat(entry, dir_fd=fd, follow_symlinks=False)
            why = "" if names.fullmatch(entry) else "?"
            if not why and not stat.S_ISREG(st.st_mode):
                why = "a symbolic link" if stat.S_ISLNK(st.st_mode) else "not a regular file"
            elif not why and st.st_uid not in (0, os.geteuid()):
                why = f"owned by uid {st.st_uid}"
            if why:
                left.append(entry if why == "?" else f"{entry} ({why})")
            else:
                os.unlink(entry, dir_fd=fd)
    finally:
        os.close(fd)
    if left:
        return f"left {path}: holds {', '.join(left)}, not the runtime's"
    try:
        os.rmdir(path)  # rmdir never follows a link: one swapped in meanwhile stays
    except OSError as exc:
        return f"left {path}: {exc.strerror}"
    return ""


def remove_node_cache(node_root: str) -> list:
    """The node's config cache and its key, under node_root ('' for this node's
    own paths): what was left, one line each."""
    cache = node_root + NODE_CONFIG_CACHE
    key_dir = node_root + os.path.dirname(NODE_CACHE_KEY)
    return [line for line in (remove_runtime_files(cache, NODE_CACHE_NAMES),
                              remove_runtime_files(key_dir, NODE_KEY_NAMES)) if line]


def uninstall(layout: Layout, node_root: str = "") -> None:
    """Everything install put there (and what an interrupted one left); the
    config only while it is the shipped one."""
    lib = layout.staged(layout.lib)
    removed = 0
    unit = layout.staged(layout.agent_unit)
    if unit.is_file() and not unit.is_symlink():
        if unit.read_text(errors="replace") == layout.agent_unit_text():
            unit.unlink()
            removed += 1
            for parent in (unit.parent, unit.parent.parent):  # lib/systemd/system, lib/systemd
                if parent.is_dir() and not any(parent.iterdir()):
                    parent.rmdir()
        else:
            print(f"uninstall: kept {layout.agent_unit}: edited")
    for name in BIN_ENTRIES:
        path = layout.staged(layout.bin) / name
        if ours(layout, path):
            path.unlink()
            removed += 1
        elif path.is_symlink() or path.exists():
            print(f"uninstall: left {path}: not written by make install for {layout.prefix}")
    for name in LIB_ENTRIES:
        for path in (lib / name, lib / f"{name}.new", lib / f"{name}.old"):
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path)
            elif path.is_symlink() or path.exists():
                path.unlink()
            else:
                continue
            removed += 1
    if lib.is_dir():
        left = sorted(p.name for p in lib.iterdir())
        if left:
            print(f"uninstall: left {lib}: holds {', '.join(left)}, not make install's")
        else:
            lib.rmdir()
    config = layout.staged(layout.config)
    if config.exists():
        if config.read_bytes() in (layout.config_text(), CONFIG_EXAMPLE.read_bytes()):
            config.unlink()
            if not any(config.parent.iterdir()):
                config.parent.rmdir()
        else:
            print(f"uninstall: kept {layout.config}: edited")
    print(f"uninstall: hami-runtime removed from {layout.prefix}" if removed else
          f"uninstall: no hami-runtime in {layout.prefix}")
    if layout.destdir:  # a staged tree has none of the node's
        return
    had = [node_root + p for p in (NODE_CONFIG_CACHE, NODE_CACHE_KEY) if os.path.lexists(node_root + p)]
    left = remove_node_cache(node_root)
    if had:
        print(f"uninstall: removed the node's config cache ({' and '.join(had)}; another "
              "hami-runtime on this node validates its config again)" if not left else
              "uninstall: removed what the runtime made of the node's config cache ("
              f"{' and '.join(had)}), except:")
    for line in left:
        print(f"uninstall: {line}")


def glibc_needed(tree: Path) -> str:
    """The highest glibc symbol version any ELF file in tree asks for."""
    versions = set()
    for path in tree.rglob("*"):
        if path.is_file() and not path.is_symlink():
            with open(path, "rb") as handle:
                if handle.read(4) != b"\x7fELF":
                    continue
                versions.update(re.findall(rb"GLIBC_(\d+\.\d+(?:\.\d+)?)\0", handle.read()))
    return max((v.decode() for v in versions), key=lambda v: tuple(int(x) for x in v.split(".")))


def deb(interp: Interpreter, cc: str, build: Path, out_dir: Path, maintainer: str) -> Path:
    """The same layout under /usr as a .deb: the environment is built now, so
    installing the package needs no network."""
    if not re.fullmatch(r"/usr/bin/python3\.\d+", interp.path):
        raise InstallError("PYTHON", interp.path, "a package is built with the distribution's "
                           "interpreter (/usr/bin/python3.X), which it depends on")
    root = build / "deb" / "root"
    shutil.rmtree(root.parent, ignore_errors=True)
    layout = Layout("/usr", str(root), "/etc", packaging=True)
    install(layout, interp, cc, build)
    arch = subprocess.run(["dpkg", "--print-architecture"], capture_output=True, text=True,
                          check=True).stdout.strip()
    files = sorted(p for p in root.rglob("*") if p.is_file() and not p.is_symlink())
    size_kib = sum((p.stat().st_size + 1023) // 1024 for p in files)
    control = root / "DEBIAN"
    control.mkdir()
    (control / "control").write_text(
        f"Package: hami-runtime\nVersion: {version()}\nArchitecture: {arch}\n"
        f"Maintainer: {maintainer}\n"
        f"Installed-Size: {size_kib}\n"
        f"Depends: python{interp.version}, runc, libc6 (>= {glibc_needed(root)})\n"
        f"Section: admin\nPriority: optional\n"
        f"Description: GPU sharing for containers at the OCI runtime layer\n"
        f" hami-runtime is a runc-compatible OCI runtime that gives containers slices of\n"
        f" NVIDIA GPUs (device memory limits, SM shares, priorities) with libvgpu.so\n"
        f" preloaded in each of them. Its Python tools run in their own environment\n"
        f" under /usr/lib/hami, made for Python {interp.version} at build time.\n")
    (control / "conffiles").write_text(f"{layout.config}\n")
    (control / "md5sums").write_text("".join(
        f"{hashlib.md5(p.read_bytes()).hexdigest()}  {p.relative_to(root)}\n"
        for p in files))
    out_dir.mkdir(parents=True, exist_ok=True)
    package = out_dir / f"hami-runtime_{version()}_{arch}.deb"
    run(["dpkg-deb", "--root-owner-group", "--build", root, package], stdout=subprocess.DEVNULL)
    print(f"deb: {package}")
    return package


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="install.py")
    parser.add_argument("action", choices=("install", "uninstall", "deb"))
    parser.add_argument("--prefix", default="/usr/local")
    parser.add_argument("--destdir", default="")
    parser.add_argument("--sysconfdir", default="/etc")
    parser.add_argument("--python", default="python3")
    parser.add_argument("--launcher-cc", default="")
    parser.add_argument("--build", default=str(ROOT / "build"))
    parser.add_argument("--out", default="")
    parser.add_argument("--maintainer", default="")
    parser.add_argument("--node-root", default="")
    args = parser.parse_args(argv)
    if args.action != "uninstall" and not args.launcher_cc:
        parser.error("--launcher-cc: needed to build the launcher")
    build = Path(args.build).resolve()
    try:
        if args.action == "uninstall":
            if args.node_root and not SAFE_PATH.fullmatch(args.node_root):
                raise InstallError("NODE_ROOT", args.node_root, "must be an absolute path of letters, "
                                   "digits and ._+@/-")
            uninstall(Layout(args.prefix, args.destdir, args.sysconfdir), args.node_root.rstrip("/"))
        elif args.action == "install":
            layout = Layout(args.prefix, args.destdir, args.sysconfdir)
            install(layout, Interpreter(args.python), args.launcher_cc, build)
        else:
            if not re.fullmatch(r"[^\n<>]+ <[^\s<>]+>", args.maintainer):
                raise InstallError("DEB_MAINTAINER", args.maintainer, "must be 'Name <address>'")
            deb(Interpreter(args.python), args.launcher_cc, build, Path(args.out or build),
                args.maintainer)
    except InstallError as exc:
        print(f"{args.action}: {exc}", file=sys.stderr)
        return 1
    except subprocess.CalledProcessError as exc:
        print(f"{args.action}: {shlex.join(map(str, exc.cmd))}: exit status {exc.returncode}",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
