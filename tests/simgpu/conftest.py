"""Fixtures for the simulated driver's tests: a private state file per test and a
runner for scenario scripts in child processes (the driver is never loaded into pytest)."""
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.conftest import SIM, SIM_LIB

HERE = Path(__file__).resolve().parent
MIB = 1 << 20


@pytest.fixture(scope="session", autouse=True)
def built_sim():
    if not (SIM_LIB / "libcuda.so.1").exists():
        pytest.fail("build/sim is missing: run `make sim`")


@pytest.fixture
def sim_env(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HAMI_", "LD_", "CUDA_"))}
    env.update(HAMI_SIM_STATE=str(tmp_path / "sim.state"), LD_LIBRARY_PATH=str(SIM_LIB),
               PYTHONPATH=str(HERE))
    return env


PRELUDE = "import ctypes, os, sys, time\nfrom simcuda import *\n"


def script(body):
    return PRELUDE + textwrap.dedent(body)


@pytest.fixture
def run_py(sim_env):
    """Runs a scenario to completion; returns its stdout (asserting exit 0 unless told)."""
    def run(body, check=True, env=None, timeout=30):
        proc = subprocess.run([sys.executable, "-c", script(body)], env=env or sim_env, capture_output=True,
                              text=True, timeout=timeout)
        if check and proc.returncode != 0:
            raise AssertionError(f"scenario failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
        return proc if not check else proc.stdout
    return run


@pytest.fixture
def spawn_py(sim_env):
    """Starts a scenario in the background; it prints 'ready' when set up. Killed at teardown."""
    procs = []

    def spawn(body, env=None):
        proc = subprocess.Popen([sys.executable, "-c", script(body)], env=env or sim_env, stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        procs.append(proc)
        line = proc.stdout.readline()
        assert line.strip() == "ready", f"helper failed: {line}{proc.stderr.read() if not line else ''}"
        return proc

    yield spawn
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=10)
        for stream in (proc.stdin, proc.stdout, proc.stderr):
            stream.close()


SIM_BIN = SIM / "bin"
SIM_TESTS = SIM / "tests"
