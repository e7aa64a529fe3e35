"""Every refused create reaches the runtime's own log (config log_file) at
warning, with the container id, the pod's names where the spec has them and the
same one line the engine gets; a refusal about a config value says where the
value came from."""
import subprocess

import pytest

from hami_runtime import config, config_origin
from hami_runtime.errors import HamiError
from .node import HAMICTL, TIMEOUT

POD = {"io.kubernetes.cri.container-type": "container", "io.kubernetes.cri.sandbox-id": "5b1c0d2a9b7e4c11",
       "io.kubernetes.cri.container-name": "trainer", "io.kubernetes.cri.sandbox-name": "llm-0",
       "io.kubernetes.cri.sandbox-namespace": "team-a"}

CASES = [
    # (case, annotations, env, config overrides, what the line says)
    ("bad-request", {"hami.io/gpumem": "3g"}, (), {}, "hami.io/gpumem='3g'"),
    ("no-room", {"hami.io/gpu": "3"}, (), {}, "2 of 3 GPU(s) have room: the node has 2 GPU(s)"),
    ("unmet-requirement", {"hami.io/gpumem": "10"}, ("NVIDIA_REQUIRE_CUDA=cuda>=99.0",), {},
     "NVIDIA_REQUIRE_CUDA"),
    ("pod-no-room", {**POD, "hami.io/gpumem": "90000"}, (), {},
     "(container trainer of pod team-a/llm-0): refused: request='hami.io/gpumem=90000'"),
    ("config-value", {"hami.io/gpumem": "10"}, (), {"libvgpu": "/nonexistent/libvgpu.so"},
     "config libvgpu='/nonexistent/libvgpu.so': file not found (set in "),
    # the config itself refused: the log it names still gets the line
    ("config-invalid", {"hami.io/gpumem": "10"}, (), {"split_count": 0}, "config split_count='0'"),
]


@pytest.mark.parametrize("case,annotations,env,overrides,says", CASES, ids=[c[0] for c in CASES])
def test_a_refused_create_is_in_the_log_file(node, case, annotations, env, overrides, says):
    log = node.tmp / "hami.log"
    node.write_config(log_file=str(log), log_level="info", **overrides)
    proc = node.create(case, node.bundle(case, annotations, env=env))
    assert proc.returncode == 1
    [line] = proc.stderr.splitlines()
    reason = line.removeprefix("hami-runtime: ")
    [logged] = log.read_text().splitlines()
    assert f" warning pid=" in logged and f" {case}" in logged and logged.endswith(f": refused: {reason}")
    assert says in logged, logged
    assert node.allocations() == {}


def test_a_refusal_is_logged_at_warning_not_below(node):
    log = node.tmp / "hami.log"
    node.write_config(log_file=str(log), log_level="error")
    assert node.create("quiet", node.bundle("quiet", {"hami.io/gpumem": "3g"})).returncode == 1
    assert not log.exists() or log.read_text() == ""


def test_a_default_value_names_the_file_read(node):
    """libvgpu at its default, which this node lacks: the line says it is the
    default and which file was read."""
    if config.Config().libvgpu and __import__("os").path.exists(config.Config().libvgpu):
        pytest.skip("this machine has the default libvgpu")
    node.write_config()
    text = "".join(x for x in node.config.read_text().splitlines(keepends=True)
                   if not x.startswith("libvgpu ="))
    node.config.write_text(text)
    proc = node.create("dflt", node.bundle("dflt", {"hami.io/gpumem": "10"}))
    assert proc.returncode == 1
    assert f"file not found (the default: {node.config} does not set libvgpu)" in proc.stderr


@pytest.mark.parametrize("text,path,expected", [
    ("libvgpu = \"/x.so\"\n", "FILE", "set in FILE"),
    ("split_count = 2\n", "FILE", "the default: FILE does not set libvgpu"),
    (None, "", f"the default: no config file at {config.DEFAULT_PATH}, and HAMI_CONFIG is unset"),
])
def test_origin(tmp_path, text, path, expected):
    if path:
        path = str(tmp_path / "hami.toml")
        (tmp_path / "hami.toml").write_text(text)
    assert config_origin.origin("libvgpu", path) == expected.replace("FILE", path)


def test_explain_leaves_other_fields_and_unread_configs_alone():
    exc = HamiError("hami.io/gpumem", "3g", "not a number")
    assert config_origin.explain(exc, "") is exc
    exc = HamiError("config split_count", 0, "too small (in /etc/hami/config.toml)")
    assert config_origin.explain(exc, None) is exc
    assert config_origin.explain(HamiError("config extra_mounts[0].source", "a", "bad"), "").reason \
        .startswith("bad (the default: no config file")
    assert config_origin.explain(HamiError("NVML", "libnvidia-ml.so.1", "init failed"), "").reason \
        .startswith("init failed (config nvml_library: the default: no config file")


def test_nvml_not_found_names_the_config_read(node):
    """hamictl on a node whose config names another NVML than the loader finds:
    the line says which config was read and that nvml_library is its default."""
    node.write_config()
    text = "".join(x for x in node.config.read_text().splitlines(keepends=True)
                   if not x.startswith("nvml_library ="))
    node.config.write_text(text)
    env = {k: v for k, v in node.env.items() if k != "LD_LIBRARY_PATH"}
    proc = subprocess.run(HAMICTL + ["gpus"], capture_output=True, text=True, env=env, timeout=TIMEOUT)
    if proc.returncode == 0:
        pytest.skip("the loader finds an NVML here")
    assert proc.stderr.startswith("hamictl: NVML=") and proc.stderr.endswith(
        f"(config nvml_library: the default: {node.config} does not set nvml_library)\n"), proc.stderr
