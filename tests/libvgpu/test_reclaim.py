"""Slots left behind by processes killed at any instant, written into a region
directly: a dead owner, a dead reclaimer (token), a zombie-free pid reuse."""
import pytest

from .conftest import MIB

LIMIT = 1024 * MIB
DEAD_PID = 4_000_000  # above any pid_max the kernel allows by default here


def owner(pid, start):
    return (pid << 32) | (start & 0xFFFFFFFF)


def leave_slot(probe, slot, owner_value, token, used):
    from hami_runtime.node import region

    if not probe.region.exists():
        probe.runtime_files([region.DeviceLimit(u, LIMIT, 0) for u in probe.uuids()]).close()
    with region.open(probe.region, writable=True) as r:
        c = r._struct()
        c.procs[slot].owner = owner_value
        c.procs[slot].pid = owner_value >> 32 if owner_value != 2**64 - 1 else 0
        c.procs[slot].started_ns = token
        c.procs[slot].mem_used[0] = used
        c.procs_high = max(c.procs_high, slot + 1)  # as its claimer did


@pytest.mark.parametrize("case", ["dead-owner", "dead-reclaimer", "killed-before-token",
                                  "pid-reused"])
def test_left_behind_usage_is_reclaimed(probe, case):
    import os

    from hami_runtime.node import region

    reclaiming = 2**64 - 1
    slots = {
        "dead-owner": (owner(DEAD_PID, 7), 1_700_000_000_000_000_000),
        "dead-reclaimer": (reclaiming, owner(DEAD_PID, 9)),
        "killed-before-token": (reclaiming, 1_700_000_000_000_000_000),
        # our own parent's pid with a start time that is not its own
        "pid-reused": (owner(os.getpid(), 12345), 1_700_000_000_000_000_000),
    }
    owner_value, token = slots[case]
    leave_slot(probe, 3, owner_value, token, LIMIT)
    result = probe.run("link", "alloc", "mem", 256 * MIB, shared=True)
    assert result.fields["rc"] == 0, result.stdout
    with region.open(probe.region) as r:
        slot = r._struct().procs[3]
        assert (slot.owner, slot.started_ns, slot.mem_used[0]) == (0, 0, 0)


def test_live_process_is_never_reclaimed(probe):
    import os

    from hami_runtime.node import region

    # this test process is alive: its slot (with the right start time) must stay charged
    with open(f"/proc/{os.getpid()}/stat") as f:
        start = int(f.read().rsplit(")", 1)[1].split()[19])
    leave_slot(probe, 3, owner(os.getpid(), start), 1_700_000_000_000_000_000, LIMIT - 64 * MIB)
    result = probe.run("link", "alloc", "mem", 256 * MIB, shared=True, check=False)
    assert "rc=2" in result.stdout  # the context or the allocation is refused
    with region.open(probe.region) as r:
        assert r._struct().procs[3].mem_used[0] == LIMIT - 64 * MIB
