"""What a GPU create costs once the caches hold: the discovery cache answers
whatever a shell sets per command (an engine started from a shell, as podman
is, runs the runtime with its caller's working directory in $PWD), and still
discovers again where the loader's environment changes."""
import pytest

from .test_discovery_cache import probe


@pytest.mark.parametrize("env,nvml", [
    ({"PWD": "/elsewhere", "OLDPWD": "/tmp"}, False),
    ({"_": "/usr/bin/podman", "SHLVL": "3"}, False),
    ({"LD_LIBRARY_PATH": "/opt/other"}, True),
    ({"PWD_EXTRA": "x"}, True),
], ids=["working-dir", "command-path", "loader-path", "other-variable"])
def test_shell_noise_keeps_the_discovery_cache(node, env, nvml):
    first = probe(node, PWD="/", _="/usr/bin/engine", SHLVL="1")
    assert first["nvml"]
    again = probe(node, **{"PWD": "/", "_": "/usr/bin/engine", "SHLVL": "1", **env})
    assert again["nvml"] == nvml and again["gpus"] == first["gpus"]
