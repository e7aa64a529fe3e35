"""What an install's files are found by: the environment the package lies in
gives libvgpu.so's default and region.h; the shipped node config is the
defaults, written out."""
import re
import sys

import pytest

from hami_runtime import config, installed
from hami_runtime.config_model import NodeConfig
from tests.conftest import ROOT

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

EXAMPLE = ROOT / "examples" / "config.toml"


@pytest.mark.parametrize("package_file,environment,libvgpu", [
    # make install PREFIX=/usr/local, the .deb, a DESTDIR tree copied to /opt
    ("/usr/local/lib/hami/venv/lib/python3.11/site-packages/hami_runtime/installed.py",
     "/usr/local/lib/hami/venv", "/usr/local/lib/hami/libvgpu.so"),
    ("/usr/lib/hami/venv/lib/python3.13/site-packages/hami_runtime/installed.py",
     "/usr/lib/hami/venv", "/usr/lib/hami/libvgpu.so"),
    ("/opt/gpu/lib/hami/venv/lib64/python3.12/site-packages/hami_runtime/installed.py",
     "/opt/gpu/lib/hami/venv", "/opt/gpu/lib/hami/libvgpu.so"),
    # an environment of another layout: the fixed default
    ("/srv/env/lib/python3.11/site-packages/hami_runtime/installed.py", "/srv/env",
     "/usr/local/lib/hami/libvgpu.so"),
    # a source tree, a distribution's dist-packages: no environment of ours
    ("/work/src/hami_runtime/installed.py", "", "/usr/local/lib/hami/libvgpu.so"),
    ("/usr/lib/python3/dist-packages/hami_runtime/installed.py", "", "/usr/local/lib/hami/libvgpu.so"),
])
def test_environment_and_libvgpu(package_file, environment, libvgpu):
    assert installed.environment_of(package_file) == environment
    assert installed.libvgpu_of(environment) == libvgpu


def test_this_tree_has_no_environment():
    assert (installed.ENVIRONMENT, installed.REGION_HEADER) == ("", "")
    assert config.Config().libvgpu == installed.LIBVGPU_ELSEWHERE


def test_example_config_is_valid_and_changes_nothing():
    assert config.Config(**tomllib.loads(EXAMPLE.read_text())) == config.Config()


def test_example_config_lines_are_the_defaults():
    """Each `# key = value` line, uncommented, is that key's default (libvgpu's
    for the default PREFIX); every top-level key is there."""
    text = EXAMPLE.read_text().split("# [extra_env]")[0]
    lines = re.findall(r"^# ([a-z_]+ = .+)$", text, re.M)
    document = tomllib.loads("\n".join(lines))
    assert config.Config(**document) == config.Config()
    assert set(document) == set(NodeConfig.model_fields) - {"extra_env", "extra_mounts", "hook_command"}


def test_an_install_can_write_its_config_path_into_config_py(tmp_path):
    """make install writes SYSCONFDIR's config into config.py's one DEFAULT_PATH
    line (packaging/install.py), so that line stays one plain string."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("install_py", ROOT / "packaging" / "install.py")
    install_py = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(install_py)
    package = tmp_path / "hami_runtime"
    package.mkdir()
    source = (ROOT / "hami_runtime" / "config.py").read_text()
    assert len(install_py.DEFAULT_PATH_LINE.findall(source)) == 1
    assert f'DEFAULT_PATH = "{config.DEFAULT_PATH}"' in source
    (package / "config.py").write_text(source)
    install_py.bake_config_path(tmp_path, "/opt/site/etc/hami/config.toml")
    baked = (package / "config.py").read_text()
    assert baked.replace('"/opt/site/etc/hami/config.toml"', f'"{config.DEFAULT_PATH}"') == source
