"""Each spec modifier on a literal spec, and the composed result against the schema."""
import copy
import json
from pathlib import Path

import jsonschema
import pytest

from hami_runtime.lifecycle.spec_edit import modifiers as m

SCHEMA = json.loads((Path(__file__).resolve().parents[2] / "schemas" / "oci-spec.schema.json").read_text())


def base():
    return {"ociVersion": "1.0.2", "root": {"path": "rootfs"},
            "process": {"args": ["sh"], "env": ["PATH=/bin", "LD_LIBRARY_PATH=/opt/lib",
                                                "NVIDIA_VISIBLE_DEVICES=all"]},
            "mounts": [{"destination": "/proc", "type": "proc", "source": "proc"}],
            "hooks": {"poststop": [{"path": "/bin/other"}]},
            "linux": {"resources": {"devices": [{"allow": False, "access": "rwm"}]}}}


INJ = m.Injection(
    devices=m.device_nodes([3], {"nvidia-frontend": 195, "nvidia-uvm": 511}),
    mounts=[m.Mount("/host/libcuda.so.1", "/lib/libcuda.so.1", tuple(m.RO_BIND)),
            m.Mount("/state/c/", m.REGION_DIR, tuple(m.RW_BIND))],
    env={"CUDA_DEVICE_MEMORY_LIMIT_0": "3000m", "NVIDIA_VISIBLE_DEVICES": "GPU-3"},
    library_dirs=["/lib"],
    hook_argv=["/usr/bin/python3", "-I", "-m", "hami_hook", "--state-dir", "/state"],
    hook_env=["PATH=/usr/bin:/bin"], marker={"id": "c", "devices": []})


def test_device_nodes():
    assert m.device_nodes([0], {}) == [m.DeviceNode("/dev/nvidia0", 195, 0),
                                       m.DeviceNode("/dev/nvidiactl", 195, 255)]
    nodes = m.device_nodes([1, 2], {"nvidia-frontend": 195, "nvidia-uvm": 508})
    assert [n.path for n in nodes] == ["/dev/nvidia1", "/dev/nvidia2", "/dev/nvidiactl",
                                       "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"]
    assert nodes[-1] == m.DeviceNode("/dev/nvidia-uvm-tools", 508, 1)


def test_device_nodes_of_mig_instances():
    """Two instances of GPU 1: its node once, then the caps nodes of each."""
    nodes = m.device_nodes([1, 1], {"nvidia-frontend": 195, "nvidia-caps": 236}, [156, 157, 165, 166])
    assert [n.path for n in nodes] == ["/dev/nvidia1", "/dev/nvidiactl"] + [
        f"/dev/nvidia-caps/nvidia-cap{k}" for k in (156, 157, 165, 166)]
    assert nodes[-1] == m.DeviceNode("/dev/nvidia-caps/nvidia-cap166", 236, 166)


def test_removing_dockers_gpu_hook_twice_is_removing_it_once():
    spec = base()
    spec["hooks"]["prestart"] = [{"path": "/usr/bin/nvidia-container-runtime-hook",
                                  "args": ["nvidia-container-runtime-hook", "prestart"]}, {"path": "/bin/x"}]
    once = m.without_gpu_hooks(copy.deepcopy(spec))
    assert once["hooks"]["prestart"] == [{"path": "/bin/x"}]
    assert m.without_gpu_hooks(copy.deepcopy(once)) == once
    spec["hooks"]["prestart"].pop()
    assert "prestart" not in m.without_gpu_hooks(m.without_gpu_hooks(spec))["hooks"]


def test_add_device_nodes():
    spec = m.add_device_nodes(base(), INJ)
    assert {"path": "/dev/nvidia3", "type": "c", "major": 195, "minor": 3, "fileMode": 0o666,
            "uid": 0, "gid": 0} in spec["linux"]["devices"]
    assert len(spec["linux"]["devices"]) == 4


def test_allow_device_access_keeps_deny_first():
    rules = m.allow_device_access(base(), INJ)["linux"]["resources"]["devices"]
    assert rules[0] == {"allow": False, "access": "rwm"}
    assert {"allow": True, "type": "c", "major": 511, "minor": 1, "access": "rwm"} in rules
    assert len(rules) == 5


def test_add_mounts():
    mounts = m.add_mounts(base(), INJ)["mounts"]
    assert mounts[0]["destination"] == "/proc"
    assert mounts[1] == {"destination": "/lib/libcuda.so.1", "type": "bind",
                         "source": "/host/libcuda.so.1", "options": ["bind", "ro", "nosuid", "nodev"]}
    assert mounts[2]["options"][1] == "rw"


def test_set_env_replaces_and_appends_library_path():
    env = m.set_env(base(), INJ)["process"]["env"]
    assert env == ["PATH=/bin", "CUDA_DEVICE_MEMORY_LIMIT_0=3000m", "NVIDIA_VISIBLE_DEVICES=GPU-3",
                   "LD_LIBRARY_PATH=/opt/lib:/lib"]


def test_hooks_have_their_own_env():
    hooks = m.add_hooks(base(), INJ)["hooks"]
    assert hooks["poststop"][0] == {"path": "/bin/other"}
    ours = hooks["poststop"][1]
    assert ours["args"][-1] == "poststop" and ours["env"] == ["PATH=/usr/bin:/bin"]
    assert hooks["createRuntime"][0]["args"][-1] == "createRuntime"


def test_marker():
    spec = m.mark_allocation(base(), INJ)
    assert json.loads(spec["annotations"][m.MARKER]) == {"id": "c", "devices": []}


def test_apply_is_idempotent_and_valid():
    once = m.apply(base(), INJ)
    twice = m.apply(copy.deepcopy(once), INJ)
    assert once == twice
    jsonschema.validate(once, SCHEMA)


def test_apply_leaves_the_input_alone_when_copied():
    original = base()
    m.apply(copy.deepcopy(original), INJ)
    assert original == base()


def test_c_hook_is_not_doubled_and_brings_no_poststop():
    """With the launcher's C hook there is no poststop of ours (delete and the
    next transaction free the allocation); the spec's own hooks stay."""
    inj = INJ._replace(create_hook_argv=["/opt/hami-runtime", "hami-hook", "--state-dir",
                                        "/state", "--root-key", "0123456789abcdef"])
    once = m.add_hooks(base(), inj)
    twice = m.add_hooks(copy.deepcopy(once), inj)
    assert once == twice
    assert [h["args"] for h in twice["hooks"]["createRuntime"]] == [inj.create_hook_argv + ["createRuntime"]]
    assert [h.get("args") for h in twice["hooks"]["poststop"]] == [
        h.get("args") for h in base()["hooks"]["poststop"]]
    # a spec edited before without the C hook loses our Python poststop
    again = m.add_hooks(m.add_hooks(base(), INJ), inj)
    assert again == once


def test_a_hook_of_an_earlier_create_with_other_checks_is_replaced():
    """A bundle created again after its root or /etc changed: one hook of ours, today's."""
    checks = ["--rootfs", "/r", "--etc", "bind", "--libvgpu", "/l"]
    earlier = m.add_hooks(base(), INJ._replace(hook_argv=list(INJ.hook_argv) + checks))
    inj = INJ._replace(hook_argv=list(INJ.hook_argv) + checks[:3] + ["dir"] + checks[4:])
    again = m.add_hooks(earlier, inj)
    assert [h["args"] for h in again["hooks"]["createRuntime"]] == [inj.hook_argv + ["createRuntime"]]


def header_paths():
    """The string #defines of libvgpu's region.h (a name may stand for its value)."""
    import re
    text = (Path(__file__).resolve().parents[2] / "libvgpu_src" / "region.h").read_text()
    found = {}
    for name, value in re.findall(r'^#define (HAMI_\w+) ((?:\w+ )?"[^"]*")$', text, re.M):
        parts = value.split()
        found[name] = "".join(found.get(p, p).strip('"') for p in parts)
    return found


def test_container_paths_are_libvgpus():
    """Where the runtime mounts libvgpu's files is where libvgpu looks for them."""
    paths = header_paths()
    assert (paths["HAMI_RUNTIME_LIBVGPU"], paths["HAMI_LIMITS_PATH"], paths["HAMI_RUNTIME_REGION_DIR"],
            paths["HAMI_RUNTIME_ACTIVITY_BOARD"], paths["HAMI_RUNTIME_PRIORITY_BOARD"]) == \
        (m.LIBVGPU_PATH, m.LIMITS_PATH, m.REGION_DIR, m.ACTIVITY_BOARD_DIR, m.PRIORITY_BOARD_DIR)
    from hami_runtime.lifecycle.node_state import boards
    from hami_runtime.node import region
    assert paths["HAMI_RUNTIME_REGION_PATH"] == f"{m.REGION_DIR}/{region.REGION_FILE_NAME}"
    assert paths["HAMI_RUNTIME_STAMP_DIR"] == f"{m.REGION_DIR}/{boards.STAMP_DIR}"


def test_slice_mounts_come_under_one_mount_point_first():
    """/.hami (a read-only tmpfs) before everything in it; the preload names what
    is mounted at LIBVGPU_PATH; HAMi-core's place keeps the library too."""
    mounts = m.slice_mounts("/lib/libvgpu.so", "/p/ld.so.preload", "/p/limits", "/s/c", "/s/activity",
                            "/s/priority")
    assert mounts[0] == m.Mount("tmpfs", m.HAMI_DIR, tuple(m.HAMI_TMPFS), "tmpfs") and "ro" in m.HAMI_TMPFS
    inside = [x for x in mounts if x.destination.startswith(m.HAMI_DIR + "/")]
    assert [x.destination for x in inside] == [m.LIBVGPU_PATH, m.LIMITS_PATH, m.REGION_DIR,
                                               m.ACTIVITY_BOARD_DIR, m.PRIORITY_BOARD_DIR]
    assert [x.options[1] for x in inside] == ["ro", "ro", "rw", "ro", "ro"]
    assert m.Mount("/p/ld.so.preload", m.PRELOAD_PATH, tuple(m.RO_BIND)) in mounts
    assert m.Mount("/lib/libvgpu.so", "/usr/local/vgpu/libvgpu.so", tuple(m.RO_BIND)) in mounts
    spec = m.add_mounts(base(), INJ._replace(mounts=mounts))
    assert spec["mounts"][1] == {"destination": "/.hami", "type": "tmpfs", "source": "tmpfs",
                                 "options": list(m.HAMI_TMPFS)}


def test_etc_hold():
    assert m.etc_hold("/rootfs/etc", False) == m.EtcHold(m.Mount("/rootfs/etc", "/etc", ("bind",)))
    # a read-only root: runc binds it after the mounts under it are made
    assert m.etc_hold("/rootfs/etc", True) == m.EtcHold(readonly_path="/etc")
    # an image without /etc: an empty tmpfs where runc would have made a directory
    assert m.etc_hold(None, False) == m.EtcHold(m.Mount("tmpfs", "/etc", ("nosuid", "nodev", "mode=755"), "tmpfs"))
    assert m.etc_hold(None, True).mount.options[0] == "ro"


def mount(destination):
    return {"destination": destination, "type": "bind", "source": "/host" + destination, "options": ["rbind"]}


ETC = m.etc_hold("/rootfs/etc", False)
OURS = {"destination": "/etc", "type": "bind", "source": "/rootfs/etc", "options": ["bind"]}
# the spec's mounts (destinations), and where /etc's own mount point goes among them
HOLD_ETC = {
    "docker's": (["/proc", "/dev", "/etc/resolv.conf", "/etc/hostname", "/etc/hosts", "/dev/shm"], 2),
    "podman's": (["/proc", "/dev", "/etc/hosts", "/run/.containerenv", "/etc/resolv.conf"], 2),
    "none under /etc": (["/proc", "/dev"], 2),
    "a volume under /etc first": (["/etc/ssl/certs", "/proc"], 0),
    "written oddly": (["/proc", "etc/hosts", "//etc/./hostname"], 1),
    "/etcetera is not under /etc": (["/etcetera", "/etc/hosts"], 1),
    "the spec mounts /etc itself": (["/proc", "/etc", "/etc/hosts"], None),
    "and writes it oddly": (["/proc", "/etc/", "/etc/hosts"], None),
}


@pytest.mark.parametrize("destinations, at", HOLD_ETC.values(), ids=HOLD_ETC.keys())
def test_hold_etc_goes_before_every_mount_under_etc(destinations, at):
    spec = base()
    spec["mounts"] = [mount(d) for d in destinations]
    once = m.hold_etc(copy.deepcopy(spec), INJ._replace(etc=ETC))
    expected = [mount(d) for d in destinations]
    if at is not None:
        expected.insert(at, OURS)
    assert once["mounts"] == expected
    assert m.hold_etc(copy.deepcopy(once), INJ._replace(etc=ETC)) == once
    assert m.hold_etc(copy.deepcopy(spec), INJ) == spec  # nothing to hold: untouched
    # a read-only root: /etc in readonlyPaths, unless the spec mounts /etc itself
    readonly = m.hold_etc(copy.deepcopy(spec), INJ._replace(etc=m.etc_hold("/rootfs/etc", True)))
    assert readonly["mounts"] == spec["mounts"]
    assert readonly["linux"].get("readonlyPaths") == (["/etc"] if at is not None else None)
    assert m.hold_etc(copy.deepcopy(readonly), INJ._replace(etc=m.etc_hold("/rootfs/etc", True))) == readonly


def test_hold_etc_goes_before_the_preload():
    inj = INJ._replace(mounts=m.slice_mounts("/l", "/p", "/li", "/r", "/a", "/pr"), etc=ETC)
    mounts = [x["destination"] for x in m.apply(base(), inj)["mounts"]]
    assert mounts.index("/etc") < mounts.index("/etc/ld.so.preload")
    assert m.apply(m.apply(base(), inj), inj) == m.apply(base(), inj)
    jsonschema.validate(m.apply(base(), inj), SCHEMA)


CAPS = ["CAP_CHOWN", "CAP_SYS_CHROOT", "CAP_MKNOD"]
# the spec's process.capabilities, and what the chroot-less GPU container gets
DROP = {
    "every set": ({k: list(CAPS) for k in ("bounding", "effective", "permitted", "inheritable", "ambient")},
                  {k: ["CAP_CHOWN", "CAP_MKNOD"] for k in ("bounding", "effective", "permitted", "inheritable",
                                                            "ambient")}),
    "some sets": ({"bounding": list(CAPS), "effective": ["CAP_KILL"]},
                  {"bounding": ["CAP_CHOWN", "CAP_MKNOD"], "effective": ["CAP_KILL"]}),
    "no capabilities named": (None, None),
}


@pytest.mark.parametrize("caps, expected", DROP.values(), ids=DROP.keys())
def test_drop_capabilities(caps, expected):
    spec = base()
    if caps is not None:
        spec["process"]["capabilities"] = caps
    inj = INJ._replace(dropped_capabilities=(m.CHROOT,))
    once = m.drop_capabilities(copy.deepcopy(spec), inj)
    assert once["process"].get("capabilities") == expected
    assert m.drop_capabilities(copy.deepcopy(once), inj) == once
    assert m.drop_capabilities(copy.deepcopy(spec), INJ) == spec  # allow_chroot: kept


# new namespaces refused by seccomp rules (refuse_new_namespaces)
X86 = m.seccomp_architectures("x86_64")
NS = m.NAMESPACE_MASK
RULES = list(m.NAMESPACE_RULES)
BIG = ["read", "write", "clone", "clone3", "unshare", "setns", "mount"]


def masked(mask, value=None):
    cond = {"index": 0, "value": mask, "op": "SCMP_CMP_MASKED_EQ"}
    return cond if value is None else {**cond, "valueTwo": value}


NARROWED = {"index": 0, "value": NS, "valueTwo": 0, "op": "SCMP_CMP_MASKED_EQ"}
# the engine's profile (None: none), and the syscalls the runtime gives (ours: the
# runtime's rules, all or those named, at the end)
SECCOMP = {
    "no profile": (None, {"defaultAction": "SCMP_ACT_ALLOW", "architectures": list(X86), "syscalls": RULES}),
    "ALLOW by default, ERRNO rules": (
        {"defaultAction": "SCMP_ACT_ALLOW", "architectures": ["SCMP_ARCH_X86_64"], "flags": ["SECCOMP_FILTER_FLAG_LOG"],
         "syscalls": [{"names": ["reboot", "kexec_load"], "action": "SCMP_ACT_ERRNO"}]},
        {"defaultAction": "SCMP_ACT_ALLOW", "architectures": ["SCMP_ARCH_X86_64"], "flags": ["SECCOMP_FILTER_FLAG_LOG"],
         "syscalls": [{"names": ["reboot", "kexec_load"], "action": "SCMP_ACT_ERRNO"}] + RULES}),
    "ERRNO by default, an allowlist with unshare (podman's)": (
        {"defaultAction": "SCMP_ACT_ERRNO", "defaultErrnoRet": 38, "architectures": list(X86),
         "syscalls": [{"names": BIG, "action": "SCMP_ACT_ALLOW", "args": [], "comment": ""},
                      {"names": ["setns"], "action": "SCMP_ACT_ERRNO", "errnoRet": 1}]},
        {"defaultAction": "SCMP_ACT_ERRNO", "defaultErrnoRet": 38, "architectures": list(X86),
         "syscalls": [{"names": ["read", "write", "mount"], "action": "SCMP_ACT_ALLOW", "args": [], "comment": ""},
                      {"names": ["clone", "unshare"], "action": "SCMP_ACT_ALLOW", "args": [NARROWED], "comment": ""}]
         + RULES}),  # its setns rule is one of the runtime's: it goes where they go
    "Docker's": (
        {"defaultAction": "SCMP_ACT_ERRNO", "defaultErrnoRet": 1,
         "syscalls": [{"names": ["read", "write"], "action": "SCMP_ACT_ALLOW"},
                      {"names": ["clone"], "action": "SCMP_ACT_ALLOW", "args": [masked(2114060288)]},
                      {"names": ["clone3"], "action": "SCMP_ACT_ERRNO", "errnoRet": 38}]},
        {"defaultAction": "SCMP_ACT_ERRNO", "defaultErrnoRet": 1,
         "syscalls": [{"names": ["read", "write"], "action": "SCMP_ACT_ALLOW"},
                      {"names": ["clone"], "action": "SCMP_ACT_ALLOW", "args": [masked(2114060288)]}]
         + RULES}),  # its clone rule kept as it is; its clone3 rule is one of the runtime's
    "refuses already (unconditionally, or on our condition)": (
        {"defaultAction": "SCMP_ACT_LOG",
         "syscalls": [{"names": ["unshare", "setns"], "action": "SCMP_ACT_KILL_PROCESS"},
                      {"names": ["clone"], "action": "SCMP_ACT_ERRNO", "errnoRet": 38,
                       "args": [masked(0x10000000, 0x10000000)]}]},
        {"defaultAction": "SCMP_ACT_LOG",
         "syscalls": [{"names": ["unshare", "setns"], "action": "SCMP_ACT_KILL_PROCESS"},
                      {"names": ["clone"], "action": "SCMP_ACT_ERRNO", "errnoRet": 38,
                       "args": [masked(0x10000000, 0x10000000)]}]
         + [r for r in RULES if r["names"][0] == "clone3"
            or (r["names"] == ["clone"] and r["args"][0]["value"] != 0x10000000)]}),
    "conditions on other arguments, or that exclude namespaces": (
        {"defaultAction": "SCMP_ACT_ERRNO",
         "syscalls": [{"names": ["clone"], "action": "SCMP_ACT_ALLOW",
                       "args": [{"index": 2, "value": 0, "op": "SCMP_CMP_EQ"}]},
                      {"names": ["unshare"], "action": "SCMP_ACT_NOTIFY",
                       "args": [{"index": 0, "value": 0x400, "op": "SCMP_CMP_EQ"}]},
                      {"names": ["unshare"], "action": "SCMP_ACT_TRACE",
                       "args": [{"index": 0, "value": 0x200, "op": "SCMP_CMP_EQ"},
                                {"index": 0, "value": 0x20000, "op": "SCMP_CMP_LT"}]}]},
        {"defaultAction": "SCMP_ACT_ERRNO",
         "syscalls": [{"names": ["clone"], "action": "SCMP_ACT_ALLOW",
                       "args": [{"index": 2, "value": 0, "op": "SCMP_CMP_EQ"}, NARROWED]},
                      {"names": ["unshare"], "action": "SCMP_ACT_NOTIFY",
                       "args": [{"index": 0, "value": 0x400, "op": "SCMP_CMP_EQ"}]},
                      {"names": ["unshare"], "action": "SCMP_ACT_TRACE",
                       "args": [{"index": 0, "value": 0x200, "op": "SCMP_CMP_EQ"},
                                {"index": 0, "value": 0x20000, "op": "SCMP_CMP_LT"}]}] + RULES}),
}


@pytest.mark.parametrize("profile, expected", SECCOMP.values(), ids=SECCOMP.keys())
def test_refuse_new_namespaces(profile, expected):
    spec = base()
    if profile is not None:
        spec["linux"]["seccomp"] = copy.deepcopy(profile)
    inj = INJ._replace(no_new_namespaces=X86)
    once = m.refuse_new_namespaces(copy.deepcopy(spec), inj)
    assert once["linux"]["seccomp"] == expected
    assert {k: v for k, v in once.items() if k != "linux"} == {k: v for k, v in spec.items() if k != "linux"}
    assert m.refuse_new_namespaces(copy.deepcopy(once), inj) == once
    assert m.refuse_new_namespaces(copy.deepcopy(spec), INJ) == spec  # allow_user_namespaces: untouched
    for rule in once["linux"]["seccomp"]["syscalls"]:  # as runc reads a rule
        assert rule["names"] and all(isinstance(n, str) for n in rule["names"])
        assert rule["action"].startswith("SCMP_ACT_")
        assert all(set(a) <= {"index", "value", "valueTwo", "op"} for a in rule.get("args") or [])
    assert m.apply(copy.deepcopy(once), inj) == m.apply(copy.deepcopy(spec), inj)
    jsonschema.validate(m.apply(copy.deepcopy(spec), inj), SCHEMA)


def test_the_runtimes_rules():
    """clone and unshare with each namespace flag (Docker's mask, flag by flag) EPERM,
    setns EPERM, clone3 ENOSYS."""
    flagged = [(r["names"][0], r["args"][0]["value"]) for r in RULES if r.get("args")]
    assert flagged == [(n, f) for n in ("clone", "unshare") for f in m.NAMESPACE_FLAGS.values()]
    assert all(r["args"] == [masked(f, f)] and r["errnoRet"] == 1 for r in RULES if r.get("args")
               for f in [r["args"][0]["value"]])
    assert NS == 2114060288 == sum(m.NAMESPACE_FLAGS.values())
    assert [(r["names"], r["errnoRet"]) for r in RULES if not r.get("args")] == [(["setns"], 1), (["clone3"], 38)]


UNNARROWABLE = {
    "NE on the flags": [{"index": 0, "value": 0, "op": "SCMP_CMP_NE"}],
    "a mask short of a namespace flag": [masked(NS & ~0x10000000, 0)],
    "two conditions on the flags, one that lets them through (runc ORs them)": [
        {"index": 0, "value": 0, "op": "SCMP_CMP_EQ"}, {"index": 0, "value": 0x10000000, "op": "SCMP_CMP_EQ"}],
    "two on the flags and one elsewhere (runc ORs all three)": [
        {"index": 0, "value": 0, "op": "SCMP_CMP_EQ"}, {"index": 0, "value": 1, "op": "SCMP_CMP_EQ"},
        {"index": 1, "value": 0, "op": "SCMP_CMP_EQ"}],
}


@pytest.mark.parametrize("args", UNNARROWABLE.values(), ids=UNNARROWABLE.keys())
def test_a_rule_that_cannot_be_narrowed_is_refused(args):
    from hami_runtime.errors import HamiError
    profile = {"defaultAction": "SCMP_ACT_ERRNO",
               "syscalls": [{"names": ["read"], "action": "SCMP_ACT_ALLOW"},
                            {"names": ["unshare"], "action": "SCMP_ACT_ALLOW", "args": args}]}
    with pytest.raises(HamiError, match="cannot narrow to exclude new namespaces") as refused:
        m.without_new_namespaces(profile, X86)
    assert refused.value.field == "linux.seccomp.syscalls[1]"


@pytest.mark.parametrize("profile", ["allow", {"syscalls": {"names": ["clone"]}}, {"syscalls": [["clone"]]},
                                     {"syscalls": [{"names": "clone"}]}, {"syscalls": [{"names": ["x"], "args": [0]}]}])
def test_what_is_not_a_profile_is_refused(profile):
    from hami_runtime.errors import HamiError
    with pytest.raises(HamiError):
        m.without_new_namespaces(profile, X86)


def test_seccomp_architectures():
    assert m.seccomp_architectures("x86_64") == ("SCMP_ARCH_X86_64", "SCMP_ARCH_X86", "SCMP_ARCH_X32")
    assert m.seccomp_architectures("aarch64") == m.seccomp_architectures("arm64") == ("SCMP_ARCH_AARCH64",
                                                                                        "SCMP_ARCH_ARM")
    from hami_runtime.errors import HamiError
    with pytest.raises(HamiError, match="allow_user_namespaces"):
        m.seccomp_architectures("s390x")


SYS_ADMIN_SETS = {
    "bounding only": ({"bounding": ["CAP_CHOWN", "CAP_SYS_ADMIN"], "effective": ["CAP_CHOWN"]}, ["bounding"]),
    "every set": ({k: ["CAP_SYS_ADMIN"] for k in ("bounding", "effective", "permitted")},
                  ["bounding", "effective", "permitted"]),
    "ambient only": ({"ambient": ["CAP_SYS_ADMIN"]}, ["ambient"]),
    "none": ({k: list(CAPS) for k in ("bounding", "effective")}, []),
    "no capabilities named": (None, []),
}


@pytest.mark.parametrize("caps, expected", SYS_ADMIN_SETS.values(), ids=SYS_ADMIN_SETS.keys())
def test_sys_admin_sets(caps, expected):
    spec = base()
    if caps is not None:
        spec["process"]["capabilities"] = caps
    assert m.sys_admin_sets(spec) == expected
