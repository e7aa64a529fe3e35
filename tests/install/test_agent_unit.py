"""make install puts the node agent's systemd unit beside the install, naming its own
hamictl, and says how to start it; the installed hamictl has the agent; uninstall
takes the unit away (an edited one stays)."""
import configparser
import subprocess

from tests.runtime.node import TIMEOUT
from .conftest import Install


def unit(inst):
    return inst.prefix / "lib" / "systemd" / "system" / "hami-agent.service"


def test_the_unit_runs_the_installs_hamictl(tmp_path):
    inst = Install(tmp_path)
    out = inst.make()
    parsed = configparser.ConfigParser(interpolation=None)
    parsed.read_string(unit(inst).read_text())
    assert parsed["Service"]["ExecStart"] == f"{inst.bin}/hamictl agent"
    assert parsed["Install"]["WantedBy"] == "multi-user.target"
    assert (f"install: the node agent's unit is {unit(inst)}: start it with systemctl enable --now "
            f"hami-agent (or run {inst.bin}/hamictl agent)") in out
    helped = subprocess.run([inst.bin / "hamictl", "agent", "--help"], env={}, capture_output=True, text=True,
                            timeout=TIMEOUT, cwd="/")
    assert helped.returncode == 0 and "Hold each GPU container to its slice" in helped.stdout
    edited = unit(inst).read_text() + "# local\n"
    unit(inst).write_text(edited)
    out = inst.make("uninstall")
    assert f"uninstall: kept {unit(inst)}: edited" in out and unit(inst).read_text() == edited
    unit(inst).unlink()
    inst.make()
    inst.make("uninstall")
    assert not (inst.prefix / "lib" / "systemd").exists()
