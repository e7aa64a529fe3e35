"""Many processes, SIGKILL anywhere (inside the state lock included), other pid namespaces."""
import shutil
import signal
import subprocess
import time

import pytest

from tests.simgpu.conftest import MIB

TOTAL = 16384 * MIB
CONTEXT = 300 * MIB

FREE_NOW = "c = Cuda(); c.init(0); print(c.mem_info()[0])"


def test_concurrent_allocators_never_overcommit(spawn_py, run_py):
    grabbers = [spawn_py("""
        c = Cuda(); c.init(0); print('ready', flush=True); os.read(0, 1)
        got = 0
        while c.alloc_rc(256 << 20) == 0:
            got += 256
        print(got, flush=True); wait_for_stdin_close()
    """) for _ in range(6)]
    for g in grabbers:
        g.stdin.write("g")
        g.stdin.flush()
    got = [int(g.stdout.readline()) * MIB for g in grabbers]
    assert sum(got) + 6 * CONTEXT <= TOTAL
    assert TOTAL - (sum(got) + 6 * CONTEXT) < 256 * MIB  # and the device was filled
    for g in grabbers:
        g.kill()
        g.wait(timeout=10)
    assert int(run_py(FREE_NOW)) == TOTAL - CONTEXT


def test_killed_inside_the_state_lock_blocks_nobody(run_py, sim_env):
    # A process takes the state's robust mutex itself and is killed holding it.
    proc = run_py("""
        import mmap
        c = Cuda(); c.init(0); c.alloc(1 << 30)
        with open(os.environ["HAMI_SIM_STATE"], "r+b") as f:
            m = mmap.mmap(f.fileno(), 4096)
        libc = ctypes.CDLL(None)
        lock = ctypes.addressof(ctypes.c_char.from_buffer(m, 24))  # after magic, version, devices, memory
        print(libc.pthread_mutex_lock(ctypes.c_void_p(lock)), flush=True)
        os.kill(os.getpid(), 9)
    """, check=False)
    assert proc.returncode == -signal.SIGKILL and proc.stdout.strip() == "0"
    assert int(run_py(FREE_NOW, timeout=10)) == TOTAL - CONTEXT


def test_random_kills_during_churn_leak_nothing(spawn_py, run_py):
    for _ in range(3):
        churners = [spawn_py("""
            import random
            c = Cuda(); c.init(0); print('ready', flush=True)
            held = []
            while True:
                if len(held) >= 20 or (held and random.random() < 0.5):
                    c.free(held.pop())
                else:
                    held.append(c.alloc(random.randint(1, 64) << 20))
        """) for _ in range(3)]
        time.sleep(0.2)
        for ch in churners:
            ch.send_signal(signal.SIGKILL)
            ch.wait(timeout=10)
    assert int(run_py(FREE_NOW, timeout=10)) == TOTAL - CONTEXT


@pytest.mark.skipif(shutil.which("unshare") is None, reason="needs unshare")
def test_other_pid_namespace_is_alive_while_it_beats(spawn_py, run_py, sim_env, tmp_path):
    config = tmp_path / "sim.conf"
    config.write_text("stale_seconds = 1\n")
    env = dict(sim_env, HAMI_SIM_CONFIG=str(config))
    probe = subprocess.run(["unshare", "-p", "-f", "--mount-proc", "true"], capture_output=True, timeout=10)
    if probe.returncode != 0:
        pytest.skip("cannot create a pid namespace here")
    import sys
    from tests.simgpu.conftest import script
    holder = subprocess.Popen(["unshare", "-p", "-f", "--kill-child", "--mount-proc", sys.executable, "-c", script(
        "c = Cuda(); c.init(0); c.alloc(1 << 30); print('ready', flush=True); wait_for_stdin_close()")],
        env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "ready"
        time.sleep(1.5)  # longer than stale_seconds: the heartbeat keeps it alive
        assert int(run_py(FREE_NOW, env=env)) == TOTAL - 2 * CONTEXT - (1 << 30)
        # kill the namespace's init: everything in it dies, nobody there says goodbye
        holder.send_signal(signal.SIGKILL)
        holder.wait(timeout=10)
        time.sleep(1.5)
        assert int(run_py(FREE_NOW, env=env)) == TOTAL - CONTEXT
    finally:
        if holder.poll() is None:
            holder.kill()
        holder.wait(timeout=10)
        holder.stdin.close()
        holder.stdout.close()
