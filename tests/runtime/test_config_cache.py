"""The parsed config kept in the state dir and in a persistent dir: used only
for the very file it was parsed from, only in that file's own state dir, only
while this node's cache key vouches for it, and never a way around a refusal."""
import hashlib
import json
import os
import shutil
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hami_runtime import config, config_cache
from hami_runtime.errors import HamiError

from .node import LAUNCHER, RUNC

# the node's own, before the fixture below points these tests elsewhere
NODE_PERSISTENT_DIR = config_cache.PERSISTENT_DIR


@pytest.fixture(autouse=True)
def persistent(tmp_path, monkeypatch):
    """The persistent dir and the key dir of these tests (never the node's
    /var/cache/hami and /var/lib/hami)."""
    directory = tmp_path / "var-cache-hami"
    monkeypatch.setattr(config_cache, "PERSISTENT_DIR", str(directory))
    monkeypatch.setattr(config_cache, "KEY_DIR", str(tmp_path / "var-lib-hami"))
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
    """From now on, importing the TOML parser or the model fails: a load that
    still succeeds took its values from the cache."""
    monkeypatch.setitem(sys.modules, "tomllib", None)
    monkeypatch.setitem(sys.modules, "hami_runtime.config_model", None)


def signed(body, secret=None, version=config_cache.VERSION):
    """An entry for body with a right MAC: what only the key's holder can make."""
    canonical = config_cache._canonical(body)
    mac = config_cache._mac(secret or config_cache.cache_key(), canonical)
    return b'{"version":%d,"mac":"%s","body":%s}' % (version, mac.encode(), canonical)


def body_of(entry):
    return json.loads(entry.read_bytes())["body"]


def test_second_load_reads_no_toml(tmp_path, monkeypatch, settled):
    path, state = write_config(tmp_path, 'split_count = 4\n[extra_env]\nA = "b"\n')
    first = config.load(str(path))
    assert (state / "cache" / "config.json").is_file()
    no_toml(monkeypatch)
    assert config.load(str(path)) == first
    assert first.split_count == 4 and first.extra_env == {"A": "b"}


def test_the_create_servers_config_is_taken_again_while_its_bytes_stay(tmp_path, monkeypatch, settled):
    """What the create server loaded (remember=True) its children take again without
    the cache or the model, as long as the file's bytes are the same; an edit goes
    the usual way."""
    monkeypatch.setattr(config, "_remembered", None)  # this test's own, gone after it
    path, _ = write_config(tmp_path, 'split_count = 4\n[extra_env]\nA = "b"\n')
    served = config.load(str(path), remember=True)
    looked_up = []
    real_lookup = config_cache.lookup
    monkeypatch.setattr(config_cache, "lookup", lambda *a: looked_up.append(a) or real_lookup(*a))
    no_toml(monkeypatch)
    again = config.load(str(path))
    assert again == served and again is not served and again.path == str(path) and not looked_up
    path.write_text(path.read_text().replace("split_count = 4", "split_count = 2"))
    with pytest.raises(ImportError):  # the edit is validated again: the model cannot be imported here
        config.load(str(path))
    assert looked_up


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
    assert (tmp_path / "absent").stat().st_mode & 0o777 == 0o700  # host-only, as the allocator keeps it


def test_nothing_is_kept_in_a_state_dir_others_could_replace(tmp_path, settled):
    """The cache is written only where the allocator would work (path_trust)."""
    tmp_path.chmod(0o777)
    path = tmp_path / "hami.toml"
    path.write_text(f'state_dir = "{tmp_path / "absent"}"\n')
    config.load(str(path))
    assert not (tmp_path / "absent").exists()


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


@pytest.mark.parametrize("tamper", ["symlink", "garbage", "other key", "huge", "deep"])
def test_an_unusable_entry_is_a_miss(tmp_path, settled, tamper):
    path, state = write_config(tmp_path, "split_count = 4\n")
    config.load(str(path))
    entry = state / "cache" / "config.json"
    if tamper == "symlink":
        target = tmp_path / "elsewhere.json"
        target.write_bytes(entry.read_bytes().replace(b'"split_count":4', b'"split_count":9'))
        entry.unlink()
        entry.symlink_to(target)
    elif tamper == "garbage":
        entry.write_bytes(b"\x00not json")
    elif tamper == "other key":
        entry.write_bytes(entry.read_bytes().replace(b'"split_count":4', b'"split_count":9')
                          .replace(b'"key":[["', b'"key":[["x'))
    elif tamper == "deep":
        entry.write_bytes(b'{"version":3,"mac":"","body":' + b"[" * 100_000 + b"]" * 100_000 + b"}")
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
    (None, 9),  # made with the node's key (with another value): used
    ("other", 4),  # made with the node's key, naming another state dir: not used
])
def test_a_persistent_entry_is_used_only_for_its_state_dir(tmp_path, persistent, settled,
                                                           entry_state_dir, split_count):
    path, state = write_config(tmp_path, "split_count = 4\n")
    config.load(str(path))
    [entry] = entries(persistent)
    body = body_of(entry)
    body["values"]["split_count"] = 9
    if entry_state_dir:
        body["state_dir"] = body["values"]["state_dir"] = str(tmp_path / entry_state_dir)
    entry.write_bytes(signed(body))
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
    body = body_of(entry)
    body["values"]["split_count"] = 9
    entry.write_bytes(signed(body))  # one the key vouches for: the dir alone refuses it
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
    old = []
    for age in range(1, keep + 7):  # old[0] the newest
        config_file = tmp_path / f"node-{age}.toml"
        config_file.write_text("")
        old.append(kept_entry(config_file, 1_000_000 - age))
    path, _ = write_config(tmp_path)
    config.load(str(path))
    kept = set(entries(persistent))
    assert len(kept) == keep and set(old[:keep - 1]) < kept and not kept & set(old[keep - 1:])


def kept_entry(config_file, mtime, version=config_cache.VERSION, secret=None, file_key=None,
               name=None):
    """A persistent entry for config_file, as a store would have made it (with
    this node's key, unless another is given), last written at mtime."""
    body = {"config": str(config_file), "sha256": "0" * 64, "state_dir": "/srv/hami",
            "key": [file_key or [str(config_file), 1, 2, 3, 4, 5], ["model"]],
            "values": {"state_dir": "/srv/hami"}}
    entry = Path(name or config_cache.persistent_path(str(config_file)))
    entry.write_bytes(signed(body, secret, version))
    os.utime(entry, (mtime, mtime))
    return entry


def test_pruning_removes_stale_and_foreign_entries(tmp_path, persistent, settled):
    """Each store prunes the persistent dir: entries of another version, with
    a MAC this key did not make (another node's, or a key since removed), at
    another path's name, for a config file that is gone, and temp files a
    killed writer left; the defaults' entry (no file, by design) stays, and so
    do files that are not entries."""
    persistent.mkdir()

    def existing(name):
        config_file = tmp_path / name
        config_file.write_text("")
        return config_file
    good = kept_entry(existing("good.toml"), 1_000_000)
    defaults = kept_entry(tmp_path / "absent.toml", 1_000_000,
                          file_key=[config_cache.NO_CONFIG_FILE, str(tmp_path / "absent.toml")])
    removed = [
        kept_entry(tmp_path / "gone.toml", 2_000_000),
        kept_entry(existing("old.toml"), 2_000_000, version=config_cache.VERSION - 1),
        kept_entry(existing("foreign.toml"), 2_000_000, secret=os.urandom(32)),
        kept_entry(existing("misplaced.toml"), 2_000_000,
                   name=persistent / ("config-" + "0" * 16 + ".json")),
    ]
    (persistent / ("config-" + "f" * 16 + ".json")).write_text("{}")
    removed.append(persistent / ("config-" + "f" * 16 + ".json"))
    stale_temp, fresh_temp = persistent / ".hami-1-dead", persistent / ".hami-2-writing"
    for temp in (stale_temp, fresh_temp):
        temp.write_text("partial")
    os.utime(stale_temp, (1_000_000, 1_000_000))
    (persistent / "notes.txt").write_text("not an entry")
    path, state = write_config(tmp_path)
    (state / "cache").mkdir()
    state_temp = state / "cache" / ".hami-3-dead"
    state_temp.write_text("partial")
    os.utime(state_temp, (1_000_000, 1_000_000))
    config.load(str(path))
    assert set(entries(persistent)) == {good, defaults, Path(config_cache.persistent_path(str(path)))}
    assert not any(p.exists() for p in removed + [stale_temp, state_temp])
    assert fresh_temp.exists() and (persistent / "notes.txt").exists()


# -- entries an attacker wrote: refused, logged, and the config file read instead

def poisonable(tmp_path):
    """(config path, state dir, log, the true config, a program that leaves a
    marker if run): a config with a log, validated and kept in both places."""
    log = tmp_path / "hami.log"
    path, state = write_config(tmp_path, f'log_file = "{log}"\nsplit_count = 4\n')
    true = config.load(str(path))
    evil = tmp_path / "evil-runc"
    evil.write_text(f"#!/bin/sh\ntouch {tmp_path / 'marker'}\n")
    evil.chmod(0o755)
    return path, state, log, true, str(evil)


def logged(log, what="config cache: refused"):
    return [line for line in log.read_text().splitlines() if what in line] if log.exists() else []


def changed(value):
    """A value of the same kind that differs."""
    if isinstance(value, bool):
        return not value
    if isinstance(value, (int, float)):
        return value + 1
    if isinstance(value, str):
        return value + "x"
    if isinstance(value, list):
        return value + ["/tmp/evil"]
    if isinstance(value, dict):
        return {**value, "EVIL": "1"}
    return "evil"


PLACES = ["persistent", "state dir"]


def entry_in(place, state, persistent):
    return state / "cache" / "config.json" if place == "state dir" else entries(persistent)[0]


def load_after(place, state, path):
    """A load as the next create does it: after a reboot (an empty state dir)
    where the persistent entry was the one edited."""
    if place == "persistent":
        shutil.rmtree(state, ignore_errors=True)
    return config.load(str(path))


def edited(data, field, evil):
    entry = json.loads(data)
    where, _, name = field.rpartition(".")
    holder = entry
    for part in filter(None, where.split(".")):
        holder = holder[part]
    holder[name] = [evil] if name == "runtime" else \
        "0" * 64 if name == "mac" else changed(holder[name])
    return json.dumps(entry).encode()


FIELDS = ["version", "mac", "body.config", "body.sha256", "body.key", "body.state_dir",
          "body.values.runtime"]


@pytest.mark.parametrize("place", PLACES)
@pytest.mark.parametrize("field", FIELDS + ["every value"])
def test_an_edited_entry_is_refused(tmp_path, persistent, settled, place, field):
    """Whatever field of either entry is edited (the runtime path above all),
    the next load uses the true config, and the log says which entry was
    refused and why."""
    path, state, log, true, evil = poisonable(tmp_path)
    entry = entry_in(place, state, persistent)
    original = entry.read_bytes()
    fields = [f"body.values.{name}" for name in body_of(entry)["values"]] \
        if field == "every value" else [field]
    for number, name in enumerate(fields, start=1):
        entry.write_bytes(edited(original, name, evil))
        cfg = load_after(place, state, path)
        assert cfg == true and config.real_runtime(cfg) != evil, name
        lines = logged(log)
        assert len(lines) == number and f"refused {entry}: " in lines[-1], name
    assert not (tmp_path / "marker").exists()
    assert entry.read_bytes() == original  # the true values kept in its stead


@pytest.mark.parametrize("place", PLACES)
@pytest.mark.parametrize("forgery", ["a key of its own", "no MAC", "the old format"])
def test_a_whole_new_entry_is_refused(tmp_path, persistent, settled, place, forgery):
    path, state, log, true, evil = poisonable(tmp_path)
    entry = entry_in(place, state, persistent)
    body = body_of(entry)
    body["values"]["runtime"] = [evil]
    if forgery == "a key of its own":
        entry.write_bytes(signed(body, secret=os.urandom(config_cache.KEY_SIZE)))
    elif forgery == "no MAC":
        entry.write_text(json.dumps({"version": config_cache.VERSION, "body": body}))
    else:  # what version 2 kept, which no key vouched for
        entry.write_text(json.dumps({"version": 2, "key": body["key"],
                                     "state_dir": body["state_dir"], "values": body["values"]}))
    assert load_after(place, state, path) == true
    [line] = logged(log)
    assert f"refused {entry}: " in line


def test_another_nodes_entry_is_refused(tmp_path, monkeypatch, persistent, settled):
    """The same config file (bytes, inode and all) validated on another node:
    its entry, copied here, is not one this node's key made."""
    path, state, log, true, evil = poisonable(tmp_path)
    [entry] = entries(persistent)
    ours = entry.read_bytes()
    monkeypatch.setattr(config_cache, "KEY_DIR", str(tmp_path / "other-node-key"))
    shutil.rmtree(state)
    config.load(str(path))
    theirs = entry.read_bytes()
    assert theirs != ours
    body = body_of(entry)
    body["values"]["runtime"] = [evil]
    theirs_poisoned = signed(body)  # the other node's operator could make this one
    monkeypatch.setattr(config_cache, "KEY_DIR", str(tmp_path / "var-lib-hami"))
    before = len(logged(log))  # the other node refused ours the same way
    for copied in (theirs, theirs_poisoned):
        entry.write_bytes(copied)
        assert load_after("persistent", state, path) == true
    assert len(logged(log, "does not match this node's cache key")) == before + 2
    assert entry.read_bytes() == ours


def key_dir_link(key_dir, attacker):
    shutil.rmtree(key_dir)
    key_dir.symlink_to(attacker)


def key_file_link(key_dir, attacker):
    (key_dir / config_cache.KEY_FILE).unlink()
    (key_dir / config_cache.KEY_FILE).symlink_to(attacker / config_cache.KEY_FILE)


def key_file_readable(key_dir, attacker):
    (key_dir / config_cache.KEY_FILE).write_bytes((attacker / config_cache.KEY_FILE).read_bytes())
    (key_dir / config_cache.KEY_FILE).chmod(0o644)


def key_dir_writable(key_dir, attacker):
    key_dir.chmod(0o777)
    (key_dir / config_cache.KEY_FILE).unlink()
    shutil.copy(attacker / config_cache.KEY_FILE, key_dir / config_cache.KEY_FILE)


def key_file_short(key_dir, attacker):
    (key_dir / config_cache.KEY_FILE).write_bytes(b"k" * 16)


def key_file_others(key_dir, attacker):
    (key_dir / config_cache.KEY_FILE).write_bytes((attacker / config_cache.KEY_FILE).read_bytes())
    os.chown(key_dir / config_cache.KEY_FILE, 65534, -1)


@pytest.mark.parametrize("unsafe,why", [
    (key_dir_link, "is not a directory (a symbolic link?)"),
    (key_file_link, "is a symbolic link"),
    (key_file_readable, "has mode 0644, not 0600"),
    (key_dir_writable, "is writable by group or others"),
    (key_file_short, "holds 16 bytes, not 32"),
    pytest.param(key_file_others, "is owned by uid 65534",
                 marks=pytest.mark.skipif(os.geteuid() != 0, reason="chown needs root")),
], ids=["key dir a link", "key file a link", "key file readable", "key dir writable",
        "key file short", "key file another user's"])
def test_an_unsafe_key_is_not_used(tmp_path, persistent, settled, unsafe, why):
    """A key that someone else could have made or read vouches for nothing:
    the entries (one signed with the attacker's key) are neither used nor
    written, each load validates the file and says why in the log."""
    path, state, log, true, evil = poisonable(tmp_path)
    attacker = tmp_path / "attacker"
    attacker.mkdir(mode=0o700)
    (attacker / config_cache.KEY_FILE).write_bytes(b"k" * config_cache.KEY_SIZE)
    (attacker / config_cache.KEY_FILE).chmod(0o600)
    [entry] = entries(persistent)
    body = body_of(entry)
    body["values"]["runtime"] = [evil]
    entry.write_bytes(signed(body, secret=b"k" * config_cache.KEY_SIZE))
    poisoned = entry.read_bytes()
    unsafe(Path(config_cache.KEY_DIR), attacker)
    for _ in range(2):
        assert load_after("persistent", state, path) == true
    lines = logged(log, "config cache: not used: ")
    assert len(lines) == 2 and why in lines[0], lines
    assert entry.read_bytes() == poisoned and not (state / "cache" / "config.json").exists()


def test_the_key_is_made_once_for_root_only(tmp_path, settled):
    key_dir = Path(config_cache.KEY_DIR)
    assert not key_dir.exists()
    path, _ = write_config(tmp_path)
    config.load(str(path))
    key = key_dir / config_cache.KEY_FILE
    assert stat.S_IMODE(key_dir.stat().st_mode) == 0o700
    assert stat.S_IMODE(key.stat().st_mode) == 0o600 and key.stat().st_size == config_cache.KEY_SIZE
    made = key.read_bytes()
    dir_fd = os.open(key_dir, os.O_RDONLY | os.O_DIRECTORY)
    try:
        config_cache._make_key(dir_fd)  # a second maker, racing the first: it keeps the first's
    finally:
        os.close(dir_fd)
    assert key.read_bytes() == made and os.listdir(key_dir) == [config_cache.KEY_FILE]


def test_a_good_entry_still_hits_with_nothing_logged(tmp_path, monkeypatch, persistent, settled):
    path, state, log, true, evil = poisonable(tmp_path)
    shutil.rmtree(state)
    no_toml(monkeypatch)
    assert config.load(str(path)) == true
    assert config.load(str(path)) == true  # from the state dir's copy
    assert not log.exists()


def settle(config_file):
    """Waits until config_file is old enough for the config cache of another process."""
    time.sleep(max(0.0, config_cache.SETTLED_NS / 1e9 - (time.time() - config_file.stat().st_ctime))
               + 0.2)


@pytest.fixture
def own_var_cache():
    """A mount namespace of the test's own whose /var/cache is an empty tmpfs: the
    node's persistent cache dir there, which another suite on this host (its stores
    prune entries whose MAC is wrong) cannot touch. (a command prefix that runs in it,
    the path of its /var/cache from here)"""
    holder = subprocess.Popen(["unshare", "-m", "--propagation", "private", "sh", "-c",
                               "mount -t tmpfs -o mode=0755 hami-test /var/cache && echo ready && exec sleep 600"],
                              stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    try:
        assert holder.stdout.readline() == b"ready\n"
        yield ["nsenter", "-t", str(holder.pid), "-m"], Path(f"/proc/{holder.pid}/root/var/cache")
    finally:
        holder.kill()
        holder.wait()


@pytest.mark.skipif(not LAUNCHER.exists(), reason="make build builds the launcher")
@pytest.mark.parametrize("place", PLACES)
def test_a_gpu_create_never_runs_a_poisoned_runtime(node, place, own_var_cache):
    """Through the launcher with real runc and the node's own cache dirs: the
    entry's `runtime` set to a program that leaves a marker, and (persistent)
    a reboot-like empty state dir; the GPU create runs runc, never that
    program, and the runtime's log says the entry was refused."""
    inside, var_cache = own_var_cache
    log, marker, evil = node.tmp / "hami.log", node.tmp / "marker", node.tmp / "evil-runc"
    evil.write_text(f'#!/bin/sh\ntouch {marker}\nexec {RUNC} "$@"\n')
    evil.chmod(0o755)
    node.write_config(log_file=str(log), create_server_idle_s=0)
    settle(node.config)
    subprocess.run(inside + [sys.executable, "-c", "from hami_runtime import config; config.load()"],
                   env=node.env, check=True, timeout=60)  # validated and kept, as a create would
    name = os.path.basename(config_cache.persistent_path(str(node.config)))
    assert os.path.dirname(NODE_PERSISTENT_DIR) == "/var/cache"
    entry, logged = (node.state_dir / "cache" / "config.json",) * 2 if place == "state dir" \
        else (var_cache / os.path.basename(NODE_PERSISTENT_DIR) / name, Path(NODE_PERSISTENT_DIR) / name)
    poisoned = json.loads(entry.read_bytes())
    poisoned["body"]["values"]["runtime"] = [str(evil)]
    entry.write_text(json.dumps(poisoned))
    if place == "persistent":
        shutil.rmtree(node.state_dir)
    bundle = node.bundle("gpu", {"hami.io/gpumem": "100"}, args=("true",))
    try:
        proc = node.create("gpu", bundle, cmd=inside + [str(LAUNCHER)])
        assert proc.returncode == 0, proc.stderr
    finally:
        node.runtime("delete", "-f", "gpu", cmd=inside + [str(LAUNCHER)])
    assert not marker.exists()
    assert f"config cache: refused {logged}: " in log.read_text()
    assert json.loads(entry.read_bytes())["body"]["values"]["runtime"] != [str(evil)]


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
