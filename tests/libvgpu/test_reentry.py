"""A driver whose entry points call each other through their exported names (the
simulator's `self_calls`): every context-creation variant, however it is reached,
neither hangs nor counts its context twice, and the limit stays exact."""
import subprocess

import pytest

from .conftest import MIB
from .test_memory_limit import LIMIT, expect_largest

CONTEXTS = ["primary", "create", "create_v3", "create_v4"]  # PROBE_CTX
MODES = ["link", "dlsym", "proc"]
HANG = 20  # seconds: a creation that takes this long is a deadlock


@pytest.fixture
def self_calling(probe):
    """The probe on a driver that calls its own exports (cuCtxCreate_v4 -> _v3 -> _v2,
    and a page of every context through cuMemAlloc_v2); CUDA 12.8 so _v4 is offered."""
    config = probe.tmp / "sim.conf"
    config.write_text("self_calls = 1\ncuda_version = 12080\n")
    probe.base_env["HAMI_SIM_CONFIG"] = str(config)
    return probe


def run_bounded(probe, *args, **env):
    try:
        return probe.run(*args, timeout=HANG, **env)
    except subprocess.TimeoutExpired:
        pytest.fail(f"probe {args} {env} hung (no answer in {HANG} s)")


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("ctx", CONTEXTS)
def test_context_is_charged_once(self_calling, mode, ctx):
    one = self_calling.context_bytes()
    assert one == 300 * MIB
    view = run_bounded(self_calling, mode, "ctxview", PROBE_CTX=ctx,
                       CUDA_DEVICE_MEMORY_LIMIT=LIMIT).fields
    assert (view["getinfo_used"], view["nvml_used"]) == (one, one)


@pytest.mark.parametrize("ctx", CONTEXTS)
def test_limit_stays_exact(self_calling, ctx):
    one = self_calling.context_bytes()
    result = run_bounded(self_calling, "link", "max", "mem", PROBE_CTX=ctx,
                         CUDA_DEVICE_MEMORY_LIMIT=LIMIT)
    expect_largest(self_calling, result, one)


def test_without_self_calls_the_same(probe):
    one = probe.context_bytes()
    for ctx in CONTEXTS:
        view = run_bounded(probe, "link", "ctxview", PROBE_CTX=ctx,
                           CUDA_DEVICE_MEMORY_LIMIT=LIMIT).fields
        assert (view["getinfo_used"], view["nvml_used"]) == (one, one), ctx
