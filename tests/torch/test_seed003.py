"""Seed 003's isolation test, through hami-runtime and runc on the simulated GPU: a
ResNet-18 (bench/gpu/torch_probe.py builds it from torch.nn, as torchvision's) trains on
dummy data in containers (tests/torch/containers.py).

- memory: with a 20000 MiB slice on a 24 GiB card, the largest tensor that fits beside
  the model is what the slice leaves after the process's context and libraries and the
  model's state (HAMi-core: 500 MiB short of that), and one MiB more is refused;
- SM: a step at 30 % of the SMs takes longer than at 60 % (exact ratios: bench/torch_seed003.py);
  a lone container under the `default` policy is not held to its share;
- two containers with 4 GiB slices on one 8 GiB card train at once, each sees 4 GiB and
  fills its slice while the other holds its own.

The same probe runs on a real GPU (tests/gpu/test_torch_limits.py)."""
import pytest

# the runtime tests' node (config, runc root, bundles) and its fixtures
from tests.runtime.conftest import node, rootfs, sim_copy, spec_template  # noqa: F401

from tests.torch.containers import result, run, start, torch_bundle, use_card

KERNEL_US = 430                            # a step of ResNet-18 (~420 kernels) books ~0.18 s of the card


@pytest.fixture
def card24(node):  # noqa: F811
    return use_card(node, 24576, KERNEL_US)


def test_seed003_memory_the_largest_tensor_beside_a_resnet(node, card24):  # noqa: F811
    bundle = torch_bundle(node, "mem", {"hami.io/gpumem": "20000"}, "resnet-memory", "--batch", 8)
    got = run(node, card24, bundle, "mem")
    assert got["total_mib"] == 20000
    # the slice is exactly what holds the card: the process outside the allocator (context,
    # cuBLAS and cuDNN workspaces, module data), the model's state, and what is still free
    assert got["outside_allocator_mib"] + got["model_mib"] + got["free_mib"] == 20000
    assert got["outside_allocator_mib"] < 500 and got["model_mib"] < 500
    # all of the free memory is one tensor (to torch's 2 MiB rounding), one MiB more is refused
    assert got["free_mib"] - 2 <= got["largest_ok_mib"] <= got["free_mib"]
    assert got["first_refused_mib"] == got["largest_ok_mib"] + 1
    assert got["refusal"]["error"] == "OutOfMemoryError"
    assert "total capacity of 19.53 GiB" in got["refusal"]["message"]
    assert node.containers() == []


def test_seed003_sm_a_step_at_30_percent_takes_longer_than_at_60(node, card24):  # noqa: F811
    steps = {}
    for cores in (60, 30):
        bundle = torch_bundle(node, f"sm{cores}", {"hami.io/gpumem": "4096", "hami.io/gpucores": str(cores),
                                                  "hami.io/core-policy": "force"},
                              "resnet-train", "--warmup", 3, "--steps", 5)
        steps[cores] = run(node, card24, bundle, f"sm{cores}")["median_step_s"]
    # seed 003: 0.6 s against 0.3 s, a ratio of 2; asserted here as a direction, wide (noisy machines)
    assert 1.4 <= steps[30] / steps[60] <= 3.0, steps
    # alone under `default`, 30 % is not held: faster than 60 % held
    bundle = torch_bundle(node, "lone", {"hami.io/gpumem": "4096", "hami.io/gpucores": "30"},
                          "resnet-train", "--warmup", 3, "--steps", 5)
    lone = run(node, card24, bundle, "lone")["median_step_s"]
    assert lone < steps[60], (lone, steps)


def test_two_containers_with_4_gib_slices_train_at_once_on_an_8_gib_card(node, tmp_path):  # noqa: F811
    env = use_card(node, 8192, KERNEL_US)
    barrier = tmp_path / "barrier"
    barrier.mkdir()
    barrier.chmod(0o777)
    procs = []
    try:
        for cid in ("a", "b"):
            bundle = torch_bundle(node, cid, {"hami.io/gpumem": "4096"}, "resnet-train", "--warmup", 2,
                                  "--steps", 2, "--barrier", barrier, writable=[barrier])
            procs.append(start(node, env, bundle, cid))
        got = [result(*p) for p in procs]
    finally:
        for proc, *_ in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    for g in got:
        assert g["total_mib"] == g["total_memory_mib"] == 4096
        # each filled its slice beside its training while the other held its own, and trained on
        assert g["held_mib"] > 4096 - 500 - g["training_mib"] - g["headroom_mib"], got
        assert g["free_when_held_mib"] <= g["headroom_mib"] + 2
        assert len(g["step_s"]) == 2
    assert node.containers() == []
