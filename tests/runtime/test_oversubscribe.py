"""Memory oversubscription: with memory_scaling > 1 a grant may pass the card, and the
limits tell libvgpu to spill what the card cannot hold to managed memory, unless the
container opts out (hami.io/oversubscribe: "false"). The simulated cards hold 16384 MiB."""
import pytest

from hami_runtime.lifecycle.node_state import container_files, state_layout, store

from .node import CUDA_ALLOC

CARD_MIB = 16384


def grant(node, cid, annotations, scaling):
    node.write_config(memory_scaling=scaling)
    proc = node.create(cid, node.bundle(cid, annotations))
    assert proc.returncode == 0, proc.stderr
    name = state_layout.alloc_name(str(node.runc_root), cid)
    with container_files.open_limits(str(node.state_dir), name) as limits:
        devices = limits.devices
    return devices, node.allocations()[cid]


@pytest.mark.parametrize("scaling, annotations, spill, recorded", [
    (2, {"hami.io/gpumem": "20000"}, True, True),                    # past the card
    (2, {"hami.io/gpumem": "1000"}, True, True),                     # every grant of such a node
    (2, {"hami.io/gpumem": "20000", "hami.io/oversubscribe": "false"}, False, False),
    (2, {"nvidia.com/gpumem": "1000", "nvidia.com/oversubscribe": "true"}, True, True),
    (1, {"hami.io/gpumem": "1000"}, False, True),                    # a node that does not oversubscribe
    (1, {"hami.io/gpumem": "1000", "hami.io/oversubscribe": "true"}, False, True),
])
def test_region_spill_flag(node, scaling, annotations, spill, recorded):
    devices, entry = grant(node, "o1", annotations, scaling)
    assert [d.spill for d in devices] == [spill]
    assert devices[0].mem_limit_bytes == int(next(iter(annotations.values()))) << 20
    assert entry["oversubscribe"] is recorded
    assert store.entry_problem(state_layout.alloc_name(str(node.runc_root), "o1"),
                               {**entry, "runc_root": str(node.runc_root), "bundle": "/b"}) == ""


@pytest.mark.parametrize("value", ["yes", 1, None])
def test_a_record_with_a_bad_oversubscribe_is_invalid(value):
    entry = {"id": "c", "runc_root": "/run/runc", "bundle": "/b", "core_policy": "default",
             "priority": 1, "oversubscribe": value,
             "devices": [{"index": 0, "uuid": "GPU-aaaaaaaa-0000-0000-0000-000000000000",
                          "mem_mib": 10, "cores": 0}]}
    assert store.entry_problem(state_layout.alloc_name("/run/runc", "c"), entry) == \
        f"oversubscribe={value!r} is not true or false"


@pytest.mark.parametrize("scaling, annotations, env", [
    (2, {"hami.io/gpumem": "1000"}, ["CUDA_OVERSUBSCRIBE=true"]),
    (2, {"hami.io/gpumem": "1000", "hami.io/oversubscribe": "false"}, []),
    (1, {"hami.io/gpumem": "1000"}, []),
])
def test_container_env_says_so_as_hami_core_reads_it(node, scaling, annotations, env):
    node.write_config(memory_scaling=scaling)
    bundle = node.bundle("e", annotations, args=("sh", "-c", "env"))
    proc = node.runtime("run", "--bundle", str(bundle), "e")
    assert proc.returncode == 0, proc.stderr
    assert [line for line in proc.stdout.splitlines() if line.startswith("CUDA_OVERSUBSCRIBE")] == env


@pytest.mark.skipif(not CUDA_ALLOC.exists(), reason="make sim builds the test program")
@pytest.mark.parametrize("annotations, total, results", [
    # promised 20000 MiB on a 16384 MiB card: sees and gets all of it, exactly
    ({"hami.io/gpumem": "20000"}, 20000, [("16100", "0"), ("3000", "0"), ("1500", "2")]),
    # opted out: as without oversubscription, the physical card bounds it
    ({"hami.io/gpumem": "20000", "hami.io/oversubscribe": "false"}, CARD_MIB,
     [("16100", "2"), ("3000", "0"), ("1500", "0")]),
])
def test_container_gets_its_promised_card(node, annotations, total, results):
    node.write_config(memory_scaling=2)
    allocs = " ".join(mib for mib, _ in results)
    bundle = node.bundle("big", annotations, args=(
        "sh", "-c", f"cuda_alloc {allocs}; nvidia-smi --query-gpu=memory.total --format=csv,noheader"))
    proc = node.runtime("run", "--bundle", str(bundle), "big")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    assert f"total {total}" in lines                     # cuMemGetInfo
    assert f"{total} MiB" in lines                       # NVML, through nvidia-smi
    got = [tuple(line.split()[1:]) for line in proc.stdout.splitlines() if line.startswith("alloc ")]
    assert got == results
