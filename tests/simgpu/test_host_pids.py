"""NVML names processes by their pid in the host's pid namespace, as a real driver
does, also those in a pid namespace of their own (a container), which learn it from
the pid service beside the state file. Without the service a reader in the host's
namespace finds that pid in /proc itself (sim_pids.c); the process and its own
namespace go on naming it by its own pid."""
import contextlib
import json
import subprocess
import sys

import pytest

from tests.conftest import PidService
from tests.simgpu.conftest import script

INSIDE = script("""
    import pynvml
    c = Cuda(); c.init(); c.alloc(64 << 20); c.kernel(20000); c.sync()
    time.sleep(0.15)                      # NVML samples it once its period is recorded
    pynvml.nvmlInit()
    h = pynvml.nvmlDeviceGetHandleByIndex(0)
    seen = [p.pid for p in pynvml.nvmlDeviceGetComputeRunningProcesses(h)]
    sampled = [s.pid for s in pynvml.nvmlDeviceGetProcessUtilization(h, 0)]
    print(json.dumps({"own": os.getpid(), "listed": seen, "sampled": sampled}), flush=True)
    wait_for_stdin_close()
""").replace("import ctypes,", "import json, ctypes,")

HOST = script("""
    import pynvml
    pynvml.nvmlInit()
    h = pynvml.nvmlDeviceGetHandleByIndex(0)
    print(json.dumps({"listed": [p.pid for p in pynvml.nvmlDeviceGetComputeRunningProcesses(h)],
                      "sampled": [s.pid for s in pynvml.nvmlDeviceGetProcessUtilization(h, 0)]}))
""").replace("import ctypes,", "import json, ctypes,")


def in_own_pid_namespace(env):
    """The scenario in a pid namespace of its own; (its report, its pid on the host)."""
    proc = subprocess.Popen(["unshare", "--pid", "--fork", "--mount-proc", sys.executable, "-c", INSIDE],
                            env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    line = proc.stdout.readline()
    assert line, "the scenario in its own pid namespace failed"
    children = subprocess.run(["pgrep", "-P", str(proc.pid)], capture_output=True, text=True).stdout.split()
    return proc, json.loads(line), int(children[0])


@pytest.mark.parametrize("service", [True, False], ids=["service", "no service"])
def test_a_process_in_another_pid_namespace_is_named_as_the_host_names_it(tmp_path, sim_env, run_py, service):
    conf = tmp_path / "sim.conf"
    conf.write_text("util_period_ms = 100\n")
    sim_env["HAMI_SIM_CONFIG"] = str(conf)
    with PidService(tmp_path) if service else contextlib.nullcontext():
        proc, inside, on_host = in_own_pid_namespace(sim_env)
        try:
            host = json.loads(run_py(HOST))
        finally:
            proc.stdin.close()
            proc.wait(timeout=30)
            proc.stdout.close()
    named = on_host if service else inside["own"]
    assert inside["own"] != on_host  # its namespace numbers it apart
    assert inside["listed"] == inside["sampled"] == [named]
    assert host["listed"] == host["sampled"] == [on_host]
