"""End to end: numba-cuda in a container started through hami-runtime with real runc
on the simulated GPU. The container asks for 2048 MiB; inside, numba sees a card of
2048 MiB and is refused past it. The image is the runtime tests' busybox rootfs: the
venv, the host's Python and the host's shared libraries are bound in read-only, and
the runtime injects the driver and libvgpu as it does for any container."""
import json
import sys
from pathlib import Path

# the runtime tests' node (config, runc root, bundles) and its fixtures
from tests.runtime.conftest import node, rootfs, sim_copy, spec_template  # noqa: F401

from tests.clients.conftest import PROGRAMS
from tests.conftest import ROOT

SLICE_MIB = 2048
OUT_OF_MEMORY = 2
HOST_LIBS = "/usr/lib/x86_64-linux-gnu"   # libm, libstdc++, libffi, ... for Python and the wheels


def read_only(path) -> dict:
    path = str(path)
    return {"destination": path, "type": "bind", "source": path, "options": ["rbind", "ro"]}


def test_numba_in_a_container_sees_and_keeps_to_its_slice(node):  # noqa: F811
    venv = ROOT / ".venv"
    python_home = Path(sys.base_prefix)
    bundle = node.bundle("numba", {"hami.io/gpumem": str(SLICE_MIB)},
                         env=["HOME=/tmp", "NUMBA_CACHE_DIR=/tmp/numba-cache"],
                         args=(str(venv / "bin" / "python"), str(PROGRAMS / "numba_client.py"), "basic"))
    spec = json.loads((bundle / "config.json").read_text())
    spec["mounts"] += [read_only(p) for p in (venv, python_home, PROGRAMS, HOST_LIBS)]
    (bundle / "config.json").write_text(json.dumps(spec))

    proc = node.runtime("run", "--bundle", str(bundle), "numba", timeout=300)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["total_mib"] == SLICE_MIB
    assert out["filled_mib"] <= out["free_mib"] < SLICE_MIB
    assert out["refusal"] == {"error": "CudaAPIError", "code": OUT_OF_MEMORY}
    assert out["launched"]
    assert node.containers() == []
