"""The config file: defaults, every key, refusals naming the key."""
import json
import os
from pathlib import Path

import jsonschema
import pytest

from hami_runtime import config
from hami_runtime.errors import HamiError

SCHEMA = json.loads((Path(__file__).resolve().parents[2] / "schemas" / "config.schema.json").read_text())

FULL = """
runtime = ["/usr/sbin/runc"]
state_dir = "/run/hami"
libvgpu = "/usr/local/lib/hami/libvgpu.so"
split_count = 4
memory_scaling = 1.5
default_memory_mib = 1024
default_cores = 20
core_policy = "force"
policy = "spread"
driver_root = "/"
dev_root = "/dev"
proc_devices = "/proc/devices"
nvml_library = ""
env_requests = false
log_file = "/var/log/hami.log"
log_level = "debug"
hook_command = ["/usr/local/bin/hami-hook"]
[extra_env]
FOO = "bar"
[[extra_mounts]]
source = "/srv/a"
destination = "/a"
readonly = true
"""


def test_full_config(tmp_path, monkeypatch):
    path = tmp_path / "c.toml"
    path.write_text(FULL)
    cfg = config.load(str(path))
    assert cfg.split_count == 4 and cfg.memory_scaling == 1.5 and cfg.policy == "spread"
    assert cfg.core_policy == "force"
    assert cfg.env_requests is False and cfg.extra_env == {"FOO": "bar"}
    assert cfg.extra_mounts == [{"source": "/srv/a", "destination": "/a", "readonly": True}]
    import tomllib
    jsonschema.validate(tomllib.loads(FULL), SCHEMA)


def test_defaults(monkeypatch):
    monkeypatch.delenv("HAMI_CONFIG", raising=False)
    monkeypatch.setattr(config, "DEFAULT_PATH", "/nonexistent/hami.toml")
    cfg = config.load("/nonexistent/hami.toml")
    assert cfg.split_count == 10 and cfg.memory_scaling == 1.0 and cfg.policy == "binpack"
    assert cfg.core_policy == "default"


@pytest.mark.parametrize("text,key", [
    ("split_count = 0", "config split_count"),
    ("split_count = \"10\"", "config split_count"),
    ("memory_scaling = 0", "config memory_scaling"),
    ("policy = \"random\"", "config policy"),
    ("state_dir = \"relative/dir\"", "config state_dir"),
    ("runtime = []", "config runtime"),
    ("colour = \"blue\"", "config colour"),
    ("default_cores = 101", "config default_cores"),
    ("core_policy = \"sometimes\"", "config core_policy"),
    ("env_requests = \"yes\"", "config env_requests"),
    ("log_level = \"loud\"", "config log_level"),
    ("[extra_env]\n\"1BAD\" = \"x\"", "config extra_env.1BAD"),
    ("[[extra_mounts]]\nsource = \"/a\"", "config extra_mounts[0].destination"),
    ("[[extra_mounts]]\nsource = \"a\"\ndestination = \"/b\"", "config extra_mounts[0].source"),
    ("runtime = [\"/usr/bin/runc\", \"runc\"]", "config runtime[1]"),
    ("split_count = true", "config split_count"),
    ("hook_command = [\"hami-hook\"]", "config hook_command"),
    ("[[extra_mounts]]\nsource = \"/a\"\ndestination = \"/b\"\nmode = 1", "config extra_mounts[0].mode"),
])
def test_bad_values_name_the_key(tmp_path, text, key):
    path = tmp_path / "c.toml"
    path.write_text(text + "\n")
    with pytest.raises(HamiError) as caught:
        config.load(str(path))
    assert caught.value.field == key
    assert f"(in {path})" in str(caught.value)  # and the file


def test_runtime_that_is_us_is_refused(tmp_path):
    me = tmp_path / "hami-runtime"
    me.write_text("#!/bin/sh\n")
    me.chmod(0o755)
    with pytest.raises(HamiError, match="itself"):
        config.real_runtime(config.Config(runtime=[str(me)]))
    with pytest.raises(HamiError, match="no executable"):
        config.real_runtime(config.Config(runtime=[str(tmp_path / "none")]))


def test_sim_config_matches_schema():
    from tests.conftest import SIM
    import tomllib
    path = SIM / "hami.toml"
    if not path.exists():
        pytest.skip("make sim writes build/sim/hami.toml")
    raw = tomllib.loads(path.read_text())
    jsonschema.validate(raw, SCHEMA)
    cfg = config.Config(**raw)
    assert cfg.extra_env["HAMI_SIM_STATE"].startswith("/run/hami-sim/")
    assert os.path.isabs(cfg.nvml_library) and os.path.isabs(cfg.driver_root)


def test_config_is_read_only_with_fresh_defaults():
    a, b = config.Config(), config.Config()
    assert a == b and a.runtime is not b.runtime and a.extra_env is not b.extra_env
    assert config.Config(split_count=4) != a and "split_count=4" in repr(config.Config(split_count=4))
    with pytest.raises(AttributeError):
        a.split_count = 3
    with pytest.raises(HamiError, match="unknown key"):
        config.Config(no_such_key=1)


def test_schema_file_is_the_models():
    """schemas/config.schema.json is what `python -m hami_runtime.config_model` writes."""
    from hami_runtime import config_model
    assert SCHEMA == config_model.schema()


@pytest.mark.parametrize("text", [FULL, "", "split_count = 3\n"])
def test_schema_and_model_accept_the_same(tmp_path, text):
    import tomllib
    jsonschema.validate(tomllib.loads(text), SCHEMA)
    path = tmp_path / "c.toml"
    path.write_text(text)
    config.load(str(path))


@pytest.mark.parametrize("text,says", [
    ('split_count = "4"', "(it is given as a string, in quotes)"),
    ("split_count = 4", None),
])
def test_a_number_in_quotes_is_named_a_string(tmp_path, text, says):
    path = tmp_path / "c.toml"
    path.write_text(text + "\n")
    if says is None:
        assert config.load(str(path)).split_count == 4
        return
    with pytest.raises(HamiError) as caught:
        config.load(str(path))
    assert says in str(caught.value)


@pytest.mark.parametrize("chosen_by,field", [("HAMI_CONFIG", "HAMI_CONFIG"), ("default", "config file")])
def test_a_bad_file_is_named_by_what_chose_it(tmp_path, monkeypatch, chosen_by, field):
    path = tmp_path / "hami.toml"
    path.write_text("split_count = [\n")
    if chosen_by == "HAMI_CONFIG":
        monkeypatch.setenv("HAMI_CONFIG", str(path))
    else:
        monkeypatch.delenv("HAMI_CONFIG", raising=False)
        monkeypatch.setattr(config, "DEFAULT_PATH", str(path))
    with pytest.raises(HamiError) as caught:
        config.load()
    assert caught.value.line().startswith(f"{field}='{path}': not valid TOML")
