"""What the runtime benchmarks share: the simulated GPU's runtime config that
`make build sim venv` writes, copied into a benchmark's temp dir so that its
allocation state stays there too."""
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SIM_CONFIG = ROOT / "build" / "sim" / "hami.toml"


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
