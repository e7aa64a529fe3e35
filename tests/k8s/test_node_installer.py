"""packaging/node_installer.py (what deploy/'s DaemonSet runs) against a host
root in a temp dir holding real containerd 1.6's default config: install,
upgrade and uninstall; what real containerd makes of the config it writes;
CRI-O's drop-in; a symbolic link planted in the host root, never followed."""
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT
from tests.k8s.host_root import snapshot

sys.path.insert(0, str(ROOT / "packaging"))
import node_engines as engines  # noqa: E402

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

INSTALLER = ROOT / "packaging" / "node_installer.py"
DISTRO_PYTHON = Path("/usr/bin/python3")
DISTRO_PATH = "/usr/bin:/bin:/usr/sbin:/sbin"
TIMEOUT = 300
CRI = engines.CRI


def containerd_default() -> str:
    binary = shutil.which("containerd")
    if not binary:
        pytest.skip("no containerd binary")
    text = subprocess.run([binary, "config", "default"], capture_output=True, text=True, check=True,
                          timeout=60).stdout
    assert "version = 2" in text and "imports = []" in text
    # the node runs systemd cgroups, as kubelet nodes do: the handler must too
    return text.replace("SystemdCgroup = false", "SystemdCgroup = true")


@pytest.fixture
def host(tmp_path):
    """A host root: containerd's config, /usr/local, and the interpreter the tree's environment names."""
    if not DISTRO_PYTHON.exists():
        pytest.skip("no distribution python3 at /usr/bin/python3")
    root = tmp_path / "host"
    (root / "etc" / "containerd").mkdir(parents=True)
    (root / "etc" / "containerd" / "config.toml").write_text(containerd_default())
    (root / "usr" / "local").mkdir(parents=True)
    real = os.path.realpath(DISTRO_PYTHON)
    (root / real.lstrip("/")).parent.mkdir(parents=True, exist_ok=True)
    (root / real.lstrip("/")).symlink_to(real)
    return root


def installer(root, *args):
    env = {"PATH": DISTRO_PATH, "HOME": os.environ.get("HOME", "/root")}
    argv = [str(DISTRO_PYTHON), str(INSTALLER), args[0], "--host-root", str(root), *args[1:]]
    if args[0] != "uninstall":
        argv += ["--python", str(DISTRO_PYTHON), "--make-flag=-o", "--make-flag=.venv/.installed"]
    return subprocess.run(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          timeout=TIMEOUT)


def dumped(root: Path) -> dict:
    """containerd's own merged view of the host's config, the conf.d import pointed
    into the host root (the only change): containerd config dump."""
    config = root / "etc" / "containerd" / "config.toml"
    text = config.read_text().replace(f'"{engines.CONTAINERD_IMPORT}"',
                                      f'"{root}{engines.CONTAINERD_IMPORT}"')
    probe = root.parent / "dump.toml"
    probe.write_text(text)
    proc = subprocess.run([shutil.which("containerd"), "--config", str(probe), "config", "dump"],
                          capture_output=True, text=True, timeout=60)
    probe.unlink()
    assert proc.returncode == 0, proc.stderr
    return tomllib.loads(proc.stdout)


# the edits themselves

MINIMAL = "version = 2\n"
WITH_IMPORTS = '# node config\nimports = ["/etc/containerd/extra.toml"]\nversion = 2\n\n[plugins]\n'


@pytest.mark.parametrize("text", [MINIMAL, WITH_IMPORTS, "version = 2\nimports = []\n",
                                  'imports = [\n  "/a.toml",\n]\nversion = 2\n'])
def test_imports_edit_is_undone_byte_for_byte(text):
    edited, edit = engines.imports_edit(text)
    assert engines.CONTAINERD_IMPORT in tomllib.loads(edited)["imports"]
    assert tomllib.loads(edited)["version"] == 2
    assert engines.undo_imports(edited, edit) == text
    assert engines.imports_edit(edited) == (edited, None)  # an import reads it already: no edit


def test_existing_imports_are_kept():
    edited, edit = engines.imports_edit(WITH_IMPORTS)
    assert tomllib.loads(edited)["imports"] == ["/etc/containerd/extra.toml", engines.CONTAINERD_IMPORT]
    assert edited.replace(edit["new"], edit["original"]) == WITH_IMPORTS


def test_dropin_of_a_minimal_config_keeps_the_default_runtime():
    dropin = tomllib.loads(engines.containerd_dropin(MINIMAL, "/usr/local/hami/bin/hami-runtime"))
    runtimes = dropin["plugins"][CRI]["containerd"]["runtimes"]
    assert runtimes["runc"] == {"runtime_type": "io.containerd.runc.v2"}
    assert runtimes["hami"]["options"] == {"BinaryName": "/usr/local/hami/bin/hami-runtime"}


@pytest.mark.parametrize("text,message", [
    ('[plugins.cri]\n', "version=1: only version = 2"),
    ('version = 3\n', "version=3: only version = 2"),
    (f'version = 2\n[plugins."{CRI}".containerd.runtimes.hami]\n', "runtimes.hami]: already there"),
    (f'version = 2\n[plugins]\n"{CRI}".x = 1\n', "cannot be copied line by line"),
])
def test_configs_it_cannot_edit_are_refused_in_one_line(text, message):
    with pytest.raises(engines.EngineConfigError) as info:
        engines.containerd_dropin(text, "/x/bin/hami-runtime")
    assert message in str(info.value) and "\n" not in str(info.value)


# the installer on a host root

def test_install_upgrade_uninstall_containerd(host):
    before = snapshot(host)
    original = (host / "etc/containerd/config.toml").read_bytes()
    proc = installer(host, "install", "--version", "1.0.0")
    assert proc.returncode == 0, proc.stdout
    prefix = host / "usr/local/hami"
    assert os.readlink(prefix / "current") == "versions/1.0.0"
    assert os.readlink(prefix / "bin") == "current/bin"
    assert os.access(prefix / "bin" / "hami-runtime", os.X_OK)
    assert (prefix / "etc/hami/config.toml").is_file()
    config = (host / "etc/containerd/config.toml").read_text()
    assert tomllib.loads(config)["imports"] == [engines.CONTAINERD_IMPORT]
    assert config.replace(f'imports = ["{engines.CONTAINERD_IMPORT}"]', "imports = []").encode() == original
    # what containerd itself makes of it: the handler, and the node's runc settings as they were
    cri = dumped(host)["plugins"][CRI]["containerd"]
    assert cri["runtimes"]["hami"]["runtime_type"] == "io.containerd.runc.v2"
    assert cri["runtimes"]["hami"]["options"]["BinaryName"] == "/usr/local/hami/bin/hami-runtime"
    assert cri["runtimes"]["hami"]["options"]["SystemdCgroup"] is True
    assert cri["runtimes"]["runc"]["options"]["SystemdCgroup"] is True
    assert cri["default_runtime_name"] == "runc"
    assert "pod_annotations" in cri["runtimes"]["hami"]
    dropin = (host / "etc/containerd/conf.d/hami.toml").read_bytes()

    # an upgrade: the new tree beside the old, one switch; the engine config untouched
    proc = installer(host, "upgrade", "--version", "1.1.0")
    assert proc.returncode == 0, proc.stdout
    assert os.readlink(prefix / "current") == "versions/1.1.0"
    assert sorted(os.listdir(prefix / "versions")) == ["1.0.0", "1.1.0"]  # running containers' files kept
    assert not [n for n in os.listdir(prefix) if n.startswith(".")]  # no temp link left over
    assert (host / "etc/containerd/conf.d/hami.toml").read_bytes() == dropin
    assert "restarted" not in proc.stdout
    proc = installer(host, "install", "--version", "1.2.0")  # the DaemonSet's next image
    assert proc.returncode == 0, proc.stdout
    assert sorted(os.listdir(prefix / "versions")) == ["1.1.0", "1.2.0"]

    # a running container's allocation, left alone by uninstall
    (host / "run/hami/containers/c1").mkdir(parents=True)
    proc = installer(host, "uninstall")
    assert proc.returncode == 0, proc.stdout
    assert (host / "etc/containerd/config.toml").read_bytes() == original
    after = snapshot(host)
    assert after.pop("run/hami/containers/c1", "") is None
    assert {k: v for k, v in after.items() if not k.startswith("run")} == before
    [line] = [x for x in proc.stdout.splitlines() if "left /run/hami" in x]
    assert "1 running container" in line


def test_upgrade_of_nothing_is_refused(host):
    proc = installer(host, "upgrade")
    assert proc.returncode == 1
    assert proc.stdout.strip().splitlines() == [
        "node_installer: --prefix='/usr/local/hami': nothing installed there to upgrade"]


def test_crio_dropin_written_and_removed(host):
    before = snapshot(host)
    proc = installer(host, "install", "--engine", "crio")
    assert proc.returncode == 0, proc.stdout
    conf = tomllib.loads((host / engines.CRIO_DROPIN.lstrip("/")).read_text())
    assert conf["crio"]["runtime"]["runtimes"]["hami"] == {
        "runtime_path": "/usr/local/hami/bin/hami-runtime", "runtime_type": "oci",
        "runtime_root": "/run/runc", "allowed_annotations": []}
    assert snapshot(host)["etc/containerd/config.toml"] == before["etc/containerd/config.toml"]
    proc = installer(host, "uninstall")
    assert proc.returncode == 0, proc.stdout
    assert snapshot(host) == before


@pytest.mark.parametrize("planted", ["etc/containerd", "etc/containerd/config.toml", "usr/local"])
def test_a_planted_link_is_not_followed(host, tmp_path, planted):
    elsewhere = tmp_path / "elsewhere"
    shutil.copytree(host / "etc/containerd", elsewhere) if planted == "etc/containerd" else elsewhere.mkdir()
    if planted == "etc/containerd/config.toml":
        shutil.copy(host / planted, elsewhere / "config.toml")
        target = elsewhere / "config.toml"
    else:
        target = elsewhere
    path = host / planted
    shutil.rmtree(path) if path.is_dir() else path.unlink()
    path.symlink_to(target)
    outside = snapshot(elsewhere)
    before = snapshot(host)
    proc = installer(host, "install")
    assert proc.returncode == 1
    [line] = proc.stdout.strip().splitlines()
    assert line.startswith("node_installer: host path='/") and "symbolic link" in line and "not followed" in line
    assert snapshot(elsewhere) == outside
    assert snapshot(host) == before
