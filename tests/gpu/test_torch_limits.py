"""libvgpu against the real NVIDIA driver through PyTorch (skipped without one). PyTorch is
make test's (build/torch/venv) where it is installed, else this interpreter's."""
import json
import os
import shutil
import subprocess
import sys

import pytest

from tests.conftest import BUILD, LIBVGPU, ROOT

TORCH_PYTHON = BUILD / "torch" / "venv" / "bin" / "python"
PROBE = [str(TORCH_PYTHON) if TORCH_PYTHON.exists() else sys.executable, str(ROOT / "bench/gpu/torch_probe.py")]


def _gpu_reason():
    if not shutil.which("nvidia-smi") or subprocess.run(["nvidia-smi", "-L"], capture_output=True).returncode:
        return "no NVIDIA driver on this machine"
    if subprocess.run([PROBE[0], "-c", "import torch"], capture_output=True).returncode:
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


def card_mib() -> int:
    out = subprocess.run(["nvidia-smi", "--query-gpu=memory.total", "--format=csv,noheader,nounits"],
                         capture_output=True, text=True).stdout
    return int(out.split()[0])


def test_seed003_the_largest_tensor_beside_a_resnet_is_all_the_slice_leaves():
    """tests/torch/test_seed003.py's measurement on the real driver (20000 MiB where the card has it)."""
    limit = min(20000, card_mib() - 2048)
    got = run_probe(["resnet-memory", "--batch", "64"], CUDA_DEVICE_MEMORY_LIMIT_0=f"{limit}m")
    assert got["total_mib"] == limit
    assert abs(got["outside_allocator_mib"] + got["model_mib"] + got["free_mib"] - limit) < 1
    assert got["free_mib"] - 2 <= got["largest_ok_mib"] <= got["free_mib"]
    assert got["first_refused_mib"] == got["largest_ok_mib"] + 1
    assert got["refusal"]["error"] == "OutOfMemoryError"


def test_seed003_a_step_at_30_percent_takes_twice_as_long_as_at_60():
    """Seed 003 with the ImageNet example's batch: 0.6 s against 0.3 s a step (bar: 2.0 +- 10 %)."""
    steps = {pct: run_probe(["resnet-train", "--batch", "256", "--warmup", "3", "--steps", "10"],
                            CUDA_DEVICE_SM_LIMIT=pct, GPU_CORE_UTILIZATION_POLICY="force")["median_step_s"]
             for pct in (30, 60)}
    assert 1.8 <= steps[30] / steps[60] <= 2.2, steps
