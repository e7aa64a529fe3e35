"""The parsed config kept in the state dir and in a persistent dir: used only
for the very file it was parsed from, only in that file's own state dir, and
never a way around a refusal."""
import hashlib
import json
import os
import shutil
import sys

import pytest

from hami_runtime import config, config_cache
from hami_runtime.errors import HamiError


@pytest.fixture(autouse=True)
def persistent(tmp_path, monkeypatch):
    """The persistent dir of these tests (never the node's /var/cache/hami)."""
    directory = tmp_path / "var-cache-hami"
    monkeypatch.setattr(config_cache, "PERSISTENT_DIR", str(directory))
    return directory


def entries(directory):
    return sorted(directory.glob("config-*.json"))


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


def test_a_file_written_just_now_is_not_kept(tmp_path, persistent):
    path, state = write_config(tmp_path)
    config.load(str(path))
    assert not (state / "cache").exists() and not entries(persistent)


def test_the_state_dir_is_made_for_the_cache(tmp_path, settled):
    """Before the first GPU container makes it (after a boot: /run is a tmpfs), so
    that creates without a request need not validate the config each time."""
    path = tmp_path / "hami.toml"
    path.write_text(f'state_dir = "{tmp_path / "absent"}"\n')
    config.load(str(path))
    assert sorted(p.name for p in (tmp_path / "absent").iterdir()) == ["cache"]
    assert (tmp_path / "absent").stat().st_mode & 0o777 == 0o755


@pytest.mark.parametrize("body", ["split_count = 0\n", "policy = \"fastest\"\n", "nope = 1\n"])
def test_refusals_are_never_kept(tmp_path, persistent, settled, body):
    path, state = write_config(tmp_path, body)
    for _ in range(2):
        with pytest.raises(HamiError):
            config.load(str(path))
    assert not (state / "cache" / "config.json").exists() and not entries(persistent)


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


def test_after_a_reboot_the_persistent_copy_is_used(tmp_path, monkeypatch, settled):
    path, state = write_config(tmp_path, 'split_count = 4\n[extra_env]\nA = "b"\n')
    first = config.load(str(path))
    shutil.rmtree(state)  # the state dir is a tmpfs: gone after a boot
    no_toml(monkeypatch)
    assert config.load(str(path)) == first
    assert (state / "cache" / "config.json").is_file()  # later creates find it there


def test_the_defaults_are_kept_for_the_path_looked_for(tmp_path, monkeypatch, persistent):
    monkeypatch.delenv("HAMI_CONFIG", raising=False)
    monkeypatch.setattr(config, "DEFAULT_PATH", str(tmp_path / "absent.toml"))
    config.load()
    name = hashlib.sha256(config.DEFAULT_PATH.encode()).hexdigest()[:16]
    assert entries(persistent) == [persistent / f"config-{name}.json"]


@pytest.mark.parametrize("entry_state_dir,split_count", [
    (None, 9),  # the entry as kept (with another value): used
    ("other", 4),  # naming another state dir: not used
])
def test_a_persistent_entry_is_used_only_for_its_state_dir(tmp_path, persistent, settled,
                                                           entry_state_dir, split_count):
    path, state = write_config(tmp_path, "split_count = 4\n")
    config.load(str(path))
    [entry] = entries(persistent)
    kept = json.loads(entry.read_bytes())
    kept["values"]["split_count"] = 9
    if entry_state_dir:
        kept["state_dir"] = str(tmp_path / entry_state_dir)
    entry.write_text(json.dumps(kept))
    shutil.rmtree(state)
    assert config.load(str(path)).split_count == split_count


def make_symlink(directory):
    os.rename(directory, f"{directory}.real")
    directory.symlink_to(f"{directory}.real")


@pytest.mark.parametrize("unsafe", [
    make_symlink,
    lambda directory: directory.chmod(0o775),  # group-writable
    lambda directory: directory.chmod(0o757),  # other-writable
    pytest.param(lambda directory: os.chown(directory, 65534, -1),  # another user's
                 marks=pytest.mark.skipif(os.geteuid() != 0, reason="chown needs root")),
], ids=["symlink", "group-writable", "other-writable", "other owner"])
def test_an_unsafe_persistent_dir_is_neither_read_nor_written(tmp_path, persistent, settled,
                                                              unsafe):
    path, state = write_config(tmp_path, "split_count = 4\n")
    config.load(str(path))
    [entry] = entries(persistent)
    entry.write_bytes(entry.read_bytes().replace(b'"split_count": 4', b'"split_count": 9'))
    tampered = entry.read_bytes()
    shutil.rmtree(state)
    unsafe(persistent)
    assert config.load(str(path)).split_count == 4
    assert [p.read_bytes() for p in entries(persistent.resolve())] == [tampered]


def test_an_unwritable_persistent_dir_is_no_error(tmp_path, monkeypatch, settled):
    (tmp_path / "a file").write_text("")
    monkeypatch.setattr(config_cache, "PERSISTENT_DIR", str(tmp_path / "a file" / "hami"))
    path, state = write_config(tmp_path)
    assert config.load(str(path)).split_count == 4
    assert (state / "cache" / "config.json").is_file()


@pytest.mark.parametrize("rebooted", [False, True])
def test_an_edited_file_misses_in_both_places(tmp_path, monkeypatch, persistent, settled,
                                              rebooted):
    path, state = write_config(tmp_path, "split_count = 4\n")
    config.load(str(path))
    path.write_text(path.read_text().replace("split_count = 4", "split_count = 5"))  # same size
    if rebooted:
        shutil.rmtree(state)
    assert config.load(str(path)).split_count == 5
    shutil.rmtree(state)
    no_toml(monkeypatch)  # and the edited file's values are kept in its stead
    assert config.load(str(path)).split_count == 5


def test_the_newest_persistent_entries_are_kept(tmp_path, persistent, settled):
    keep = config_cache.PERSISTENT_KEEP
    persistent.mkdir()
    old = [persistent / f"config-{n:016x}.json" for n in range(keep + 6)]
    for age, entry in enumerate(old, start=1):
        entry.write_text("{}")
        os.utime(entry, (1_000_000 - age, 1_000_000 - age))  # old[0] the newest
    path, _ = write_config(tmp_path)
    config.load(str(path))
    kept = set(entries(persistent))
    assert len(kept) == keep and set(old[:keep - 1]) < kept and not kept & set(old[keep - 1:])


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
