"""`make demo` (scripts/demo.sh): what a newcomer sees, and that it cleans up."""
import glob
import re
import subprocess

import pytest

from tests.conftest import ROOT
from tests.engines.conftest import filled_to_the_limit


@pytest.mark.usefixtures("hami")  # fails clearly when the build is missing
def test_demo_runs_a_1gib_slice_and_cleans_up():
    before = set(glob.glob("/tmp/hami-demo.*"))
    result = subprocess.run(["bash", ROOT / "scripts" / "demo.sh"], capture_output=True, text=True,
                            timeout=300, cwd=ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout
    assert re.search(r"^hami-runtime demo on the (simulated|real) GPU", out, re.M)
    assert "asks for hami.io/gpumem=1024" in out
    # nvidia-smi inside shows the slice as the card's memory.
    assert re.search(r"\|\s+0\s.*\|\s+\d+/1024\s", out), out
    got = filled_to_the_limit(out, 1024)
    assert f"the program got {got} MiB" in out
    assert result.stderr == ""
    assert set(glob.glob("/tmp/hami-demo.*")) == before
