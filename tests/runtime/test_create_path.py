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


def test_a_library_listed_twice_is_mounted_once():
    """A merged /usr's ld cache lists each driver library under /lib and /usr/lib:
    one mount each, where the cache lists it first; another name of the same file
    (libcuda.so beside libcuda.so.1) keeps its own."""
    from hami_runtime.lifecycle.commands.create import distinct_files
    from hami_runtime.node.discovery import DriverFile
    real = "/usr/lib/x86_64-linux-gnu/libcuda.so.575.57.08"
    files = [DriverFile(real, "/lib/x86_64-linux-gnu/libcuda.so.1", "compute"),
             DriverFile(real, "/usr/lib/x86_64-linux-gnu/libcuda.so.1", "compute"),
             DriverFile(real, "/lib/x86_64-linux-gnu/libcuda.so", "compute"),
             DriverFile(real, "/usr/lib/x86_64-linux-gnu/libcuda.so", "compute"),
             DriverFile("/usr/bin/nvidia-smi", "/usr/bin/nvidia-smi", "utility")]
    assert distinct_files(files) == [files[0], files[2], files[4]]
