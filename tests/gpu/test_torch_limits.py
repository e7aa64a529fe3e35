"""libvgpu against the real NVIDIA driver through PyTorch (skipped without one)."""
import json
import os
import shutil
import subprocess
import sys

import pytest

from tests.conftest import LIBVGPU, ROOT

PROBE = [sys.executable, str(ROOT / "bench/gpu/torch_probe.py")]


def _gpu_reason():
    if not shutil.which("nvidia-smi") or subprocess.run(["nvidia-smi", "-L"], capture_output=True).returncode:
        return "no NVIDIA driver on this machine"
    try:
        import torch  # noqa: F401
    except ImportError:
        return "PyTorch is not installed"
    return None


pytestmark = pytest.mark.skipif(_gpu_reason() is not None, reason=str(_gpu_reason()))


def run_probe(args, **env):
    env = dict(os.environ, LD_PRELOAD=str(LIBVGPU), **{k: str(v) for k, v in env.items()})
    out = subprocess.run(PROBE + args, env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("alloc_conf", ["", "backend:cudaMallocAsync"])
def test_memory_limit_is_exact(alloc_conf):
    got = run_probe(["memory"], CUDA_DEVICE_MEMORY_LIMIT_0="4096m", PYTORCH_CUDA_ALLOC_CONF=alloc_conf)
    assert got["mem_get_info_total_mib"] == 4096
    assert got["first_refused_mib"] == got["largest_ok_mib"] + 1
    # what is left after the context, within 2 MiB (torch rounds large blocks to 2 MiB)
    assert abs(got["largest_ok_mib"] - got["mem_get_info_free_mib"]) <= 2


def test_sm_share_30_percent():
    full = run_probe(["sm", "--seconds", "5"])["mean"]
    share = run_probe(["sm", "--seconds", "5"], CUDA_DEVICE_SM_LIMIT=30,
                      GPU_CORE_UTILIZATION_POLICY="force")["mean"]  # alone, `default` is not held
    assert abs(100 * share / full - 30) <= 3


def test_a_full_card_spills_to_managed_memory_within_the_limit():
    card = int(subprocess.run(["nvidia-smi", "--query-gpu=memory.total", "--format=csv,noheader,nounits"],
                              capture_output=True, text=True).stdout.split()[0])
    got = run_probe(["spill", "--mib", "1024", "--passes", "3", "--fill"], CUDA_OVERSUBSCRIBE="true",
                    CUDA_DEVICE_MEMORY_LIMIT_0=f"{2 * card}m")
    assert got["managed"] and got["filler_gib"] >= 1 and got["steady_gbs"] > 0
