"""runc's command line: global flags in every spelling, the bundle, the id."""
import os

import pytest

from hami_runtime.argv import parse


@pytest.mark.parametrize("argv,command,root,log,fmt,bundle,cid", [
    (["create", "c1"], "create", "/run/runc", None, "text", os.getcwd(), "c1"),
    (["--root", "/r", "--log", "/l", "--log-format", "json", "create", "--bundle", "/b", "c1"],
     "create", "/r", "/l", "json", "/b", "c1"),
    (["--root=/r", "--log=/l", "--log-format=json", "--debug", "--systemd-cgroup", "run", "-b", "/b",
      "-d", "c2"], "run", "/r", "/l", "json", "/b", "c2"),
    (["-root", "/r", "--rootless", "false", "create", "--bundle=/b", "--pid-file", "/p",
      "--console-socket", "/s", "c3"], "create", "/r", None, "text", "/b", "c3"),
    (["--debug=true", "run", "--detach", "--no-pivot", "--preserve-fds", "2", "c4", "--bundle",
      "/b"], "run", "/run/runc", None, "text", "/b", "c4"),
    (["delete", "--force", "c5"], "delete", "/run/runc", None, "text", os.getcwd(), "c5"),
    (["--root", "/r", "state", "c6"], "state", "/r", None, "text", os.getcwd(), "c6"),
    (["--version"], None, "/run/runc", None, "text", os.getcwd(), None),
    (["-h"], None, "/run/runc", None, "text", os.getcwd(), None),
    (["help"], "help", "/run/runc", None, "text", os.getcwd(), None),
])
def test_parse(argv, command, root, log, fmt, bundle, cid):
    inv = parse(argv)
    assert (inv.command, inv.root, inv.log_path, inv.log_format, inv.bundle, inv.container_id) == \
        (command, root, log, fmt, bundle, cid)
    assert inv.argv == argv


@pytest.mark.parametrize("argv,wanted", [
    ([], True), (["--help"], True), (["-h"], True), (["--help=1"], True), (["help"], True),
    (["h"], True), (["--debug", "help"], True), (["--help", "create"], True),
    (["--help=false"], False), (["help", "create"], False), (["create", "--help"], False),
    (["--version", "help"], False), (["list"], False), (["--version"], False),
])
def test_wants_help(argv, wanted):
    """What makes runc print its own help: ours goes before it."""
    from hami_runtime.version import wants_help
    assert wants_help(parse(argv)) == wanted
