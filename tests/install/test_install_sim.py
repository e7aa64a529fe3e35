"""make install SIM=1: an installed runtime wired to the simulated GPU
(packaging/install_sim.py), whose hamictl doctor passes with no environment;
make uninstall removes it all."""
import subprocess

from tests.runtime.node import TIMEOUT
from .conftest import Install, make


def files_under(top):
    return sorted(p for p in top.rglob("*") if p.is_symlink() or p.is_file())


def test_an_install_wired_to_the_simulator_passes_doctor_and_uninstalls(tmp_path):
    inst = Install(tmp_path)
    where = (f"PREFIX={inst.prefix}", f"SYSCONFDIR={inst.sysconfdir}")
    proc = make("install", "SIM=1", *where)
    assert proc.returncode == 0, proc.stdout[-4000:]
    sim = inst.lib / "sim"
    for path in ("lib/libcuda.so.1", "lib/libnvidia-ml.so.1", "bin/nvidia-smi", "etc/ld.so.cache",
                 "proc-devices", "mig-minors"):
        assert (sim / path).is_file(), path
    assert (sim / "dev").is_dir() and not any((sim / "dev").iterdir())
    config = inst.config.read_text()
    assert f'driver_root = "{sim}"' in config and f'nvml_library = "{sim}/lib/libnvidia-ml.so.1"' in config

    # no HAMI_CONFIG: the installed config; the simulator's state this test's own
    env = {"HAMI_SIM_STATE": str(tmp_path / "gpu.state")}
    doctor = subprocess.run([inst.bin / "hamictl", "doctor"], env=env, capture_output=True, text=True,
                            timeout=TIMEOUT, cwd="/")
    assert doctor.returncode == 0, doctor.stdout + doctor.stderr
    assert f"config: {inst.config}\n" in doctor.stdout
    assert "GPUs: 2: 0 HAMi Simulated GPU 16384 MiB, 1 HAMi Simulated GPU 16384 MiB\n" in doctor.stdout
    smi = subprocess.run([sim / "bin" / "nvidia-smi", "-L"], capture_output=True, text=True, timeout=TIMEOUT,
                         env={**env, "LD_LIBRARY_PATH": str(sim / "lib")})
    assert smi.returncode == 0 and smi.stdout.count("HAMi Simulated GPU") == 2, smi.stdout + smi.stderr

    proc = make("uninstall", *where)
    assert proc.returncode == 0, proc.stdout[-4000:]
    assert files_under(tmp_path / "prefix") == [] and not inst.config.exists()
