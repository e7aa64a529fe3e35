"""An LLM-serving shape through hami-runtime and runc on the simulated GPU
(bench/decode_probe.py, in containers as tests/torch/containers.py makes them): a small
decoder captured as CUDA graphs for four batch sizes, replayed in a loop, with a KV cache
sized from torch.cuda.mem_get_info as vLLM's gpu_memory_utilization does. In a
container with `gpumem` and `gpucores` the cache is sized to the slice, not the card,
capture works under the SM limit, and the replays are held to the share (exact
figures: bench/llm_decode.py)."""
import pytest

from tests.runtime.conftest import node, rootfs, sim_copy, spec_template  # noqa: F401
from tests.torch.containers import run, torch_bundle, use_card
from tests.conftest import ROOT

DECODE = ROOT / "bench" / "decode_probe.py"
CARD_MIB, SLICE_MIB = 16384, 3000
KERNEL_US = 100                 # a replay (~40 kernels) keeps the card busy ~4 ms
UTILIZATION = 0.9
ARGS = ("--dtype", "float16", "--seconds", 3, "--utilization", UTILIZATION)


def decode(node, env, name, annotations):  # noqa: F811
    bundle = torch_bundle(node, name, annotations, *ARGS, script=DECODE)
    return run(node, env, bundle, name)


@pytest.fixture
def card(node):  # noqa: F811
    return use_card(node, CARD_MIB, KERNEL_US)


def test_the_kv_cache_is_sized_to_the_slice_and_replays_are_held(node, card):  # noqa: F811
    held = decode(node, card, "held", {"hami.io/gpumem": str(SLICE_MIB), "hami.io/gpucores": "30",
                                       "hami.io/core-policy": "force"})
    free = decode(node, card, "free", {"hami.io/gpumem": str(SLICE_MIB)})
    for got in (held, free):
        assert got["total_mib"] == SLICE_MIB and got["graphs"] == 4
        # no kernel computes here: the replay-against-eager check says so rather than passing
        assert got["eager_check"]["status"].startswith("not applicable"), got
        # the cache takes what utilization x the slice leaves, to a block (vLLM's sizing)
        used_before = got["total_mib"] - got["free_before_cache_mib"]
        assert UTILIZATION * SLICE_MIB - used_before - 1 <= got["kv_cache_mib"] <= UTILIZATION * SLICE_MIB - used_before
    # the share is of GPU time; wide bounds: the machine may be loaded (exact figures in bench/)
    assert 15 <= held["busy_percent"] <= 45, held
    assert free["busy_percent"] >= 60, free
    assert held["replays_per_s"] < 0.6 * free["replays_per_s"], (held, free)
    assert node.containers() == []
