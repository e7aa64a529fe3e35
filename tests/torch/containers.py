"""PyTorch in containers made by hami-runtime and runc on the simulated GPU: the runtime
tests' busybox rootfs with the PyTorch environment, the host's Python and its shared
libraries bound in read-only; the runtime injects the driver and libvgpu as for any
container. Used by the seed-003 and decode tests and by bench/llm_decode.py."""
import json
import subprocess
import sys
from pathlib import Path

from tests.torch.conftest import CUDA_VERSION, PROBE, TORCH_PYTHON, TORCH_VENV

HOST_LIBS = "/usr/lib/x86_64-linux-gnu"   # libstdc++, libzstd, ... for Python, PyTorch and the driver


def read_only(path) -> dict:
    path = str(path)
    return {"destination": path, "type": "bind", "source": path, "options": ["rbind", "ro"]}


def use_card(node, card_mib: int, kernel_us: int) -> dict:
    """The node's simulated card, one of card_mib with a CUDA 13 driver, for the runtime and its
    containers; the env to run the runtime with."""
    node.simulate(devices=1, memory_mib=card_mib, cuda_version=CUDA_VERSION, kernel_us=kernel_us)
    return node.env


def torch_bundle(node, name, annotations, *args, script=PROBE, writable=()):
    """A bundle whose process runs `script` (bench/gpu/torch_probe.py unless named) with `args`."""
    bundle = node.bundle(name, annotations, env=["HOME=/tmp"], args=(str(TORCH_PYTHON), str(script), *map(str, args)))
    spec = json.loads((bundle / "config.json").read_text())
    spec["mounts"] += [read_only(p) for p in (TORCH_VENV, Path(sys.base_prefix), Path(script).parent, HOST_LIBS)]
    spec["mounts"] += [{"destination": str(p), "type": "bind", "source": str(p), "options": ["rbind", "rw"]}
                       for p in writable]
    (bundle / "config.json").write_text(json.dumps(spec))
    return bundle


def start(node, env, bundle, cid):
    """`hami-runtime run` of one container in the background; its output in files of its own."""
    out, err = (open(node.tmp / f"{cid}.{s}", "w+") for s in ("out", "err"))
    argv = node.runtime_argv("run", "--bundle", str(bundle), cid)
    return subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=err, env=env, cwd=node.tmp), out, err


def result(proc, out, err, timeout=600) -> dict:
    """The container's last line of output, as JSON, once it exited 0."""
    assert proc.wait(timeout=timeout) == 0, (out.seek(0) or out.read()[-3000:]) + (err.seek(0) or err.read()[-3000:])
    out.seek(0)
    return json.loads(out.read().strip().splitlines()[-1])


def run(node, env, bundle, cid) -> dict:
    return result(*start(node, env, bundle, cid))
