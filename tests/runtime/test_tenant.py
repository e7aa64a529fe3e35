"""The tenant, root in a container hami-runtime made (with the capabilities Docker
and containerd give by default), tries to lift its slice or reach a neighbour's from inside: through the env, the
region dir it can write, the limits it can read, by renaming the preload or libvgpu's
files off their paths, by a chroot. Every try leaves the slice as it was or makes
its own CUDA calls fail (never unlimited), and the host tools never follow what it
planted."""
import json
import re

import pytest

from hami_runtime.lifecycle.node_state import container_files, state_layout
from tests.region.fakes import collect

from .node import CUDA_ALLOC

pytestmark = pytest.mark.skipif(not CUDA_ALLOC.exists(), reason="make sim builds the test program")

SLICE = {"hami.io/gpumem": "1024"}
VGPU = "/.hami"
REGION = f"{VGPU}/shared/vgpu.region"
LIFT = "CUDA_DEVICE_MEMORY_LIMIT=8g CUDA_DEVICE_MEMORY_LIMIT_0=8000m"
# cuda_alloc's answers: a context takes 300 MiB of the 1024 on the simulated card
HELD = ["alloc 600 0", "alloc 600 2"]           # the second is past the slice: out of memory
REFUSED = ["init 800"]                          # CUDA_ERROR_NOT_PERMITTED: libvgpu fails closed
# the engines' default set (Docker's, which containerd's CRI and podman also give)
DEFAULT_CAPS = ["CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_FSETID", "CAP_FOWNER", "CAP_MKNOD", "CAP_NET_RAW",
                "CAP_SETGID", "CAP_SETUID", "CAP_SETFCAP", "CAP_SETPCAP", "CAP_NET_BIND_SERVICE",
                "CAP_SYS_CHROOT", "CAP_KILL", "CAP_AUDIT_WRITE"]

# (what the tenant runs first, what cuda_alloc then gets)
TRIES = {
    "env limits": (f"export {LIFT}", HELD),
    "env region path": (f"export {LIFT} CUDA_DEVICE_MEMORY_SHARED_CACHE=/tmp/mine", HELD),
    "write the limits": (f"echo 8g > {VGPU}/limits; dd if=/dev/zero of={VGPU}/limits bs=8 count=1", HELD),
    "remove the limits": (f"rm -f {VGPU}/limits; mv {VGPU}/limits /tmp/l; umount {VGPU}/limits", HELD),
    "cover the limits": (f"mount -t tmpfs none {VGPU}; mount --bind /tmp {VGPU}/shared", HELD),
    "copy renamed over the region": (f"cp {REGION} /tmp/r; mv /tmp/r {REGION}; export {LIFT}", HELD),
    "region zeroed": (f"dd if=/dev/zero of={REGION} bs=4096 count=1 conv=notrunc; export {LIFT}", REFUSED),
    "region truncated": (f"truncate -s 0 {REGION}; export {LIFT}", REFUSED),
    "region removed": (f"rm {REGION}; export {LIFT}", REFUSED),
    "region a link": (f"rm {REGION}; ln -s /tmp/mine {REGION}; export {LIFT}", REFUSED),
}


def tenant_bundle(node, cid, annotations, script, rootfs=None):
    """A bundle whose process is root with the engines' default capabilities."""
    bundle = node.bundle(cid, annotations, args=("sh", "-c", script), rootfs=rootfs)
    spec = json.loads((bundle / "config.json").read_text())
    spec["process"]["capabilities"] = {kind: list(DEFAULT_CAPS)
                                       for kind in ("bounding", "effective", "permitted")}
    (bundle / "config.json").write_text(json.dumps(spec))
    return bundle


@pytest.mark.parametrize("tries", TRIES.values(), ids=TRIES.keys())
def test_a_try_from_inside_never_lifts_the_slice(node, tries):
    first, expected = tries
    bundle = tenant_bundle(node, "t", SLICE, f"{first} 2>/dev/null; cuda_alloc 600 600")
    proc = node.runtime("run", "--bundle", str(bundle), "t")
    got = [line for line in proc.stdout.splitlines() if line.startswith(("alloc ", "init "))]
    assert got == expected, proc.stdout + proc.stderr
    if expected == REFUSED:  # one line says why
        assert len([line for line in proc.stderr.splitlines() if line.startswith("[hami]")]) == 1, proc.stderr


BUSY = "Device or resource busy"  # EBUSY: a mount point is not renamed or removed
# a tree of the container's own files (hard links; the driver, a mount, copied) without
# /etc/ld.so.preload: chroot into it and nothing preloads libvgpu
TREE = ("t=/tmp/t; mkdir -p $t/bin $t/lib/x86_64-linux-gnu $t/lib64 $t/run/hami-sim $t/etc $t/tmp && "
        "ln /bin/busybox /bin/cuda_alloc $t/bin/ && ln -s busybox $t/bin/sh && "
        "ln /lib/x86_64-linux-gnu/libc.so.6 $t/lib/x86_64-linux-gnu/ && ln /lib64/ld-linux-x86-64.so.2 $t/lib64/ && "
        "cp /lib/libcuda.so.1 /lib/libnvidia-ml.so.1 $t/lib/ && cp -a /run/hami-sim/. $t/run/hami-sim/")
# (what the tenant runs, what it is told on stderr, or None where the rename works
# and the slice does not depend on what it moved); cuda_alloc then runs as a new
# process would, in the same container
OFF_THE_PATH = {
    "mv /etc": ("mv /etc /etc.x && mkdir /etc", f"mv: can't rename '/etc': {BUSY}"),
    "rm -rf /etc": ("rm -rf /etc", f"rm: can't remove '/etc/ld.so.preload': {BUSY}"),
    "mv /usr/local": ("mv /usr/local /usr/l && test -f /usr/l/vgpu/libvgpu.so", None),
    "mv /usr": ("mv /usr /usr.x && mkdir -p /usr/local/vgpu", None),
    "rename /.hami": ("mv /.hami /h && mkdir /.hami", f"mv: can't rename '/.hami': {BUSY}"),
    "rename libvgpu": ("mv /.hami/libvgpu.so /.hami/l", "mv: can't rename '/.hami/libvgpu.so': Read-only file system"),
    "mv /etc/ld.so.preload": ("mv /etc/ld.so.preload /etc/p", f"mv: can't rename '/etc/ld.so.preload': {BUSY}"),
    "mv /etc/ld.so.preload elsewhere": ("mv /etc/ld.so.preload /tmp/p",
                                        f"mv: can't remove '/etc/ld.so.preload': {BUSY}"),
    "rm /etc/ld.so.preload": ("rm -f /etc/ld.so.preload", f"rm: can't remove '/etc/ld.so.preload': {BUSY}"),
    "chroot into a hard-linked tree": (f"{TREE} && chroot /tmp/t /bin/cuda_alloc 600 600",
                                       "chroot: can't change root directory to '/tmp/t': Operation not permitted"),
}


@pytest.mark.parametrize("tries", OFF_THE_PATH.values(), ids=OFF_THE_PATH.keys())
def test_the_preload_and_libvgpu_stay_on_their_paths(node, tries):
    """In a rootfs of its own (a rename that works changes it), the tenant tries to
    take /etc/ld.so.preload or libvgpu's files off the paths the loader and libvgpu
    use: the kernel refuses with the reason shown, or what moved is nothing the
    slice needs; the next process is held to the slice."""
    first, reason = tries
    bundle = tenant_bundle(node, "t", SLICE, f"{first}; cuda_alloc 600 600", node.private_rootfs("t"))
    proc = node.runtime("run", "--bundle", str(bundle), "t")
    got = [line for line in proc.stdout.splitlines() if line.startswith(("alloc ", "init "))]
    assert got == HELD, proc.stdout + proc.stderr
    assert proc.stderr.splitlines() == ([reason] if reason else []), proc.stderr


def test_allow_chroot_keeps_it_and_the_tree_runs_unlimited(node):
    """What allow_chroot = true opens: the same tree, chrooted into, loads no libvgpu."""
    node.write_config(allow_chroot=True)
    bundle = tenant_bundle(node, "t", SLICE, f"{TREE} && chroot /tmp/t /bin/cuda_alloc 600 600",
                           node.private_rootfs("t"))
    proc = node.runtime("run", "--bundle", str(bundle), "t")
    assert proc.returncode == 0, proc.stderr
    assert [line for line in proc.stdout.splitlines() if line.startswith("alloc ")] == ["alloc 600 0"] * 2


def test_the_sm_share_is_not_lifted_by_the_env(node):
    """Direction only (timing): 20 kernels of 10 ms take about 0.2 s unlimited and
    about 1 s at a forced 20 % share, whatever the env says."""
    def seconds(cid, annotations, first="true"):
        bundle = tenant_bundle(node, cid, annotations, f"{first}; cuda_alloc spin 20 10000")
        proc = node.runtime("run", "--bundle", str(bundle), cid)
        found = re.search(r"^spin ([\d.]+)$", proc.stdout, re.M)
        assert found, proc.stdout + proc.stderr
        return float(found.group(1))

    free = seconds("free", SLICE)
    held = seconds("held", {**SLICE, "hami.io/gpucores": "20", "hami.io/core-policy": "force"},
                   "export CUDA_DEVICE_SM_LIMIT=100 CUDA_DEVICE_SM_LIMIT_0=0 GPU_CORE_UTILIZATION_POLICY=disable")
    assert held > 2.5 * free and held > 0.5, (free, held)


def test_a_link_to_a_neighbours_region_is_never_followed(node):
    """The tenant knows its neighbours' names (the priority board) and can guess the
    host's state dir: it links its region to a neighbour's. The operator's update
    of the tenant changes the tenant's limits alone, top shows the tenant's region
    as its error and the neighbour as it is, and the tenant's own CUDA fails closed."""
    for cid in ("tenant", "neighbour"):
        bundle = tenant_bundle(node, cid, SLICE, "sleep 60")
        assert node.runtime("run", "--detach", "--bundle", str(bundle), cid).returncode == 0
    tenant, neighbour = (state_layout.alloc_name(str(node.runc_root), cid) for cid in ("tenant", "neighbour"))
    theirs = node.state_dir / "containers" / neighbour / "vgpu.region"
    before = theirs.read_bytes()
    plant = node.runtime("exec", "tenant", "sh", "-c", f"rm {REGION} && ln -s {theirs} {REGION}")
    assert plant.returncode == 0, plant.stderr

    assert node.hamictl("update", "tenant", "--gpumem", "3000").returncode == 0
    for name, mib in ((tenant, 3000), (neighbour, 1024)):
        with container_files.open_limits(str(node.state_dir), name) as limits:
            assert limits.devices[0].mem_limit_bytes == mib << 20
    assert theirs.read_bytes() == before

    shown = {c["id"]: c for c in json.loads(node.hamictl("top", "--json", "--interval", "0").stdout)["containers"]}
    assert "a symbolic link" in shown["tenant"]["error"]
    assert not shown["neighbour"]["error"] and shown["neighbour"]["devices"][0]["mem_limit_bytes"] == 1024 << 20
    scraped = collect(node.state_dir)
    assert re.search(r'^hami_container_region_readable\{container="tenant",[^}]*\} 0(\.0)?$', scraped, re.M)
    assert re.search(r'hami_container_memory_limit_bytes\{container="neighbour",.*\} 1.073741824e\+09', scraped)

    inside = node.runtime("exec", "tenant", "cuda_alloc", "600")
    assert inside.stdout.splitlines() == REFUSED, inside.stdout + inside.stderr
