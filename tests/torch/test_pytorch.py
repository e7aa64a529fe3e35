"""PyTorch (CUDA 13 build) on the simulated driver: it sees the card and trains a
ResNet-18, bare and under libvgpu; under libvgpu a slice is a smaller GPU to it, with
each of the caching allocator's back-ends: the slice is what total_memory and
mem_get_info show, tensors allocate until torch.cuda.OutOfMemoryError, and empty_cache
gives the memory back. Half precision (fp16, bf16) matmuls run, eagerly and captured in a CUDA
graph: cuBLASLt picks their kernels from the card's layout."""
import json
import subprocess
import textwrap

import pytest

from tests.torch.conftest import TORCH_PYTHON, TorchMachine

CARD_MIB = 8192
SLICE_MIB = 2048
BACKENDS = {  # PYTORCH_CUDA_ALLOC_CONF: what each back-end allocates with
    "native": "",                                       # cudaMalloc: cuMemAlloc
    "expandable": "expandable_segments:True",           # cuMemCreate + cuMemMap (VMM)
    "cudaMallocAsync": "backend:cudaMallocAsync",       # a stream-ordered pool
}


@pytest.mark.parametrize("limit_mib", [0, SLICE_MIB], ids=["bare", "libvgpu"])
def test_pytorch_sees_its_card_and_trains_a_resnet(torch_env, tmp_path, limit_mib):
    machine = TorchMachine(tmp_path, CARD_MIB, limit_mib)
    info = machine.run("info")
    assert info["count"] == 1 and info["capability"] == [9, 0] and info["cuda"].startswith("13.")
    assert info["total_memory_mib"] == info["mem_get_info_total_mib"] == (limit_mib or CARD_MIB)
    train = machine.run("resnet-train", "--batch", 4, "--warmup", 1, "--steps", 2)
    assert len(train["step_s"]) == 2 and all(t > 0 for t in train["step_s"])


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_slice_is_a_smaller_gpu_to_every_allocator_backend(torch_env, tmp_path, backend):
    machine = TorchMachine(tmp_path, CARD_MIB, SLICE_MIB, env={"PYTORCH_CUDA_ALLOC_CONF": BACKENDS[backend]})
    info = machine.run("info")
    assert info["total_memory_mib"] == info["mem_get_info_total_mib"] == SLICE_MIB
    assert info["allocator"] == ("cudaMallocAsync" if backend == "cudaMallocAsync" else "native")
    rounds = machine.run("fill", "--block-mib", 256)["rounds"]
    for r in rounds:  # the second round is what empty_cache gave back
        assert r["refusal"]["error"] == "OutOfMemoryError"
        assert SLICE_MIB - 768 <= r["filled_mib"] <= SLICE_MIB - 256
        assert r["free_when_full_mib"] < 256
        assert r["free_after_empty_cache_mib"] >= r["filled_mib"]
    assert rounds[0]["filled_mib"] == rounds[1]["filled_mib"]
    if backend != "cudaMallocAsync":  # that back-end words its refusal without the capacity
        assert "GPU 0 has a total capacity of 2.00 GiB" in rounds[0]["refusal"]["message"]


HALF_PRECISION = """
import json, time
import torch

out = {}
for name in ("float16", "bfloat16"):
    a = torch.randn(256, 256, device="cuda", dtype=getattr(torch, name))
    c = a @ a
    b = torch.bmm(a.expand(4, 256, 256), a.expand(4, 256, 256))
    lin = torch.nn.functional.linear(a, a, a[0])
    torch.cuda.synchronize()
    out[name] = [str(c.dtype), list(c.shape), list(b.shape), list(lin.shape)]

a = torch.randn(256, 256, device="cuda", dtype=torch.bfloat16)
side = torch.cuda.Stream()
side.wait_stream(torch.cuda.current_stream())
with torch.cuda.stream(side):                  # warm-up, as PyTorch asks before a capture
    for _ in range(3):
        c = a @ a
torch.cuda.current_stream().wait_stream(side)
g = torch.cuda.CUDAGraph()
with torch.cuda.graph(g):
    capturing = torch.cuda.is_current_stream_capturing()
    c = a @ a
torch.cuda.synchronize()
t = time.monotonic()
for _ in range(10):
    g.replay()
torch.cuda.synchronize()
out["captured"] = [capturing, str(c.dtype), list(c.shape), time.monotonic() - t]
print(json.dumps(out), flush=True)
"""


@pytest.mark.parametrize("limit_mib", [0, SLICE_MIB], ids=["bare", "libvgpu"])
def test_half_precision_matmuls_run_eagerly_and_captured(torch_env, tmp_path, limit_mib):
    machine = TorchMachine(tmp_path, CARD_MIB, limit_mib, kernel_us=2000)
    proc = subprocess.run([str(TORCH_PYTHON), "-c", textwrap.dedent(HALF_PRECISION)], env=machine.env,
                          capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-4000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["float16"] == ["torch.float16", [256, 256], [4, 256, 256], [256, 256]]
    assert out["bfloat16"] == ["torch.bfloat16", [256, 256], [4, 256, 256], [256, 256]]
    capturing, dtype, shape, replay_s = out["captured"]
    assert [capturing, dtype, shape] == [True, "torch.bfloat16", [256, 256]]
    assert replay_s >= 10 * 0.002               # each replay runs the captured matmul's kernel(s)
