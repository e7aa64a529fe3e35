"""Stream capture and CUDA graphs under libvgpu (capture_probe.c on the simulated
driver, which captures as NVIDIA's driver does): libvgpu never breaks a capture, in
any mode, under any limit or policy, with another thread launching meanwhile, and a
graph's memory counts against the slice when the driver commits it."""
import subprocess

import pytest

from tests.conftest import BUILD

from .conftest import parse_fields

CAPTURE_PROBE = BUILD / "tests" / "capture_probe"
SUCCESS, OUT_OF_MEMORY = 0, 2
STATUS_ACTIVE = 1
KERNELS = 4

# what the process runs under: no libvgpu, then libvgpu with each limit and policy
UNDER = {
    "bare": None,
    "no limit": {},
    "memory limit": {"CUDA_DEVICE_MEMORY_LIMIT_0": "1024m"},
    "force 30%": {"CUDA_DEVICE_SM_LIMIT": 30, "GPU_CORE_UTILIZATION_POLICY": "force"},
    "default 30%": {"CUDA_DEVICE_SM_LIMIT": 30, "GPU_CORE_UTILIZATION_POLICY": "default"},
    "disable 30%": {"CUDA_DEVICE_SM_LIMIT": 30, "GPU_CORE_UTILIZATION_POLICY": "disable"},
    "force 60% + memory": {"CUDA_DEVICE_SM_LIMIT": 60, "GPU_CORE_UTILIZATION_POLICY": "force",
                           "CUDA_DEVICE_MEMORY_LIMIT_0": "1024m"},
}
MODES = ["global", "thread_local", "relaxed"]


def run(probe, under, *args):
    env = probe.env(preload=under is not None, **(under or {}))
    proc = subprocess.run([str(CAPTURE_PROBE), *map(str, args)], env=env, capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0, f"{args}: {proc.stdout}{proc.stderr}"
    return parse_fields(proc.stdout)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("under", UNDER, ids=list(UNDER))
def test_capture_and_replay(probe, under, mode):
    got = run(probe, UNDER[under], "capture", mode, KERNELS, 3)
    assert (got["launch_rc"], got["status"], got["end_rc"]) == (SUCCESS, STATUS_ACTIVE, SUCCESS), got
    assert got["nodes"] == KERNELS + 1          # the forked stream's kernel joined the capture
    assert (got["instantiate_rc"], got["replay_rc"], got["sync_rc"]) == (SUCCESS,) * 3, got


@pytest.mark.parametrize("under", UNDER, ids=list(UNDER))
def test_a_global_capture_holds_while_another_thread_launches(probe, under):
    """Launching from another thread is legal during a global-mode capture; querying
    events there is not, unless in relaxed mode: the limiter's own measurements must
    not invalidate the capture."""
    got = run(probe, UNDER[under], "capture", "global", KERNELS, 3, "neighbour")
    assert got["neighbour_rc"] == SUCCESS and got["neighbour_launches"] >= 5 * KERNELS, got
    assert (got["launch_rc"], got["status"], got["end_rc"]) == (SUCCESS, STATUS_ACTIVE, SUCCESS), got
    assert got["replay_rc"] == SUCCESS and got["sync_rc"] == SUCCESS, got


@pytest.mark.parametrize("policy", ["force", "default"])
def test_a_global_capture_holds_while_another_thread_is_primed(probe, policy):
    """The neighbour launches long enough to be held to its 30 % share during the global
    capture: its launches near the share are primed, the empty kernel loaded for them then
    (libvgpu_src/sm_limiter.c, in relaxed mode) and launched on its own stream, and the capture
    holds."""
    env = probe.env(CUDA_DEVICE_SM_LIMIT=30, GPU_CORE_UTILIZATION_POLICY=policy, LIBCUDA_LOG_LEVEL=4)
    args = ["capture", "global", KERNELS, 1, "neighbour", 80]
    proc = subprocess.run([str(CAPTURE_PROBE), *map(str, args)], env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    got = parse_fields(proc.stdout)
    assert got["neighbour_rc"] == SUCCESS and got["neighbour_launches"] >= 80 * KERNELS, got
    assert (got["launch_rc"], got["status"], got["end_rc"]) == (SUCCESS, STATUS_ACTIVE, SUCCESS), got
    assert got["replay_rc"] == SUCCESS and got["sync_rc"] == SUCCESS, got
    assert "the primer is loaded" in proc.stderr, proc.stderr[-2000:]


LIMIT = {"CUDA_DEVICE_MEMORY_LIMIT_0": "1024m"}


@pytest.mark.parametrize("how", ["upload", "launch"])
def test_graph_memory_is_charged_when_committed(probe, how):
    got = run(probe, LIMIT, "graph_memory", 256, how)
    assert (got["alloc_rc"], got["end_rc"], got["commit_rc"], got["again_rc"]) == (SUCCESS,) * 4, got
    before = got["free_before"]
    assert got["free_instantiated"] == before     # instantiation takes nothing yet
    assert got["free_committed"] == before - 256  # the graph's memory, as the slice sees it
    assert got["free_again"] == before - 256      # a relaunch reuses it
    assert got["free_trimmed"] == before          # trimmed: given back


@pytest.mark.parametrize("how", ["upload", "launch"])
def test_graph_memory_over_the_limit_is_refused(probe, how):
    got = run(probe, LIMIT, "graph_memory", 2048, how)
    assert (got["alloc_rc"], got["end_rc"]) == (SUCCESS, SUCCESS), got  # capture itself takes nothing
    assert (got["commit_rc"], got["again_rc"]) == (OUT_OF_MEMORY, OUT_OF_MEMORY), got
    before = got["free_before"]
    assert got["free_committed"] == got["free_again"] == got["free_trimmed"] == before  # nothing left charged


def test_graph_memory_within_the_card_without_libvgpu(probe):
    """The same graph fits the simulated card: the refusal above is the slice's."""
    got = run(probe, None, "graph_memory", 2048, "launch")
    assert got["commit_rc"] == SUCCESS and got["free_committed"] == got["free_before"] - 2048, got

