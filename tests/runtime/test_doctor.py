"""hamictl doctor as the node's health check: exit 0 on a healthy node (one
where nothing was ever allocated included, which it says), 1 only for faults it
names; notes (what the next create or delete frees) are no fault."""
import json

import pytest

from tests.conftest import ROOT

GPU = {"hami.io/gpumem": "1000"}
GPU0 = "GPU-453c5d90-9eaf-43fa-be71-c8ae8fc44d65"  # the simulator's first


def doctor(node, *args):
    proc = node.hamictl("doctor", *args)
    shown = json.loads(node.hamictl("doctor", "--json", *args).stdout) if "--repair" not in args else None
    return proc, shown


def fresh(node):
    pass


def live(node):
    assert node.create("live", node.bundle("live", GPU)).returncode == 0


def container_gone(node):
    """An entry whose container runc no longer has: dead, freed by the next create or delete."""
    node.leave_dead_entry(GPU0)


HEALTHY = [
    # (case, what was done to the node, the state line, a note)
    ("fresh", fresh, "no state dir yet: nothing was ever allocated on this node", None),
    ("live", live, "state is sound, 1 allocation(s)", None),
    ("container-gone", container_gone, "state is sound, 1 allocation(s)",
     "its container is gone; the next create or delete frees it"),
]


@pytest.mark.parametrize("case,make,state,note", HEALTHY, ids=[c[0] for c in HEALTHY])
def test_healthy(node, case, make, state, note):
    make(node)
    proc, shown = doctor(node)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0] == f"config: {node.config}" and lines[-1] == f"{node.state_dir}: {state}"
    assert [x for x in lines if x.startswith("GPUs: ")] == [
        "GPUs: 2: 0 HAMi Simulated GPU 16384 MiB, 1 HAMi Simulated GPU 16384 MiB"]
    assert lines[lines.index("GPUs: 2: 0 HAMi Simulated GPU 16384 MiB, 1 HAMi Simulated GPU 16384 MiB")
                 + 1] == ALL_ALONE[0][1]
    assert not [x for x in lines if x.startswith("fault:")]
    assert shown["healthy"] is True and shown["faults"] == [] and shown["gpus"] == 2
    assert shown["checks"]["state"] == f"{node.state_dir}: {state}"
    assert shown["checks"]["config"] == str(node.config)
    if note:
        assert any(note in x for x in shown["notes"]) and f"note: " in proc.stdout
    else:
        assert shown["notes"] == []


ALL_ALONE = [
    # (config overrides, the line: what NVIDIA_VISIBLE_DEVICES=all alone gets)
    ({}, "NVIDIA_VISIBLE_DEVICES=all: a 10 % slice of each GPU (1638 MiB of 16384 MiB), not the whole "
     'card (1/split_count of the card, split_count = 10; config visible_devices_alone = "whole" gives '
     "whole cards)"),
    ({"split_count": 4, "memory_scaling": 2.0},
     "NVIDIA_VISIBLE_DEVICES=all: a 25 % slice of each GPU (8192 MiB of 16384 MiB), not the whole "
     'card (1/split_count of the card, split_count = 4; config visible_devices_alone = "whole" gives '
     "whole cards)"),
    ({"default_memory_mib": 4096},
     "NVIDIA_VISIBLE_DEVICES=all: 4096 MiB of each GPU, not the whole card (config default_memory_mib "
     '= 4096; config visible_devices_alone = "whole" gives whole cards)'),
    ({"visible_devices_alone": "whole"},
     'NVIDIA_VISIBLE_DEVICES=all: every GPU, whole (config visible_devices_alone = "whole")'),
    ({"visible_devices_alone": "none"},
     "NVIDIA_VISIBLE_DEVICES=all: no GPU: such a create is refused (config visible_devices_alone = "
     '"none")'),
]


@pytest.mark.parametrize("overrides,line", ALL_ALONE)
def test_what_visible_devices_all_gets_is_said_and_no_fault(node, overrides, line):
    """Someone coming from NVIDIA's runtime expects whole cards: one line says
    what a stock CUDA image gets on this node, under its config."""
    node.write_config(**overrides)
    proc, shown = doctor(node)
    assert proc.returncode == 0, proc.stdout
    assert [x for x in proc.stdout.splitlines() if x.startswith("NVIDIA_VISIBLE_DEVICES=")] == [line]
    assert shown["checks"]["NVIDIA_VISIBLE_DEVICES=all"] == line.split(": ", 1)[1]


def corrupt_state(node):
    node.state_dir.mkdir()
    (node.state_dir / "allocations.json").write_text("{not json")


FAULTS = [
    # (case, config overrides, what else is done, the fault line names)
    ("libvgpu-missing", {"libvgpu": "/nonexistent/libvgpu.so"}, None,
     "config libvgpu='/nonexistent/libvgpu.so': file not found (set in "),
    ("runtime-missing", {"runtime": ["/nonexistent/runc"]}, None,
     "config runtime='/nonexistent/runc': no executable OCI runtime found (set in "),
    ("nvml-missing", {"nvml_library": "/nonexistent/libnvidia-ml.so.1"}, None,
     "GPUs: not read: config nvml_library='/nonexistent/libnvidia-ml.so.1': cannot load"),
    ("state-corrupt", {}, corrupt_state, "allocations.json: not JSON"),
    ("log-unwritable", {"log_file": "/nonexistent/dir/hami.log"}, None,
     "config log_file='/nonexistent/dir/hami.log': cannot be written (/nonexistent/dir does not exist) "
     "(set in "),
]


@pytest.mark.parametrize("case,overrides,make,fault", FAULTS, ids=[c[0] for c in FAULTS])
def test_faults_are_named_and_exit_1(node, case, overrides, make, fault):
    node.write_config(**overrides)
    if make:
        make(node)
    proc, shown = doctor(node)
    assert proc.returncode == 1
    faults = [x for x in proc.stdout.splitlines() if x.startswith("fault: ")]
    assert len(faults) == 1 and fault in faults[0], proc.stdout
    assert shown["healthy"] is False and shown["faults"] == [faults[0].removeprefix("fault: ")]


def test_an_unreadable_config_is_a_fault(node):
    node.config.write_text("split_count = 0\n")
    proc, shown = doctor(node)
    assert proc.returncode == 1 and "fault: config split_count='0'" in proc.stdout
    assert shown["healthy"] is False and shown["checks"] == {}


def test_repair_leaves_a_healthy_node(node):
    corrupt_state(node)
    repaired = node.hamictl("doctor", "--repair")
    assert repaired.returncode == 0 and "moved aside" in repaired.stdout
    proc, shown = doctor(node)
    assert proc.returncode == 0 and shown["healthy"] is True and shown["allocations"] == 0


def test_the_probe_example_runs_doctor(node):
    """examples/node-problem-detector: its rule runs `hamictl doctor`, whose exit
    status is the plugin protocol's (0 healthy, 1 a problem) and whose first
    line, all the probe keeps, names the fault."""
    example = json.loads((ROOT / "examples" / "node-problem-detector" / "hami-doctor.json").read_text())
    [rule] = example["rules"]
    assert rule["path"].endswith("/hamictl") and rule["args"] == ["doctor"]
    keep = example["pluginConfig"]["max_output_length"]
    assert node.hamictl(*rule["args"]).returncode == 0
    node.write_config(libvgpu="/nonexistent/libvgpu.so")
    proc = node.hamictl(*rule["args"])
    assert proc.returncode == 1
    assert proc.stdout[:keep].startswith("fault: config libvgpu='/nonexistent/libvgpu.so': file not found")
