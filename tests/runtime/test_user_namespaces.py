"""The tenant (root in a GPU container with the engines' default capabilities)
tries to lift its slice from a namespace of its own: `unshare -Urm`, then the
preload or /.hami covered. The runtime's seccomp rules refuse it whatever
profile the engine gave: none (runc, Kubernetes pods without RuntimeDefault),
podman's default (which allows unshare, clone and mount) or Docker's; every
rule of the engine's profile is kept. A GPU container with CAP_SYS_ADMIN is
refused at create. Each, and what the node's config opens, through the real
runtime and runc on the simulated GPU."""
import copy
import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from hami_runtime.lifecycle.spec_edit import modifiers
from tests.conftest import ROOT
from tests.runtime import test_tenant as tenant

from .node import CUDA_ALLOC

pytestmark = pytest.mark.skipif(not CUDA_ALLOC.exists(), reason="make sim builds the test program")

PODMAN_PROFILE = Path("/usr/share/containers/seccomp.json")  # containers-common's, which podman gives
SYSCALL_HEADER = Path("/usr/include/x86_64-linux-gnu/asm/unistd_64.h")  # linux-libc-dev (gcc's)
UNLIMITED = ["alloc 600 0"] * 2  # both fit: nothing holds the 1024 MiB slice
DENIED = "Operation not permitted"

# clone, clone3, unshare and setns as a program calls them, each answer one line
NSCLONE_C = r"""
#define _GNU_SOURCE
#include <errno.h>
#include <linux/sched.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

static void *thread(void *arg) { return arg; }

int main(int argc, char **argv)
{
    const char *what = argc > 1 ? argv[1] : "";
    unsigned long flags = argc > 2 ? strtoul(argv[2], NULL, 0) : 0;
    long r = -1;
    errno = EINVAL;
    if (!strcmp(what, "clone")) {
        r = syscall(SYS_clone, flags | SIGCHLD, 0, 0, 0, 0);
    } else if (!strcmp(what, "clone3")) {
        struct clone_args ca = {.flags = flags, .exit_signal = SIGCHLD};
        r = syscall(SYS_clone3, &ca, sizeof ca);
    } else if (!strcmp(what, "setns")) {
        r = setns(-1, (int)flags);  /* EBADF where seccomp lets it through */
    } else if (!strcmp(what, "thread")) {
        pthread_t t;
        int e = pthread_create(&t, NULL, thread, NULL);
        if (e) errno = e; else pthread_join(t, NULL);
        r = e ? -1 : 1;
    }
    if (r == 0) _exit(0);
    if (r > 1) waitpid((pid_t)r, NULL, 0);
    printf("%s %s: %s\n", what, argc > 2 ? argv[2] : "", r < 0 ? strerror(errno) : "ok");
    return 0;
}
"""

# what the tenant runs, then a new process's CUDA; the answers of each line
LIFT = ("unshare -Urm sh -c 'mount --bind /dev/null /etc/ld.so.preload && cuda_alloc 600 600'; "
        "unshare -Urm sh -c 'mount -t tmpfs none /.hami && cuda_alloc 600 600'; "
        "unshare -m true; unshare -U true; ")
PROBES = ("nsclone clone 0x10000000; nsclone clone 0x20000; nsclone clone 0x40000000; nsclone clone 0; "
          "nsclone clone3 0; nsclone setns 0; nsclone thread; ")
REFUSED_STDERR = ["unshare: unshare(0x10020000): " + DENIED] * 2 + [
    "unshare: unshare(0x20000): " + DENIED, "unshare: unshare(0x10000000): " + DENIED]
REFUSED_PROBES = ["clone 0x10000000: " + DENIED, "clone 0x20000: " + DENIED, "clone 0x40000000: " + DENIED,
                  "clone 0: ok", "clone3 0: Function not implemented", "setns 0: " + DENIED, "thread : ok"]


@pytest.fixture(scope="session")
def nsclone(tmp_path_factory):
    where = tmp_path_factory.mktemp("nsclone")
    (where / "nsclone.c").write_text(NSCLONE_C)
    subprocess.run(["gcc", "-O2", "-Wall", "-Werror", "-pthread", "-o", str(where / "nsclone"),
                    str(where / "nsclone.c")], check=True, timeout=120)
    return where / "nsclone"


def rootfs_with(node, cid, nsclone):
    root = node.private_rootfs(cid)
    shutil.copy2(nsclone, root / "bin" / "nsclone")
    return root


def bundle_with(node, cid, nsclone, script, seccomp=None, caps=tenant.DEFAULT_CAPS, annotations=tenant.SLICE):
    """A tenant's bundle (tenant.tenant_bundle) whose spec has `seccomp` as the engine's
    profile (None: none, as runc and pods without RuntimeDefault run) and these caps."""
    bundle = tenant.tenant_bundle(node, cid, annotations, script, rootfs_with(node, cid, nsclone))
    spec = json.loads((bundle / "config.json").read_text())
    spec["process"]["capabilities"] = {kind: list(caps) for kind in ("bounding", "effective", "permitted")}
    if seccomp is not None:
        spec["linux"]["seccomp"] = seccomp
    (bundle / "config.json").write_text(json.dumps(spec))
    return bundle


def answers(proc, prefixes=("alloc ", "init ")):
    return [line for line in proc.stdout.splitlines() if line.startswith(prefixes)]


def as_engine_gives(profile: dict, caps) -> dict:
    """An engine profile file (Docker's and containers-common's format) as the engine
    puts it in the spec on x86_64 for a container with `caps` (moby's and
    containers/common's setupSeccomp: the arch map, includes and excludes resolved)."""
    out = {"defaultAction": profile["defaultAction"]}
    if "defaultErrnoRet" in profile:
        out["defaultErrnoRet"] = profile["defaultErrnoRet"]
    out["architectures"] = [a for m in profile.get("archMap") or [] if m["architecture"] == "SCMP_ARCH_X86_64"
                            for a in [m["architecture"]] + (m.get("subArchitectures") or [])]
    out["syscalls"] = []
    for rule in profile.get("syscalls") or []:
        excludes, includes = rule.get("excludes") or {}, rule.get("includes") or {}
        if "amd64" in (excludes.get("arches") or []) or set(excludes.get("caps") or []) & set(caps):
            continue
        if (includes.get("arches") and "amd64" not in includes["arches"]) or \
                not set(includes.get("caps") or []) <= set(caps):
            continue
        made = {"names": rule.get("names") or [rule["name"]], "action": rule["action"]}
        if rule.get("args"):
            made["args"] = rule["args"]
        if "errnoRet" in rule:
            made["errnoRet"] = rule["errnoRet"]
        out["syscalls"].append(made)
    return out


def podman_profile():
    if not PODMAN_PROFILE.exists():  # podman's default profile, as podman installs it
        subprocess.run(["bash", str(ROOT / "scripts" / "install-deps.sh"), "golang-github-containers-common"],
                       check=True, timeout=600)
    return as_engine_gives(json.loads(PODMAN_PROFILE.read_text()), tenant.DEFAULT_CAPS)


def syscall_names():
    if not SYSCALL_HEADER.exists():
        pytest.skip(f"{SYSCALL_HEADER} (linux-libc-dev) lists the syscalls an allowlist names")
    return re.findall(r"^#define __NR_(\w+) ", SYSCALL_HEADER.read_text(), re.M)


# the namespace and mount syscalls Docker's profile lets through only with CAP_SYS_ADMIN
DOCKER_WITHHELD = {"clone", "clone3", "unshare", "setns", "mount", "umount2", "mount_setattr", "move_mount",
                   "open_tree", "fsopen", "fsconfig", "fsmount", "fspick", "pivot_root"}


def docker_profile():
    """Docker's default profile as dockerd puts it in the spec (no file of it here):
    ERRNO by default, an allowlist without the namespace and mount syscalls, clone
    only without a namespace flag, clone3 answered ENOSYS."""
    return {"defaultAction": "SCMP_ACT_ERRNO", "defaultErrnoRet": 1,
            "architectures": ["SCMP_ARCH_X86_64", "SCMP_ARCH_X86", "SCMP_ARCH_X32"],
            "syscalls": [{"names": [n for n in syscall_names() if n not in DOCKER_WITHHELD],
                          "action": "SCMP_ACT_ALLOW"},
                         {"names": ["clone"], "action": "SCMP_ACT_ALLOW",
                          "args": [{"index": 0, "value": 2114060288, "op": "SCMP_CMP_MASKED_EQ"}]},
                         {"names": ["clone3"], "action": "SCMP_ACT_ERRNO", "errnoRet": 38}]}


def allowlist_profile():
    """The shape that matters: ERRNO by default and an allowlist that names unshare,
    clone, clone3 and setns with no condition (podman's; Docker's with CAP_SYS_ADMIN)."""
    return {"defaultAction": "SCMP_ACT_ERRNO", "defaultErrnoRet": 38,
            "syscalls": [{"names": syscall_names(), "action": "SCMP_ACT_ALLOW"}]}


PROFILES = {"none": lambda: None, "podman's default": podman_profile, "Docker's default": docker_profile,
            "an allowlist with unshare": allowlist_profile}


@pytest.mark.parametrize("profile", PROFILES.values(), ids=PROFILES.keys())
def test_no_namespace_of_its_own_whatever_the_engines_profile(node, nsclone, profile):
    """unshare -Urm (then the preload or /.hami covered), unshare -m, unshare -U and
    clone with a namespace flag are refused (EPERM), setns too, clone3 is ENOSYS while
    clone without a namespace flag and threads work; the next CUDA process is held to
    the slice. Every rule of the engine's profile is in the spec runc ran."""
    engine = profile()
    bundle = bundle_with(node, "t", nsclone, LIFT + PROBES + "cuda_alloc 600 600", engine)
    proc = node.runtime("run", "--bundle", str(bundle), "t")
    assert answers(proc) == tenant.HELD, proc.stdout + proc.stderr
    assert answers(proc, ("clone", "setns", "thread")) == REFUSED_PROBES, proc.stdout
    assert proc.stderr.splitlines() == REFUSED_STDERR, proc.stderr
    ran = json.loads((bundle / "config.json").read_text())["linux"]["seccomp"]
    assert ran == modifiers.without_new_namespaces(copy.deepcopy(engine), modifiers.seccomp_architectures("x86_64"))
    if engine is not None:
        assert {k: v for k, v in ran.items() if k != "syscalls"} == {k: v for k, v in engine.items() if k != "syscalls"}
        kept = {(n, json.dumps(r.get("args")), r["action"]) for r in ran["syscalls"] for n in r["names"]}
        assert {(n, json.dumps(r.get("args")), r["action"]) for r in engine["syscalls"] for n in r["names"]
                if n not in ("clone", "unshare", "setns", "clone3")} <= kept


def test_allow_user_namespaces_leaves_the_profile_and_the_slice_is_lifted(node, nsclone):
    """What allow_user_namespaces = true opens: runc with no profile, as before the
    rules, lets the tenant cover the preload in a namespace of its own and run
    unlimited."""
    node.write_config(allow_user_namespaces=True)
    bundle = bundle_with(node, "t", nsclone, "unshare -Urm sh -c 'mount --bind /dev/null /etc/ld.so.preload "
                         "&& cuda_alloc 600 600'")
    proc = node.runtime("run", "--bundle", str(bundle), "t")
    assert proc.returncode == 0, proc.stderr
    assert answers(proc) == UNLIMITED, proc.stdout + proc.stderr
    assert "seccomp" not in json.loads((bundle / "config.json").read_text())["linux"]


def test_an_engine_rule_the_runtime_cannot_narrow_refuses_the_create(node, nsclone):
    """A rule that lets clone through on a condition of its flags that may hold with a
    namespace flag: refused in one line, before anything is allocated."""
    engine = {"defaultAction": "SCMP_ACT_ERRNO", "syscalls": [
        {"names": ["clone"], "action": "SCMP_ACT_ALLOW", "args": [{"index": 0, "value": 0, "op": "SCMP_CMP_NE"}]}]}
    bundle = bundle_with(node, "t", nsclone, "true", engine)
    before = (bundle / "config.json").read_bytes()
    proc = node.runtime("run", "--bundle", str(bundle), "t")
    assert proc.returncode != 0
    assert proc.stderr.splitlines()[-1].startswith("hami-runtime: linux.seccomp.syscalls[0]="), proc.stderr
    assert "cannot narrow to exclude new namespaces" in proc.stderr
    assert (bundle / "config.json").read_bytes() == before
    assert node.allocations() == {} and node.containers() == []


ALL_CAPS = tenant.DEFAULT_CAPS + ["CAP_SYS_ADMIN", "CAP_SYS_PTRACE", "CAP_NET_ADMIN", "CAP_SYS_MODULE"]
SYS_ADMIN = {
    "--cap-add SYS_ADMIN": {"bounding": tenant.DEFAULT_CAPS + ["CAP_SYS_ADMIN"]},
    "privileged (every capability)": {k: ALL_CAPS for k in ("bounding", "effective", "permitted")},
}


@pytest.mark.parametrize("caps", SYS_ADMIN.values(), ids=SYS_ADMIN.keys())
def test_a_gpu_container_with_cap_sys_admin_is_refused(node, nsclone, caps):
    """One line naming the capability; nothing allocated, the spec as it came."""
    bundle = bundle_with(node, "t", nsclone, "cuda_alloc 600 600")
    spec = json.loads((bundle / "config.json").read_text())
    spec["process"]["capabilities"] = {k: list(v) for k, v in caps.items()}
    (bundle / "config.json").write_text(json.dumps(spec))
    before = (bundle / "config.json").read_bytes()
    proc = node.runtime("run", "--bundle", str(bundle), "t")
    assert proc.returncode != 0
    assert proc.stderr.splitlines() == [
        "hami-runtime: process.capabilities.bounding='CAP_SYS_ADMIN': a GPU container with it can unmount "
        "or cover what holds its slice (a privileged container has it): refused (config allow_sys_admin = false)"
    ], proc.stderr
    assert (bundle / "config.json").read_bytes() == before
    assert node.allocations() == {} and node.containers() == []
    assert not (node.state_dir / "containers").exists() or os.listdir(node.state_dir / "containers") == []


def test_allow_sys_admin_runs_it_and_the_slice_is_lifted(node, nsclone):
    """What allow_sys_admin = true opens: the container runs, and with CAP_SYS_ADMIN
    covers the preload without any namespace of its own."""
    node.write_config(allow_sys_admin=True)
    bundle = bundle_with(node, "t", nsclone, "mount --bind /dev/null /etc/ld.so.preload && cuda_alloc 600 600",
                         caps=tenant.DEFAULT_CAPS + ["CAP_SYS_ADMIN"])
    proc = node.runtime("run", "--bundle", str(bundle), "t")
    assert proc.returncode == 0, proc.stderr
    assert answers(proc) == UNLIMITED, proc.stdout + proc.stderr


def test_a_container_without_a_gpu_keeps_its_spec_and_its_namespaces(node, nsclone):
    """CAP_SYS_ADMIN and no profile, asking for no GPU: its spec byte for byte, and it
    makes namespaces as runc lets it."""
    bundle = bundle_with(node, "plain", nsclone, "unshare -Urm true && echo unshared", annotations=None,
                         caps=tenant.DEFAULT_CAPS + ["CAP_SYS_ADMIN"])
    before = (bundle / "config.json").read_bytes()
    proc = node.runtime("run", "--bundle", str(bundle), "plain")
    assert proc.returncode == 0 and proc.stdout.splitlines() == ["unshared"], proc.stdout + proc.stderr
    assert (bundle / "config.json").read_bytes() == before
