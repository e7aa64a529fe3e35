"""make install as an operator runs it on a node: a runtime in an environment
of its own under the prefix, made with the distribution's python3, that runs
GPU containers on the (simulated) GPU through the installed launcher and real
runc from any shell; a re-install upgrades it in place, offline; uninstall
leaves nothing."""
import json
import os
import subprocess

import pytest

from tests.conftest import LIBVGPU, ROOT
from tests.runtime.node import CUDA_ALLOC, TIMEOUT
from .conftest import DISTRO_PYTHON, Install, InstalledNode, make

GPU = {"hami.io/gpumem": "3000", "hami.io/gpucores": "30"}


def files_under(top):
    return sorted(p for p in top.rglob("*") if p.is_symlink() or p.is_file())


def naming(top, text):
    """Files and links under top whose bytes or target contain text."""
    found = []
    for path in files_under(top):
        content = os.readlink(path).encode() if path.is_symlink() else path.read_bytes()
        if text.encode() in content:
            found.append(path)
    return found


def installed_node(installed, tmp_path, rootfs, spec_template, sim_copy, runtime="bin/hami-runtime"):
    return InstalledNode(tmp_path, rootfs, spec_template, sim_copy,
                         [installed.prefix / runtime], [installed.bin / "hamictl"])


@pytest.fixture
def node(installed, tmp_path, rootfs, spec_template, sim_copy):
    n = installed_node(installed, tmp_path, rootfs, spec_template, sim_copy)
    yield n
    n.cleanup()


def test_layout_names_the_prefix_and_nothing_of_the_build(installed):
    """Everything under the prefix; the environment runs the distribution's
    interpreter; no file names the build tree; the system's Python got nothing."""
    assert os.readlink(installed.bin / "hami-runtime") == "../lib/hami/hami-runtime"
    for name in ("hamictl", "hami-hook"):
        assert os.access(installed.bin / name, os.X_OK)
    assert (installed.lib / "libvgpu.so").is_file()
    assert os.path.realpath(installed.venv / "bin" / "python3") == os.path.realpath(DISTRO_PYTHON)
    assert (installed.venv / "share" / "hami" / "region.h").read_bytes() == \
        (ROOT / "libvgpu_src" / "region.h").read_bytes()
    assert (installed.site_packages() / "hami_runtime" / "node" / "_region_ffi.py").is_file()
    launcher = (installed.lib / "hami-runtime").read_bytes()
    assert f"{installed.venv}/bin/python3".encode() in launcher
    assert str(installed.site_packages()).encode() in launcher
    assert naming(installed.prefix, str(ROOT)) == [] and naming(installed.prefix, "venv.new") == []
    assert not list(installed.site_packages().rglob("*.pth"))
    proc = subprocess.run([DISTRO_PYTHON, "-I", "-c", "import hami_runtime"], capture_output=True,
                          text=True, timeout=TIMEOUT)
    assert "No module named 'hami_runtime'" in proc.stderr
    example = (ROOT / "examples" / "config.toml").read_text()
    assert installed.config.read_text() == example.replace(
        "/etc/hami/config.toml", str(installed.config), 1)


@pytest.mark.parametrize("entry,args,expected", [
    ("hamictl", ("--help",), "Usage: hamictl"),
    ("hami-hook", (), "usage: hami-hook"),
    ("hami-runtime", ("--version",), "runc version"),  # runc's lines after ours
    ("hami-runtime", ("--version",), "hami-runtime version"),
    ("hamictl", ("--version",), "hamictl version"),
    # no NVIDIA toolkit here: make install's stand-in, which refuses a --gpus container under runc
    ("nvidia-container-runtime-hook", ("prestart",), "this node's GPUs are served by hami-runtime"),
])
def test_entry_points_run_with_no_environment(installed, entry, args, expected):
    proc = subprocess.run([installed.bin / entry, *args], env={}, capture_output=True, text=True,
                          timeout=TIMEOUT, cwd="/")
    assert expected in proc.stdout + proc.stderr


@pytest.mark.skipif(not CUDA_ALLOC.exists(), reason="make sim builds the test program")
@pytest.mark.parametrize("runtime,hook", [
    ("bin/hami-runtime", "lib/hami/hami-runtime"),                  # the launcher and its C hook
    ("lib/hami/venv/bin/hami-runtime", "lib/hami/venv/bin/python3"),  # Python alone, its hook
])
def test_gpu_container_through_the_installed_runtime(installed, tmp_path, rootfs, spec_template,
                                                     sim_copy, runtime, hook):
    """Limits seen inside, an allocation past them refused, hamictl (no env)
    showing the container, and everything released on delete."""
    node = installed_node(installed, tmp_path, rootfs, spec_template, sim_copy, runtime)
    try:
        check_gpu_container(installed, node, hook)
    finally:
        node.cleanup()


def check_gpu_container(installed, node, hook):
    bundle = node.bundle("c1", GPU)
    proc = node.runtime("run", "--detach", "--bundle", str(bundle), "c1")
    assert proc.returncode == 0, proc.stderr
    spec = json.loads((bundle / "config.json").read_text())
    [lib] = [m for m in spec["mounts"] if m["destination"] == "/usr/local/vgpu/libvgpu.so"]
    assert lib["source"] == str(installed.lib / "libvgpu.so")  # the default: the install's
    assert [h["path"] for h in spec["hooks"]["createRuntime"]] == [str(installed.prefix / hook)]
    inside = node.runtime("exec", "c1", "sh", "-c", "env; cuda_alloc 1000 1000 1500")
    assert inside.returncode == 0, inside.stderr
    lines = inside.stdout.splitlines()
    assert "CUDA_DEVICE_MEMORY_LIMIT_0=3000m" in lines and "total 3000" in lines
    assert ["alloc 1000 0", "alloc 1000 0", "alloc 1500 2"] == [x for x in lines if x.startswith("alloc")]
    [row] = node.ps()
    assert (row["container"], row["memory_mib"], row["cores"]) == ("c1", 3000, 30) and row["pid"] > 0
    table = node.hamictl("ps")
    assert table.returncode == 0 and "3000MiB" in table.stdout, table.stderr
    gpus = json.loads(node.hamictl("gpus", "--json").stdout)
    assert (gpus[0]["slots_used"], gpus[0]["memory_allocated_mib"]) == (1, 3000)
    assert node.runtime("kill", "c1", "KILL").returncode == 0
    assert node.runtime("delete", "--force", "c1").returncode == 0
    assert node.containers() == []
    assert node.released()  # the launcher's release runs detached after runc's delete
    assert node.ps() == []
    assert os.listdir(node.state_dir / "containers") == os.listdir(node.state_dir / "private") == []
    gpus = json.loads(node.hamictl("gpus", "--json").stdout)
    assert (gpus[0]["slots_used"], gpus[0]["memory_allocated_mib"]) == (0, 0)


def offline():
    """make run in a network namespace of its own (no network), where one can be made."""
    probe = subprocess.run(["unshare", "-n", "true"], capture_output=True, timeout=TIMEOUT)
    return ("unshare", "-n") if probe.returncode == 0 else ()


def test_reinstall_upgrades_in_place_offline(installed, node):
    """What the old version had and the new one has not is gone; the launcher
    keeps its path (engines name it); an edited config stays; no network needed."""
    site = installed.site_packages()
    stale = [site / "hami_runtime" / "retired_module.py", installed.venv / "bin" / "retired-tool",
             site / "retired_dep-1.0.dist-info" / "METADATA"]
    for path in stale:
        path.parent.mkdir(exist_ok=True)
        path.write_text("from the old version\n")
    launcher = installed.lib / "hami-runtime"
    before = launcher.stat().st_ino
    installed.config.write_text(installed.config.read_text() + "split_count = 4\n")
    installed.make(wrap=offline())
    assert [p for p in stale if p.exists()] == []
    assert sorted(p.name for p in installed.lib.iterdir()) == ["hami-runtime", "libvgpu.so", "venv"]
    assert launcher.stat().st_ino != before  # replaced by rename, at the same path
    assert installed.config.read_text().endswith("split_count = 4\n")
    gpus = node.hamictl("gpus", "--json")
    assert gpus.returncode == 0 and len(json.loads(gpus.stdout)) == 2, gpus.stderr
    assert naming(installed.prefix, str(ROOT)) == []


def plant_node_cache(node_root):
    """The node's config cache as the runtime leaves it: entries, a killed
    writer's temp file, the key."""
    cache, key_dir = node_root / "var" / "cache" / "hami", node_root / "var" / "lib" / "hami"
    cache.mkdir(parents=True)
    key_dir.mkdir(parents=True, mode=0o700)
    for name in ("config-0123456789abcdef.json", "config-fedcba9876543210.json", ".hami-42-0123456789ab"):
        (cache / name).write_text("{}")
    (key_dir / "cache-key").write_bytes(b"k" * 32)
    (key_dir / "cache-key").chmod(0o600)
    return cache, key_dir


@pytest.mark.parametrize("edit,config_left", [(False, False), (True, True)])
def test_uninstall_leaves_nothing(tmp_path, edit, config_left):
    """Every file make install wrote is removed, and the node's config cache the
    runtime made; the config only while it is the shipped one (an operator's
    edits stay)."""
    inst = Install(tmp_path)
    inst.make()
    if edit:
        inst.config.write_text(inst.config.read_text() + 'log_level = "debug"\n')
    cache, key_dir = plant_node_cache(tmp_path / "node")
    out = inst.make("uninstall", args=[f"NODE_ROOT={tmp_path / 'node'}"])
    assert files_under(inst.prefix) == []
    assert not inst.lib.exists()
    assert inst.config.exists() == config_left
    assert ("kept" in out) == config_left
    assert not cache.exists() and not key_dir.exists()
    assert f"uninstall: removed the node's config cache ({cache} and {key_dir}/cache-key; " in out


def foreign_file(cache, key_dir, victim):
    (cache / "notes.txt").write_text("the operator's")


def linked_entry(cache, key_dir, victim):
    (cache / "config-0000000000000000.json").symlink_to(victim)


def foreign_owner(cache, key_dir, victim):
    os.chown(cache / "config-0123456789abcdef.json", 4242, 4242)


def a_subdir(cache, key_dir, victim):
    (cache / "config-1111111111111111.json").mkdir()


def linked_cache_dir(cache, key_dir, victim):
    for path in cache.iterdir():
        path.unlink()
    cache.rmdir()
    cache.symlink_to(victim.parent)


def linked_key(cache, key_dir, victim):
    (key_dir / "cache-key").unlink()
    (key_dir / "cache-key").symlink_to(victim)


def key_dir_writable(cache, key_dir, victim):
    key_dir.chmod(0o777)


def other_key_file(cache, key_dir, victim):
    (key_dir / "other").write_text("not ours")


UNINSTALL_CACHE = [
    # (what is there besides the runtime's files, paths that stay, what is said of them)
    (None, [], []),
    (foreign_file, ["var/cache/hami/notes.txt"], ["left {cache}: holds notes.txt, not the runtime's"]),
    (linked_entry, ["var/cache/hami/config-0000000000000000.json"],
     ["left {cache}: holds config-0000000000000000.json (a symbolic link), not the runtime's"]),
    (foreign_owner, ["var/cache/hami/config-0123456789abcdef.json"],
     ["left {cache}: holds config-0123456789abcdef.json (owned by uid 4242), not the runtime's"]),
    (a_subdir, ["var/cache/hami/config-1111111111111111.json"],
     ["left {cache}: holds config-1111111111111111.json (not a regular file), not the runtime's"]),
    (linked_cache_dir, ["var/cache/hami"], ["left {cache}: not a directory (a symbolic link?)"]),
    (linked_key, ["var/lib/hami/cache-key"], ["left {key_dir}: holds cache-key (a symbolic link), not the runtime's"]),
    (key_dir_writable, ["var/lib/hami/cache-key"],
     ["left {key_dir}: {key_dir} is writable by group or others"]),
    (other_key_file, ["var/lib/hami/other"], ["left {key_dir}: holds other, not the runtime's"]),
]


@pytest.mark.parametrize("plant,stays,said", UNINSTALL_CACHE,
                         ids=[p.__name__ if p else "ours-only" for p, _, _ in UNINSTALL_CACHE])
def test_uninstall_removes_the_node_cache_and_nothing_else(tmp_path, capsys, plant, stays, said):
    """The node's config cache and its key go with the install: only files named
    as the runtime names its own, regular and root's, each removed by name in a
    dir opened without following a link (a hostPath could reach these dirs);
    a dir goes once empty; what is left is named. A staged (DESTDIR) tree has
    none of the node's."""
    from hami_runtime import config_cache
    install_py = load_install_py()
    assert install_py.NODE_CONFIG_CACHE == config_cache.PERSISTENT_DIR
    assert install_py.NODE_CACHE_KEY == os.path.join(config_cache.KEY_DIR, config_cache.KEY_FILE)
    node = tmp_path / "node"
    victim = tmp_path / "victim" / "config-2222222222222222.json"
    victim.parent.mkdir()
    victim.write_text("keep me")
    cache, key_dir = plant_node_cache(node)
    if plant:
        plant(cache, key_dir, victim)
    layout = install_py.Layout(str(tmp_path / "prefix"), "", str(tmp_path / "etc"))
    install_py.uninstall(install_py.Layout(str(tmp_path / "prefix"), str(tmp_path / "stage"),
                                           str(tmp_path / "etc")), str(node))
    assert "config cache" not in capsys.readouterr().out and os.path.lexists(key_dir / "cache-key")
    install_py.uninstall(layout, str(node))
    out = capsys.readouterr().out.splitlines()
    assert victim.read_text() == "keep me" and sorted(os.listdir(victim.parent)) == [victim.name]
    left = sorted(str(p.relative_to(node)) for p in node.rglob("*")
                  if not p.is_dir() or p.is_symlink() or not any(p.iterdir()))
    assert left == sorted(["var/cache", "var/lib"] if not stays else
                          stays + [d for d in ("var/cache", "var/lib")
                                                if not any(x.startswith(d + "/") for x in stays)])
    assert [x for x in out if x.startswith("uninstall: left ")] == \
        [f"uninstall: {x.format(cache=cache, key_dir=key_dir)}" for x in said]
    install_py.uninstall(layout, str(node))  # again: nothing more to do, the same said
    again = capsys.readouterr().out.splitlines()
    assert [x for x in again if x.startswith("uninstall: left ")] == \
        [f"uninstall: {x.format(cache=cache, key_dir=key_dir)}" for x in said]


def load_install_py():
    import importlib.util
    spec = importlib.util.spec_from_file_location("install_py", ROOT / "packaging" / "install.py")
    install_py = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(install_py)
    return install_py


@pytest.mark.parametrize("sysconfdir", ["/etc", "/opt/site/etc/", "/usr/local/etc"])
def test_installed_config_names_its_own_path(tmp_path, sysconfdir):
    """The config make install writes says in its first line where it is
    (SYSCONFDIR's, not always /etc's); the rest is the example's, still valid,
    and uninstall still knows it for the shipped one."""
    import tomllib

    from hami_runtime import config
    install_py = load_install_py()
    layout = install_py.Layout(str(tmp_path / "prefix"), str(tmp_path / "stage"), sysconfdir)
    text = layout.config_text().decode()
    where = f"{sysconfdir.rstrip('/')}/hami/config.toml"
    assert text.splitlines()[0] == \
        f"# hami-runtime node config: {where} (HAMI_CONFIG names another file)."
    example = (ROOT / "examples" / "config.toml").read_text()
    assert text.splitlines()[1:] == example.splitlines()[1:]
    assert config.Config(**tomllib.loads(text)) == config.Config()
    staged = layout.staged(layout.config)
    staged.parent.mkdir(parents=True)
    staged.write_bytes(layout.config_text())
    install_py.uninstall(layout)
    assert not staged.exists()


def test_bad_prefix_is_one_line(tmp_path):
    proc = make("install", "PREFIX=relative/dir", f"SYSCONFDIR={tmp_path}")
    assert proc.returncode != 0
    assert "install: PREFIX='relative/dir': must be an absolute path" in proc.stdout
    assert not (ROOT / "relative").exists()


def dynamic_symbols(path):
    return subprocess.run(["nm", "-D", "--defined-only", path], capture_output=True, text=True,
                          check=True, timeout=TIMEOUT).stdout.split()[2::3]


def test_installed_libvgpu_exports_what_the_built_one_does(installed):
    """Stripped of its debug sections (they name the build tree), the library
    containers get still exports every entry point of the build's."""
    assert dynamic_symbols(installed.lib / "libvgpu.so") == dynamic_symbols(LIBVGPU)


@pytest.mark.skipif(not CUDA_ALLOC.exists(), reason="make sim builds the test program")
def test_the_install_reads_its_own_config(installed, tmp_path, rootfs, spec_template, sim_copy):
    """SYSCONFDIR is baked in: with HAMI_CONFIG unset, hamictl, the launcher and
    the runtime behind it read <SYSCONFDIR>/hami/config.toml; the install's last
    lines say which config is read and how to check the node."""
    assert installed.output.rstrip().splitlines()[-2:] == [
        f"install: hami-runtime and hamictl read {installed.config} "
        "(HAMI_CONFIG, where set, names another)",
        f"install: check the node with {installed.bin}/hamictl doctor"]
    node = installed_node(installed, tmp_path, rootfs, spec_template, sim_copy)
    shipped = installed.config.read_bytes()
    installed.config.write_bytes(node.config.read_bytes())  # the simulated GPU's
    node.config.unlink()
    no_config = {"HAMI_SIM_STATE": str(node.sim_state / "gpu.state")}
    try:
        gpus = subprocess.run([installed.bin / "hamictl", "gpus", "--json"], env=no_config,
                              capture_output=True, text=True, timeout=TIMEOUT, cwd="/")
        assert gpus.returncode == 0 and len(json.loads(gpus.stdout)) == 2, gpus.stderr
        health = subprocess.run([installed.bin / "hamictl", "doctor"], env=no_config,
                                capture_output=True, text=True, timeout=TIMEOUT, cwd="/")
        assert health.returncode == 0 and f"config: {installed.config}\n" in health.stdout, health.stdout
        bundle = node.bundle("own", GPU)
        with open(tmp_path / "err", "wb") as err:  # a file: the container inherits it
            proc = subprocess.run(node.runtime_argv("run", "--detach", "--bundle", str(bundle), "own",
                                                    cmd=node.runtime_cmd), env=no_config, cwd="/",
                                  stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err,
                                  timeout=TIMEOUT)
        assert proc.returncode == 0, (tmp_path / "err").read_text()
        assert [e["id"] for e in node.allocations().values()] == ["own"]  # the config's state dir
    finally:
        node.cleanup()
        installed.config.write_bytes(shipped)
