"""Every `hamictl ... --json` in one style (json_output: two-space indent, keys
sorted), and the same facts of one container agreeing between commands."""
import json

from hami_runtime.tools import json_output

MIB = 1 << 20


def as_json(node, *args):
    proc = node.hamictl(*args, "--json")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == json_output.dumps(json.loads(proc.stdout)) + "\n", args
    return json.loads(proc.stdout)


def test_one_style_and_the_same_facts(node):
    bundle = node.bundle("c1", {"hami.io/gpumem": "3000", "hami.io/gpucores": "30"})
    assert node.runtime("run", "--detach", "--bundle", str(bundle), "c1").returncode == 0
    updated = as_json(node, "update", "c1", "--gpucores", "40")
    [row] = as_json(node, "ps")
    [device] = updated["devices"]
    # the pid ps shows (the createRuntime hook's record), not the entry's placeholder
    assert row["pid"] > 0 and updated["pid"] == row["pid"]
    assert (row["container"], row["runc_root"], row["gpu"], row["uuid"], row["memory_mib"], row["cores"]) == \
        (updated["id"], updated["runc_root"], device["index"], device["uuid"], device["mem_mib"],
         device["cores"]) == ("c1", str(node.runc_root), row["gpu"], row["uuid"], 3000, 40)
    [shown] = as_json(node, "top", "--interval", "0")["containers"]
    [view] = shown["devices"]
    assert (shown["id"], shown["name"], shown["runc_root"]) == ("c1", updated["name"], updated["runc_root"])
    assert (view["index"], view["uuid"], view["mem_limit_bytes"], view["sm_limit_pct"]) == \
        (device["index"], device["uuid"], 3000 * MIB, 40)
    gpus = {g["uuid"]: g for g in as_json(node, "gpus")}
    assert (gpus[device["uuid"]]["memory_allocated_mib"], gpus[device["uuid"]]["cores_allocated"],
            gpus[device["uuid"]]["slots_used"]) == (3000, 40, 1)
    health = as_json(node, "doctor")
    assert health["healthy"] is True and health["allocations"] == 1 and health["gpus"] == len(gpus)
