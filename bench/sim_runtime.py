"""What the runtime benchmarks share: the simulated GPU's runtime config that
`make build sim venv` writes, copied into a benchmark's temp dir so that its
allocation state stays there too."""
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SIM_CONFIG = ROOT / "build" / "sim" / "hami.toml"
# The simulated NVML as slow as an H200 node's (tests/simgpu/README.md's keys, µs): its
# nvmlInit (10.0 ms alone, 11.2 in a cold create) and its first device access (6.2 ms),
# measured there on 2026-11-28 (bench/gpu/init_costs.py, a cold create's trace).
SLOW_NVML = {"nvml_init_us": 11000, "nvml_attach_us": 6000}


def slow_nvml_env(work: Path, **more) -> dict:
    """HAMI_SIM_CONFIG naming work/sim.conf, which holds SLOW_NVML and `more` (other keys)."""
    (work / "sim.conf").write_text("".join(f"{k} = {v}\n" for k, v in {**SLOW_NVML, **more}.items()))
    return {"HAMI_SIM_CONFIG": str(work / "sim.conf")}


def sim_config_missing() -> bool:
    """True, after saying what to build, when the simulated GPU's config is not there."""
    if SIM_CONFIG.exists():
        return False
    print("run `make build sim venv` first", file=sys.stderr)
    return True


def private_config(work: Path) -> Path:
    """Writes work/hami.toml: the simulated GPU's config, state dir moved to work/state."""
    config = work / "hami.toml"
    config.write_text(SIM_CONFIG.read_text().replace(
        str(ROOT / "build" / "sim" / "state"), str(work / "state")))
    return config
