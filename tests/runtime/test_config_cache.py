"""The parsed config kept in the state dir: used only for the very file it was
parsed from, only in that file's own state dir, and never a way around a refusal."""
import os
import sys

import pytest

from hami_runtime import config, config_cache
from hami_runtime.errors import HamiError


@pytest.fixture
def settled(monkeypatch):
    monkeypatch.setattr(config_cache, "SETTLED_NS", 0)  # files written just now count as settled


def write_config(tmp_path, body="split_count = 4\n", state_dir=None):
    state = state_dir or tmp_path / "state"
    state.mkdir(exist_ok=True)
    path = tmp_path / "hami.toml"
    path.write_text(f'state_dir = "{state}"  # comment\n{body}')
    return path, state


def no_toml(monkeypatch):
    monkeypatch.setitem(sys.modules, "tomllib", None)  # importing it now fails


def test_second_load_reads_no_toml(tmp_path, monkeypatch, settled):
    path, state = write_config(tmp_path, 'split_count = 4\n[extra_env]\nA = "b"\n')
    first = config.load(str(path))
    assert (state / "cache" / "config.json").is_file()
    no_toml(monkeypatch)
    assert config.load(str(path)) == first
    assert first.split_count == 4 and first.extra_env == {"A": "b"}


def test_an_edited_file_is_parsed_again(tmp_path, settled):
    path, _ = write_config(tmp_path, "split_count = 4\n")
    assert config.load(str(path)).split_count == 4
    path.write_text(path.read_text().replace("split_count = 4", "split_count = 5"))  # same size
    assert config.load(str(path)).split_count == 5


def test_a_file_written_just_now_is_not_kept(tmp_path):
    path, state = write_config(tmp_path)
    config.load(str(path))
    assert not (state / "cache").exists()


def test_the_state_dir_is_made_for_the_cache(tmp_path, settled):
    """Before the first GPU container makes it (after a boot: /run is a tmpfs), so
    that creates without a request need not validate the config each time."""
    path = tmp_path / "hami.toml"
    path.write_text(f'state_dir = "{tmp_path / "absent"}"\n')
    config.load(str(path))
    assert sorted(p.name for p in (tmp_path / "absent").iterdir()) == ["cache"]
    assert (tmp_path / "absent").stat().st_mode & 0o777 == 0o755


@pytest.mark.parametrize("body", ["split_count = 0\n", "policy = \"fastest\"\n", "nope = 1\n"])
def test_refusals_are_never_kept(tmp_path, settled, body):
    path, state = write_config(tmp_path, body)
    for _ in range(2):
        with pytest.raises(HamiError):
            config.load(str(path))
    assert not (state / "cache" / "config.json").exists()


def test_an_entry_for_another_state_dir_is_not_used(tmp_path, monkeypatch, settled):
    path, state = write_config(tmp_path)
    config.load(str(path))
    other = tmp_path / "other"
    (other / "cache").mkdir(parents=True)
    os.rename(state / "cache" / "config.json", other / "cache" / "config.json")
    path.write_text(path.read_text().replace(str(state), str(other)))
    monkeypatch.setattr(config_cache, "file_key", lambda p, st: ["fixed"])  # the keys would match
    assert config.load(str(path)).state_dir == str(other)


@pytest.mark.parametrize("tamper", ["symlink", "garbage", "other key", "huge"])
def test_an_unusable_entry_is_a_miss(tmp_path, settled, tamper):
    path, state = write_config(tmp_path, "split_count = 4\n")
    config.load(str(path))
    entry = state / "cache" / "config.json"
    if tamper == "symlink":
        target = tmp_path / "elsewhere.json"
        target.write_bytes(entry.read_bytes().replace(b'"split_count": 4', b'"split_count": 9'))
        entry.unlink()
        entry.symlink_to(target)
    elif tamper == "garbage":
        entry.write_bytes(b"\x00not json")
    elif tamper == "other key":
        entry.write_bytes(entry.read_bytes().replace(b'"split_count": 4', b'"split_count": 9')
                          .replace(b'"key": [["', b'"key": [["x'))
    else:
        entry.write_bytes(b" " * (config_cache.LIMIT + 1))
    assert config.load(str(path)).split_count == 4


@pytest.mark.parametrize("text,hint", [
    (b'state_dir = "/srv/hami"\n', "/srv/hami"),
    (b'# c\nstate_dir="/srv//hami/" # c\nsplit_count = 2\n', "/srv/hami"),
    (b"split_count = 2\n", config_cache.DEFAULT_STATE_DIR),
    (b'[extra_env]\nstate_dir = "/srv/x"\n', config_cache.DEFAULT_STATE_DIR),
    (b"state_dir = '/srv/literal'\n", ""),
    (b'state_dir = "relative"\n', ""),
    (b'state_dir = "/a\\"b"\n', ""),
    (b'state_dir = "/srv/hami" trailing\n', ""),
])
def test_state_dir_hint(text, hint):
    assert config_cache.state_dir_hint(text) == hint
