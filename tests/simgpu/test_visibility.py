"""Device visibility follows the device nodes, as with the real driver: with a control
node present only the cards whose /dev/nvidia<minor> exists are seen, renumbered densely."""
import json
import os
import stat
import subprocess

import pytest

from tests.simgpu.conftest import SIM_BIN

NVIDIA_MAJOR = 195

VIEW = """
import json
c = Cuda(); init = c.rc("cuInit", 0)
n = ctypes.c_int(); count_rc = c.rc("cuDeviceGetCount", ctypes.byref(n))
cuda = []
for d in range(n.value if count_rc == 0 else 0):
    uuid = ctypes.create_string_buffer(16); c.call("cuDeviceGetUuid_v2", uuid, d)
    cuda.append(uuid.raw.hex())
import pynvml
pynvml.nvmlInit()
nvml = []
for i in range(pynvml.nvmlDeviceGetCount()):
    h = pynvml.nvmlDeviceGetHandleByIndex(i)
    uuid = pynvml.nvmlDeviceGetUUID(h)
    assert pynvml.nvmlDeviceGetIndex(pynvml.nvmlDeviceGetHandleByUUID(uuid)) == i
    nvml.append([pynvml.nvmlDeviceGetIndex(h), pynvml.nvmlDeviceGetMinorNumber(h),
                 uuid.replace("GPU-", "").replace("-", "")])
print(json.dumps({"init": init, "count_rc": count_rc, "cuda": cuda, "nvml": nvml}))
"""


def node(path, major, minor):
    try:
        os.mknod(path, 0o666 | stat.S_IFCHR, os.makedev(major, minor))
    except PermissionError:
        pytest.skip("creating character nodes needs CAP_MKNOD")


@pytest.fixture
def dev_root(tmp_path):
    """A directory standing for /dev: {"nvidiactl": True, "nvidia1": (major, minor) or "file"}."""
    root = tmp_path / "dev"
    root.mkdir()

    def make(nodes):
        for name, spec in nodes.items():
            if spec == "file":
                (root / name).write_text("")
            else:
                node(root / name, *((NVIDIA_MAJOR, 255) if spec is True else spec))
        return str(root)
    return make


def view(run_py, env):
    return json.loads(run_py(VIEW, env=env))


@pytest.mark.parametrize("config, nodes, visible", [
    ("", {}, [0, 1]),                                                    # host: no control node
    ("", {"nvidia0": (NVIDIA_MAJOR, 0)}, [0, 1]),                        # a node alone changes nothing
    ("", {"nvidiactl": True, "nvidia1": (NVIDIA_MAJOR, 1)}, [1]),
    ("", {"nvidiactl": True, "nvidia0": (NVIDIA_MAJOR, 0), "nvidia1": (NVIDIA_MAJOR, 1)}, [0, 1]),
    ("", {"nvidiactl": True}, []),
    ("", {"nvidiactl": True, "nvidia0": (1, 3), "nvidia1": "file"}, []),  # wrong major, not a node
    ("devices = 4\n", {"nvidiactl": True, "nvidia3": (NVIDIA_MAJOR, 3), "nvidia1": (NVIDIA_MAJOR, 1)}, [1, 3]),
])
def test_visible_cards_follow_device_nodes(run_py, sim_env, tmp_path, dev_root, config, nodes, visible):
    host = dict(sim_env)
    if config:
        (tmp_path / "sim.conf").write_text(config)
        host["HAMI_SIM_CONFIG"] = str(tmp_path / "sim.conf")
    env = dict(host, HAMI_SIM_DEV_ROOT=dev_root(nodes))
    all_cards = view(run_py, host)["cuda"]  # card n's UUID, as the host (no control node) sees it
    seen = view(run_py, env)
    if visible:
        assert (seen["init"], seen["count_rc"]) == (0, 0)
        assert seen["cuda"] == [all_cards[card] for card in visible]
    else:
        # as the real driver: cuInit fails, so nothing else is initialised
        assert (seen["init"], seen["count_rc"]) == (100, 3)  # NO_DEVICE, NOT_INITIALIZED
        smi = subprocess.run([SIM_BIN / "nvidia-smi"], env=env, capture_output=True, text=True, timeout=10)
        assert (smi.returncode, smi.stdout) == (6, "No devices were found\n")
    # NVML: dense indices, the card's own minor number and UUID
    assert seen["nvml"] == [[index, card, all_cards[card]] for index, card in enumerate(visible)]


def test_memory_through_a_visible_device_is_charged_to_its_card(run_py, spawn_py, sim_env, dev_root):
    env = dict(sim_env, HAMI_SIM_DEV_ROOT=dev_root({"nvidiactl": True, "nvidia1": (NVIDIA_MAJOR, 1)}))
    spawn_py("""
        c = Cuda(); c.init(0); c.alloc(1000 << 20)
        print('ready', flush=True); wait_for_stdin_close()
    """, env=env)
    used = """
        import pynvml
        pynvml.nvmlInit()
        print([pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByIndex(i)).used // (1 << 20)
               for i in range(pynvml.nvmlDeviceGetCount())])
    """
    assert run_py(used).strip() == "[0, 1300]"          # the host: context and allocation on card 1
    assert run_py(used, env=env).strip() == "[1300]"     # the container: its only device
    free = run_py("c = Cuda(); c.init(0); print(c.mem_info()[0] // (1 << 20))", env=env)
    assert int(free) == 16384 - 1300 - 300               # a second context on the same card
    query = subprocess.run([SIM_BIN / "nvidia-smi", "--query-gpu=index,uuid,memory.used",
                            "--format=csv,noheader,nounits"], env=env, capture_output=True, text=True, timeout=10)
    assert query.returncode == 0, query.stderr
    host_uuid = run_py("import pynvml; pynvml.nvmlInit(); "
                       "print(pynvml.nvmlDeviceGetUUID(pynvml.nvmlDeviceGetHandleByIndex(1)))").strip()
    assert query.stdout.splitlines() == [f"0, {host_uuid}, 1300"]
