"""Paths every test directory shares."""
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BUILD = ROOT / "build"
SIM = BUILD / "sim"
SIM_LIB = SIM / "lib"
LIBVGPU = BUILD / "libvgpu.so"
