"""Two containers on one rootfs dir, as the tenant found them: a neighbour without
a GPU swaps /etc (or /.hami) with a symbolic link in a loop (renameat2
RENAME_EXCHANGE) while GPU containers are created on the same dir. The runtime
looks at the rootfs at create and runc mounts a moment later (the /etc bind of a
writable root following a link on the host): the createRuntime hook looks again
once runc has made the mounts, before the container's process starts. Each GPU
container is refused by its create in one line, or runs held to its slice, with
the image's /etc and no host dir in it; what a refused create held is freed by
the next operation. Once a GPU container runs, a neighbour on its rootfs can
still rename the image's /etc under it (the kernel lets another mount namespace
rename a mount point): that limit is shown last."""
import json
import os
import shutil
import subprocess
import time

import pytest

from hami_runtime.lifecycle.node_state import state_layout

from .node import CUDA_ALLOC, LAUNCHER, RUNC, TIMEOUT
from .test_tenant import HELD, SLICE, tenant_bundle

pytestmark = pytest.mark.skipif(not CUDA_ALLOC.exists(), reason="make sim builds the test program")

# swap A B STOP PAUSED US: exchanges A and B in a loop, 0 to 2 US microseconds apart
# (at random: some creates see a fast flip, some a still moment). While STOP exists it
# leaves them as they were at its start, makes PAUSED and waits (the test then starts
# a created container, or looks at the rootfs, with nothing moving).
SWAP_C = r"""
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>
static int exchange(const char *a, const char *b)
{
    if (syscall(SYS_renameat2, AT_FDCWD, a, AT_FDCWD, b, 2 /* RENAME_EXCHANGE */) == 0)
        return 0;
    perror("renameat2");
    return -1;
}
int main(int argc, char **argv)
{
    struct timespec pause = {0, 50000}, apart = {0, 0};
    unsigned long swaps = 0;
    if (argc != 6)
        return 2;
    long us = atol(argv[5]);
    srand((unsigned)getpid());
    for (;;) {
        if (access(argv[3], F_OK) == 0) {
            if (swaps % 2 && exchange(argv[1], argv[2]) == 0)
                swaps++;
            close(open(argv[4], O_CREAT | O_WRONLY | O_CLOEXEC, 0644));
            while (access(argv[3], F_OK) == 0)
                nanosleep(&pause, NULL);
            unlink(argv[4]);
            continue;
        }
        if (exchange(argv[1], argv[2]) != 0)
            return 1;
        swaps++;
        apart.tv_nsec = (rand() % (2 * us + 1)) * 1000;
        nanosleep(&apart, NULL);
    }
}
"""
TRIES = 30
# what each mount of the container is of its filesystem (mountinfo's fourth field)
MOUNT_ROOTS = r"sed 's/^[^ ]* [^ ]* [^ ]* \([^ ]*\) .*/mount-root \1/' /proc/self/mountinfo"
SWAP_US = 1000
PRELOAD_OFF = ["alloc 600 0", "alloc 600 0"]  # no libvgpu: the second 600 MiB is granted past the slice


@pytest.fixture(scope="module")
def swap(tmp_path_factory):
    cc = shutil.which("cc")
    if not cc:
        pytest.skip("no C compiler for the neighbour's program")
    where = tmp_path_factory.mktemp("swap")
    (where / "swap.c").write_text(SWAP_C)
    subprocess.run([cc, "-static", "-O2", "-o", str(where / "swap"), str(where / "swap.c")], check=True,
                   timeout=120)
    return where / "swap"


class Shared:
    """The rootfs dir both containers are given: the image's /etc marked as the
    image's, a dir of the tenant's without the preload, a host dir outside it."""

    def __init__(self, node, swap):
        self.node = node
        self.root = node.private_rootfs("shared")
        shutil.copy2(swap, self.root / "bin" / "swap")
        (self.root / "etc" / "marker").write_text("image\n")
        (self.root / "mine").mkdir()
        (self.root / "mine" / "marker").write_text("mine\n")
        (self.root / ".hami").mkdir(exist_ok=True)  # runc made it where GPU containers ran before
        self.host_dir = node.tmp / "host-dir"
        self.host_dir.mkdir()
        (self.host_dir / "marker").write_text("host\n")
        self.stop, self.paused = self.root / "tmp" / "swap.stop", self.root / "tmp" / "swap.paused"

    def neighbour(self, path, target, apart_us):
        """The container without a GPU on this rootfs, swapping `path` with a link to
        `target` 0 to 2 `apart_us` microseconds apart."""
        (self.root / "lnk").symlink_to(target)
        bundle = self.node.bundle("neighbour", args=("/bin/swap", path, "/lnk", "/tmp/swap.stop",
                                                     "/tmp/swap.paused", str(apart_us)), rootfs=self.root)
        proc = self.node.runtime("run", "--detach", "--bundle", str(bundle), "neighbour")
        assert proc.returncode == 0, proc.stderr

    def pause(self):
        self.stop.touch()
        deadline = time.monotonic() + 10
        while not self.paused.exists():
            assert time.monotonic() < deadline, "the neighbour does not pause"
            time.sleep(0.002)

    def resume(self):
        self.stop.unlink()


def wait_stopped(node, cid):
    deadline = time.monotonic() + TIMEOUT
    while time.monotonic() < deadline:
        state = subprocess.run([RUNC, "--root", str(node.runc_root), "state", cid], capture_output=True,
                               text=True, timeout=TIMEOUT)
        if json.loads(state.stdout)["status"] == "stopped":
            return
        time.sleep(0.05)
    raise AssertionError(f"{cid} still runs")


def create(node, cid, bundle, cmd):
    """hami-runtime create, its stdio files the container's own (it writes there once started)."""
    out, err = node.tmp / f"{cid}.out", node.tmp / f"{cid}.err"
    with open(out, "wb") as o, open(err, "wb") as e:
        proc = subprocess.run(node.runtime_argv("create", "--bundle", str(bundle), cid, cmd=cmd),
                              stdin=subprocess.DEVNULL, stdout=o, stderr=e, env=node.env, timeout=TIMEOUT,
                              cwd=node.tmp)
    return proc.returncode, out, err


def refusal(text):
    """The refusal's one line: the runtime's own, or runc's error carrying the hook's line
    (runc puts the hook's stderr, newline and all, at the end of its one error)."""
    lines = [line for line in text.splitlines() if line.strip()]
    assert len(lines) == 1, text
    return lines[0]


# (what the neighbour swaps, the link's target: "HOST" is the host dir)
SWAPS = {
    "/etc, a link to a host dir": ("/etc", "HOST"),
    "/etc, a link to a dir without the preload": ("/etc", "/mine"),
    "/.hami, a link to a dir of its own": ("/.hami", "/mine"),
}
HOOKS = {"C hook": [str(LAUNCHER)], "Python hook": None}


@pytest.mark.parametrize("hook", HOOKS.values(), ids=HOOKS.keys())
@pytest.mark.parametrize("swaps", SWAPS.values(), ids=SWAPS.keys())
def test_a_neighbour_swapping_links_never_lifts_the_slice(node, swap, swaps, hook):
    if hook and not LAUNCHER.exists():
        pytest.skip("make build builds the launcher")
    path, target = swaps
    shared = Shared(node, swap)
    shared.neighbour(path, str(shared.host_dir) if target == "HOST" else target, SWAP_US)
    outcomes = {"refused by the runtime": 0, "refused by the hook": 0, "refused by runc": 0, "ran": 0}
    for i in range(TRIES):
        cid = f"gpu{i}"
        bundle = tenant_bundle(node, cid, SLICE, f"cat /etc/marker; touch /etc/gpu{i}; {MOUNT_ROOTS}; "
                               "cuda_alloc 600 600", rootfs=shared.root)
        status, out, err = create(node, cid, bundle, hook)
        shared.pause()  # the create's mounts are made (or refused): nothing moves while it runs
        try:
            if status != 0:
                line = refusal(err.read_text())
                by = ("the hook" if "hami-hook: container " in line else
                      "the runtime" if line.startswith("hami-runtime: root") else "runc")
                outcomes[f"refused by {by}"] += 1
                assert cid not in node.containers()
                continue
            assert node.runtime("start", cid, cmd=hook).returncode == 0
            wait_stopped(node, cid)
            lines = out.read_text().splitlines()
            assert lines[0] == "image", lines  # the image's /etc, not the host dir nor the tenant's
            assert f"mount-root {shared.host_dir}" not in lines, lines  # nor the host dir anywhere
            assert [line for line in lines if line.startswith("alloc ")] == HELD, lines
            outcomes["ran"] += 1
            assert node.runtime("delete", cid, cmd=hook).returncode == 0
        finally:
            shared.resume()
    print(outcomes)
    assert sum(outcomes.values()) == TRIES
    # no GPU container wrote into the host dir; runc itself may have made the empty
    # mount point of the preload there before any hook runs (a refused create's)
    assert sorted(os.listdir(shared.host_dir)) in (["marker"], ["ld.so.preload", "marker"])
    assert not (shared.host_dir / "ld.so.preload").exists() or (shared.host_dir / "ld.so.preload").stat().st_size == 0
    # what the refused creates held is freed by the next operation
    assert node.ps() == []
    node.reconcile()
    assert not (node.state_dir / "private").exists() or os.listdir(node.state_dir / "private") == []


def runc_that_swaps(node, root, link_target):
    """The node's runc behind a wrapper that, at the next create only, puts a link to
    `link_target` in place of `root`'s /etc first: the neighbour acting between the
    runtime's look and runc's mounts, every time."""
    flag = node.tmp / "swap-next-create"
    wrapper = node.tmp / "runc-swapping"
    wrapper.write_text(f"""#!/bin/sh
for arg; do
    if [ "$arg" = create ] && [ -e {flag} ]; then
        rm {flag} && mv {root}/etc {root}/etc.image && ln -s {link_target} {root}/etc
    fi
done
exec {RUNC} "$@"
""")
    wrapper.chmod(0o755)
    node.write_config(runtime=[str(wrapper)])
    flag.touch()


@pytest.mark.parametrize("hook", HOOKS.values(), ids=HOOKS.keys())
@pytest.mark.parametrize("target", ["HOST", "mine"], ids=["a host dir", "a dir without the preload"])
def test_a_link_planted_before_runcs_mounts_fails_the_create(node, hook, target):
    """The mismatch made every time: the hook refuses the create in one line naming
    the path and what it found, that line is in the engine's --log, runc leaves no
    container, and the next operation frees the allocation."""
    if hook and not LAUNCHER.exists():
        pytest.skip("make build builds the launcher")
    root = node.private_rootfs("planted")
    (root / "mine").mkdir()
    host_dir = node.tmp / "host-dir"
    host_dir.mkdir()
    runc_that_swaps(node, root, host_dir if target == "HOST" else "mine")
    bundle = tenant_bundle(node, "planted", SLICE, "cuda_alloc 600 600", rootfs=root)
    status, out, err = create(node, "planted", bundle, hook)
    assert status == 1
    said = f"hami-hook: container planted: {root}/etc is a symbolic link (device "
    assert said in refusal(err.read_text()), err.read_text()
    assert refusal(err.read_text()).endswith("not a directory; the create is refused"), err.read_text()
    assert said in (node.tmp / "runc.log").read_text()
    assert "planted" not in node.containers()
    name = state_layout.alloc_name(str(node.runc_root), "planted")
    assert list(node.allocations()) == ["planted"]  # until the next operation
    assert node.ps() == []
    node.reconcile()
    assert node.allocations() == {}
    assert not (node.state_dir / "private" / name).exists()


def test_after_the_start_a_neighbour_can_still_take_the_preload_off(node, swap):
    """What the check does not hold: a GPU container that runs on a rootfs another
    container writes. A mount point is safe from renames in its own mount namespace
    only: the neighbour renames the image's /etc (the mounts on it go along) and
    puts a link in its place, and the GPU container's next process loads no libvgpu."""
    shared = Shared(node, swap)
    bundle = tenant_bundle(node, "late", SLICE, "cuda_alloc 600 600; while [ ! -e /tmp/go ]; do sleep 0.05; done; "
                           "cuda_alloc 600 600", rootfs=shared.root)
    status, out, err = create(node, "late", bundle, None)
    assert status == 0, err.read_text()
    assert node.runtime("start", "late").returncode == 0
    deadline = time.monotonic() + TIMEOUT
    while out.read_text().count("alloc ") < 2:
        assert time.monotonic() < deadline, out.read_text()
        time.sleep(0.05)
    os.rename(shared.root / "etc", shared.root / "etc.x")  # from another mount namespace
    (shared.root / "etc").symlink_to("/mine")
    (shared.root / "tmp" / "go").touch()
    wait_stopped(node, "late")
    allocs = [line for line in out.read_text().splitlines() if line.startswith("alloc ")]
    assert allocs == HELD + PRELOAD_OFF, allocs
