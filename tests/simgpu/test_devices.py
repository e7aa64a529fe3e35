"""Device shape, config file, NVML and pynvml views of the simulated GPU."""
import ast
import subprocess

import pytest

from tests.simgpu.conftest import MIB, SIM_BIN

SHAPE = """
c = Cuda(); c.call("cuInit", 0)
n = ctypes.c_int(); c.call("cuDeviceGetCount", ctypes.byref(n))
for d in range(n.value):
    name = ctypes.create_string_buffer(96); c.call("cuDeviceGetName", name, 96, d)
    total = ctypes.c_size_t(); c.call("cuDeviceTotalMem_v2", ctypes.byref(total), d)
    sms = ctypes.c_int(); c.call("cuDeviceGetAttribute", ctypes.byref(sms), 16, d)
    uuid = ctypes.create_string_buffer(16); c.call("cuDeviceGetUuid_v2", uuid, d)
    bus = ctypes.create_string_buffer(32); c.call("cuDeviceGetPCIBusId", bus, 32, d)
    print(d, name.value.decode(), total.value, sms.value, uuid.raw.hex(), bus.value.decode(), sep="|")
"""

NVML = """
import pynvml
pynvml.nvmlInit()
for d in range(pynvml.nvmlDeviceGetCount()):
    h = pynvml.nvmlDeviceGetHandleByIndex(d)
    assert pynvml.nvmlDeviceGetIndex(pynvml.nvmlDeviceGetHandleByUUID(pynvml.nvmlDeviceGetUUID(h))) == d
    print(d, pynvml.nvmlDeviceGetName(h), pynvml.nvmlDeviceGetMemoryInfo(h).total,
          pynvml.nvmlDeviceGetUUID(h).replace("GPU-", "").replace("-", ""),
          pynvml.nvmlDeviceGetPciInfo_v3(h).busIdLegacy.upper(), pynvml.nvmlDeviceGetMinorNumber(h), sep="|")
print("driver", pynvml.nvmlSystemGetDriverVersion(), pynvml.nvmlSystemGetCudaDriverVersion(), sep="|")
pynvml.nvmlShutdown()
"""


def shapes(run_py, env=None):
    cuda = [line.split("|") for line in run_py(SHAPE, env=env).splitlines()]
    nvml = [line.split("|") for line in run_py(NVML, env=env).splitlines()]
    return cuda, nvml


def test_default_shape_is_two_16gib_cards_with_132_sms(run_py):
    cuda, nvml = shapes(run_py)
    assert len(cuda) == 2
    for d, row in enumerate(cuda):
        assert row[:4] == [str(d), "HAMi Simulated GPU", str(16384 * MIB), "132"]
        # NVML names the same card: UUID bytes, bus id and memory agree with the driver API
        assert nvml[d] == [str(d), "HAMi Simulated GPU", str(16384 * MIB), row[4], row[5], str(d)]
    assert cuda[0][4] != cuda[1][4]
    assert nvml[2] == ["driver", "550.54.15", "12040"]


def test_uuids_are_stable_across_runs(run_py):
    assert shapes(run_py)[0] == shapes(run_py)[0]


def test_config_file_sets_the_shape(run_py, sim_env, tmp_path):
    config = tmp_path / "sim.conf"
    config.write_text("# a small machine\ndevices = 3\nmemory_mib = 4096\nsms = 20\nname = Tiny GPU\n"
                      "context_mib = 100\ndriver_version = 535.1\ncuda_version = 12020\n")
    env = dict(sim_env, HAMI_SIM_CONFIG=str(config))
    cuda, nvml = shapes(run_py, env)
    assert [row[:4] for row in cuda] == [[str(d), "Tiny GPU", str(4096 * MIB), "20"] for d in range(3)]
    assert nvml[3] == ["driver", "535.1", "12020"]
    out = run_py("c = Cuda(); c.init(2); print(c.mem_info())", env=env)
    assert out.strip() == str(((4096 - 100) * MIB, 4096 * MIB))


@pytest.mark.parametrize("text, message", [
    ("devices = 0\n", "bad value for devices: '0'"),
    ("devices = 99\n", "bad value for devices: '99'"),
    ("memory_mib = lots\n", "bad value for memory_mib: 'lots'"),
    ("colour = red\n", "unknown key 'colour'"),
    ("devices 2\n", "expected 'key = value'"),
    ("memory_mib = 100\ncontext_mib = 200\n", "context_mib 200 must be below memory_mib 100"),
])
def test_bad_config_fails_init_with_one_line(run_py, sim_env, tmp_path, text, message):
    config = tmp_path / "bad.conf"
    config.write_text(text)
    env = dict(sim_env, HAMI_SIM_CONFIG=str(config))
    proc = run_py("""
        c = Cuda(); print(c.rc("cuInit", 0), c.rc("cuDeviceGetCount", ctypes.byref(ctypes.c_int())))
        n = ctypes.CDLL("libnvidia-ml.so.1"); print(n.nvmlInit_v2())
    """, env=env, check=False)
    assert proc.returncode == 0
    assert proc.stdout.split() == ["100", "3", "9"]  # NO_DEVICE, NOT_INITIALIZED, DRIVER_NOT_LOADED
    lines = proc.stderr.strip().splitlines()
    assert len(set(lines)) == 1 and message in lines[0] and str(config) in lines[0]
    assert not (tmp_path / "sim.state").exists()


def test_state_made_for_another_shape_is_refused(run_py, sim_env, tmp_path):
    run_py("Cuda().init()")
    config = tmp_path / "other.conf"
    config.write_text("devices = 1\n")
    proc = run_py("print(Cuda().rc('cuInit', 0))", env=dict(sim_env, HAMI_SIM_CONFIG=str(config)), check=False)
    assert proc.stdout.strip() == "304"
    assert "made for 2 devices x 16384 MiB, config says 1 x 16384 MiB" in proc.stderr


def test_pynvml_loaded_by_absolute_path_uses_the_sim(run_py, sim_env):
    env = dict(sim_env)
    del env["LD_LIBRARY_PATH"]
    lib = SIM_BIN.parent / "lib" / "libnvidia-ml.so.1"
    out = run_py(f"""
        ctypes.CDLL("{lib}", mode=ctypes.RTLD_GLOBAL)
        import pynvml
        pynvml.nvmlInit()
        print(pynvml.nvmlDeviceGetName(pynvml.nvmlDeviceGetHandleByIndex(0)))
    """, env=env)
    assert out.strip() == "HAMi Simulated GPU"


def test_nvidia_smi_query_and_table(run_py, spawn_py, sim_env):
    holder = spawn_py("c = Cuda(); c.init(1); c.alloc(1000 << 20); print('ready', flush=True); wait_for_stdin_close()")
    query = subprocess.run([SIM_BIN / "nvidia-smi", "--query-gpu=index,name,uuid,memory.total,memory.used",
                            "--format=csv,noheader,nounits"], env=sim_env, capture_output=True, text=True,
                           timeout=10)
    assert query.returncode == 0, query.stderr
    rows = [line.split(", ") for line in query.stdout.splitlines()]
    assert [(r[0], r[1], r[3], r[4]) for r in rows] == [("0", "HAMi Simulated GPU", "16384", "0"),
                                                        ("1", "HAMi Simulated GPU", "16384", "1300")]
    assert rows[0][2].startswith("GPU-")
    table = subprocess.run([SIM_BIN / "nvidia-smi"], env=sim_env, capture_output=True, text=True, timeout=10)
    assert table.returncode == 0, table.stderr
    assert "Driver Version: 550.54.15" in table.stdout and "CUDA Version: 12.4" in table.stdout
    assert f"{holder.pid}" in table.stdout and "1300MiB" in table.stdout
    bad = subprocess.run([SIM_BIN / "nvidia-smi", "--query-gpu=index,colour"], env=sim_env, capture_output=True,
                         text=True, timeout=10)
    assert bad.returncode == 1 and "unknown field 'colour'" in bad.stderr


@pytest.mark.parametrize("content, rc, message", [
    # a file left by an older build of the simulator: a fresh machine replaces it
    ((0x3154535f4d495348).to_bytes(8, "little") + (2).to_bytes(4, "little") + bytes(100), "0",
     "replacing a state file of version 2"),
    (b"not a state file at all", "304", "not a state file of version"),
])
def test_foreign_state_files(run_py, sim_env, tmp_path, content, rc, message):
    (tmp_path / "sim.state").write_bytes(content)
    proc = run_py("print(Cuda().rc('cuInit', 0))", check=False)
    assert proc.stdout.strip() == rc and message in proc.stderr


def test_nvml_start_costs_what_the_config_says(run_py, sim_env, tmp_path):
    """nvml_init_us: an init that finds NVML not in force; nvml_attach_us: a GPU's first
    handle in the process, which a second thread asking for it at once waits for too."""
    (tmp_path / "sim.conf").write_text("nvml_init_us = 150000\nnvml_attach_us = 100000\n")
    out = run_py("""
        import threading
        n = ctypes.CDLL("libnvidia-ml.so.1")
        def timed(call, *args):
            t = time.monotonic(); assert call(*args) == 0; return time.monotonic() - t
        first, again = timed(n.nvmlInit_v2), timed(n.nvmlInit_v2)
        handles = [ctypes.c_void_p() for _ in range(3)]
        waits = [0.0, 0.0]
        def get(i):
            waits[i] = timed(n.nvmlDeviceGetHandleByIndex_v2, 0, ctypes.byref(handles[i]))
        threads = [threading.Thread(target=get, args=(i,)) for i in range(2)]
        for t in threads: t.start()
        for t in threads: t.join()
        later = timed(n.nvmlDeviceGetHandleByIndex_v2, 0, ctypes.byref(handles[2]))
        for _ in range(2): n.nvmlShutdown()
        restarted = timed(n.nvmlInit_v2)
        reattached = timed(n.nvmlDeviceGetHandleByIndex_v2, 0, ctypes.byref(handles[2]))
        print(first, again, *waits, later, restarted, reattached)
    """, env=dict(sim_env, HAMI_SIM_CONFIG=str(tmp_path / "sim.conf")))
    first, again, wait0, wait1, later, restarted, reattached = map(float, out.split())
    assert first >= 0.15 and again < 0.05 and restarted >= 0.15
    assert min(wait0, wait1) >= 0.1 and later < 0.05 and reattached >= 0.1


# A handle of the last of four GPUs: NVML initialises that GPU alone by index or PCI bus
# id, and by UUID each GPU it searches on the way (NVML's documentation of each call).
@pytest.mark.parametrize("call, key, attached", [
    ("nvmlDeviceGetHandleByIndex_v2", "index", 1),
    ("nvmlDeviceGetHandleByPciBusId_v2", "bus_id", 1),
    ("nvmlDeviceGetHandleByUUID", "uuid", 4),
])
def test_nvml_initialises_the_gpus_a_handle_call_reaches(run_py, sim_env, tmp_path, call, key, attached):
    (tmp_path / "sim.conf").write_text("devices = 4\nnvml_attach_us = 200000\n")
    env = dict(sim_env, HAMI_SIM_CONFIG=str(tmp_path / "sim.conf"))
    keys = run_py("""
        n = ctypes.CDLL("libnvidia-ml.so.1")
        assert n.nvmlInit_v2() == 0
        handle, text = ctypes.c_void_p(), ctypes.create_string_buffer(96)
        assert n.nvmlDeviceGetHandleByIndex_v2(3, ctypes.byref(handle)) == 0
        assert n.nvmlDeviceGetUUID(handle, text, 96) == 0
        uuid = text.value
        assert Cuda().rc("cuInit", 0) == 0
        cuda = ctypes.CDLL("libcuda.so.1")
        assert cuda.cuDeviceGetPCIBusId(text, 96, 3) == 0
        print(repr({"index": 3, "uuid": uuid, "bus_id": text.value}))
    """, env=env)
    out = run_py(f"""
        n = ctypes.CDLL("libnvidia-ml.so.1")
        assert n.nvmlInit_v2() == 0
        handle = ctypes.c_void_p()
        started = time.monotonic()
        assert n.{call}({ast.literal_eval(keys)[key]!r}, ctypes.byref(handle)) == 0
        print(time.monotonic() - started)
    """, env=env)
    assert attached * 0.2 <= float(out) < (attached + 1) * 0.2  # one sleep a GPU initialised
