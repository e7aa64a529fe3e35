"""`make gpu-check` where there is no GPU (this machine): its report writer from a canned run,
its one-line answer without a GPU, its scripts' command lines, and the probes tests/gpu runs,
unchanged, on the simulated driver: driver_probe.py's GPU-time measure and torch_probe.py's
CUDA graph capture under a limit."""
import json
import os
import re
import subprocess
import sys

import pytest

from tests.conftest import LIBVGPU, ROOT, SIM_LIB

sys.path.insert(0, str(ROOT / "bench" / "gpu"))
import report  # noqa: E402

CANNED = {
    "command": "make gpu-check",
    "environment": {"date": "2026-11-26 09:00 UTC", "gpu": "NVIDIA H200", "memory_mib": "143771",
                    "driver": "580.159.04", "torch": "2.11.0+cu130", "torch_cuda": "13.0", "python": "3.12.3",
                    "commit": "abc1234"},
    "tests_status": "pytest: 1 failed, 1 passed, 1 skipped in 80.0s",
    "tests": [
        {"test": "tests/gpu/test_driver.py::test_force_holds_the_share_of_gpu_time[5000-30]", "outcome": "passed",
         "figures": {"busy_pct": 30.4123, "jitter_points": 1.25, "per_second_pct": [30.1, 30.7]}, "reason": "",
         "seconds": 12.4},
        {"test": "tests/gpu/test_driver.py::test_libvgpu_adds_at_most_5_ms_to_cuda_init", "outcome": "failed",
         "figures": {"native_ms": 316.0, "libvgpu_ms": 326.0, "added_ms": 10.0},
         "reason": "AssertionError: ([316, 317], [326, 327]) | x"},
        {"test": "tests/gpu/test_torch_limits.py::test_memory_limit_is_exact[]", "outcome": "skipped",
         "figures": {}, "reason": "no PyTorch here that sees the GPU"},
    ],
    "bench": {"sections": [
        {"name": "sm", "title": "SM share as GPU time", "columns": ["kernel µs", "30 %: busy % (jitter)"],
         "rows": [[50, "29.6 (1.2)"], [5000, "30.7 (0.4)"]], "note": "busy % = the kernels' own time",
         "seconds": 44.3},
        {"name": "spill", "title": "spill", "skipped": "not run: 20 s of the budget left, ~60 s needed"},
        {"name": "graph", "title": "graph", "error": "RuntimeError: torch_probe.py failed"},
    ]},
    "bench_status": "",
}


def tables(markdown: str) -> list:
    """Each markdown table as a list of its rows' cell counts."""
    found, current = [], []
    for line in markdown.splitlines() + [""]:
        if line.startswith("|"):
            current.append(len(re.findall(r"(?<!\\)\|", line)) - 1)
        elif current:
            found.append(current)
            current = []
    return found


def test_the_report_names_the_machine_every_figure_and_every_outcome():
    text = report.render(CANNED)
    assert text.startswith("## Real GPU: NVIDIA H200\n")
    assert ("Measured 2026-11-26 09:00 UTC on NVIDIA H200 (143771 MiB), driver 580.159.04, CUDA 13.0, "
            "PyTorch 2.11.0+cu130, Python 3.12.3, checkout abc1234.") in text
    assert "Command: `make gpu-check`." in text
    assert "1 failed, 1 passed, 1 skipped." in text
    row = next(line for line in text.splitlines() if "test_libvgpu_adds_at_most_5_ms" in line)
    assert "| FAILED |" in row and "added_ms 10.0" in row and "native_ms 316.0" in row
    assert "\\| x" in row                                  # a pipe in a reason cannot break the table
    passed = next(line for line in text.splitlines() if "test_force_holds" in line)
    assert "busy_pct 30.4" in passed and "per_second_pct 30.1 30.7" in passed and "| passed | 12 |" in passed
    assert "| FAILED | - |" in row                         # what each test took of the window, where known
    assert "#### SM share as GPU time (44 s)\n" in text
    assert "no PyTorch here that sees the GPU" in text
    assert "| 50 | 29.6 (1.2) |" in text and "busy % = the kernels' own time" in text
    assert "#### spill\n\nSkipped: not run: 20 s of the budget left" in text
    assert "#### graph\n\n**Error**: RuntimeError: torch_probe.py failed" in text
    for rows in tables(text):                              # every row as wide as its header
        assert len(set(rows)) == 1, rows


def test_the_report_of_a_run_that_measured_nothing_still_says_so():
    text = report.render({"environment": {"gpu": "NVIDIA H100", "date": "2026-11-27 10:00 UTC"},
                          "tests_status": "Not run: no Python with pytest here (`make venv` makes one)."})
    assert "## Real GPU: NVIDIA H100" in text and "Not run: no Python with pytest" in text
    assert "No test result recorded." in text


def test_gpu_check_without_a_gpu_says_so_in_one_line(tmp_path):
    report_path = tmp_path / "report.md"
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}      # no nvidia-smi on it
    if any(os.access(os.path.join(d, "nvidia-smi"), os.X_OK) for d in env["PATH"].split(":")):
        pytest.skip("this machine has nvidia-smi")
    out = subprocess.run([sys.executable, str(ROOT / "bench/gpu/check.py"), "--report", str(report_path)],
                         env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["gpu-check: no GPU: no NVIDIA driver here (nvidia-smi not found); "
                                       "nothing measured, no report written"]
    assert not report_path.exists()


@pytest.mark.parametrize("script", ["check.py", "run.py", "driver_probe.py", "torch_probe.py", "report.py"])
def test_the_scripts_parse_their_command_lines(script):
    if script == "report.py":
        return  # no options: render() is what the tests above drive
    out = subprocess.run([sys.executable, str(ROOT / "bench/gpu" / script), "--help"], capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0 and "usage:" in out.stdout, out.stderr


def test_driver_probe_measures_gpu_time_on_the_simulated_driver(tmp_path):
    """The same probe the real GPU runs: its spin kernel (PTX) loads, launches fill every SM, and
    libvgpu's `force` 30 % holds it near 30 % of the time (here the simulator books each kernel's
    10 ms; no kernel runs, so no timestamps: the clock is nominal)."""
    env = {"PATH": "/usr/bin:/bin", "LD_LIBRARY_PATH": str(SIM_LIB), "HAMI_SIM_STATE": str(tmp_path / "gpu.state"),
           "LD_PRELOAD": str(LIBVGPU), "CUDA_DEVICE_SM_LIMIT": "30", "GPU_CORE_UTILIZATION_POLICY": "force"}
    out = subprocess.run([sys.executable, str(ROOT / "bench/gpu/driver_probe.py"), "busy", "--kernel-us", "10000",
                          "--seconds", "4"], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["clock"] == "nominal" and got["grid"] == got["sms"] * got["blocks_per_sm"] and got["kernels"] > 0
    assert abs(got["busy_pct"] - 30) <= 5, got


def test_torch_probe_captures_and_replays_a_graph_under_a_limit_on_the_simulated_driver(tmp_path):
    """tests/gpu's graph measure on the simulated driver (fp32: the simulator runs PyTorch's fp32
    matmuls): capture and replay under a 4096 MiB limit, the replay's result, and a captured
    8192 MiB allocation refused with OutOfMemoryError, the process capturing again after it."""
    python = ROOT / "build" / "torch" / "venv" / "bin" / "python"
    if not python.exists():
        pytest.skip("no build/torch/venv: make torch")
    (tmp_path / "sim.conf").write_text("devices = 1\nmemory_mib = 16384\ncuda_version = 13000\nkernel_us = 100\n")
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "LD_LIBRARY_PATH": str(SIM_LIB),
           "HAMI_SIM_CONFIG": str(tmp_path / "sim.conf"), "HAMI_SIM_STATE": str(tmp_path / "gpu.state"),
           "LD_PRELOAD": str(LIBVGPU), "CUDA_DEVICE_MEMORY_LIMIT_0": "4096m"}
    out = subprocess.run([str(python), str(ROOT / "bench/gpu/torch_probe.py"), "graph", "--seconds", "1", "--size",
                          "256", "--matmuls", "2", "--dtype", "float32", "--oversize-mib", "8192"],
                         env=env, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["capture_ok"], got
    assert got["replay_max_abs_diff"] < 0.05 and got["replays_mean"] > 0, got
    assert got["oversize_refusal"]["error"] == "OutOfMemoryError", got
    assert got["capture_after_refusal_ok"] and got["replay_after_refusal_max_abs_diff"] < 0.05, got


def test_gpu_check_runs_the_decode_loop_and_a_compiled_model_on_the_simulated_driver(tmp_path):
    """bench/gpu/run.py's decode and compiled sections, as `make gpu-check` runs them, on the
    simulated driver (its nvidia-smi on PATH): decode_probe.py bare, in a 4096 MiB slice and at
    30 % `force`; torch.compile(mode="reduce-overhead") native and at 30 %. No kernel computes
    here, so each check against eager says it is not applicable rather than passing."""
    python = ROOT / "build" / "torch" / "venv" / "bin" / "python"
    if not python.exists():
        pytest.skip("no build/torch/venv: make torch")
    (tmp_path / "sim.conf").write_text("devices = 1\nmemory_mib = 16384\ncuda_version = 13000\nkernel_us = 100\n")
    env = {"PATH": f"{SIM_LIB.parent / 'bin'}:/usr/bin:/bin", "HOME": str(tmp_path), "LD_LIBRARY_PATH": str(SIM_LIB),
           "HAMI_SIM_CONFIG": str(tmp_path / "sim.conf"), "HAMI_SIM_STATE": str(tmp_path / "gpu.state")}
    out = subprocess.run([str(python), str(ROOT / "bench/gpu/run.py"), "--only", "decode,compiled", "--seconds", "1",
                          "--json", str(tmp_path / "bench.json")], env=env, capture_output=True, text=True,
                         timeout=300, cwd=tmp_path)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    decode, compiled = json.loads((tmp_path / "bench.json").read_text())["sections"]
    assert [row[1] for row in decode["rows"]] == ["16384", "4096", "4096"], decode
    assert all(row[-1].startswith("not applicable") for row in decode["rows"] + compiled["rows"]), (decode, compiled)
    # the share: wide bounds, the machine may be loaded
    assert float(decode["rows"][2][-2].split()[0]) < 60 and float(compiled["rows"][1][3].split()[0]) < 60, \
        (decode, compiled)


def test_gpu_check_times_nvml_around_a_first_context_on_the_simulated_driver(tmp_path):
    """bench/gpu/run.py's nvml section (init_costs.py, no libvgpu) on the simulated driver: each
    way's process runs and its figures come back, NVML's start beside the context's included."""
    env = {"PATH": f"{SIM_LIB.parent / 'bin'}:/usr/bin:/bin", "HOME": str(tmp_path), "LD_LIBRARY_PATH": str(SIM_LIB),
           "HAMI_SIM_STATE": str(tmp_path / "gpu.state")}
    out = subprocess.run([sys.executable, str(ROOT / "bench/gpu/run.py"), "--only", "nvml", "--json",
                          str(tmp_path / "bench.json")], env=env, capture_output=True, text=True, timeout=300,
                         cwd=tmp_path)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    (nvml,) = json.loads((tmp_path / "bench.json").read_text())["sections"]
    rows = {row[0]: row[1:] for row in nvml["rows"]}
    assert set(rows) == {"serial", "overlapped", "beside_context", "no_attach"}, nvml
    assert all(cell != "-" for cell in rows["beside_context"][:4] + [rows["beside_context"][5]]), nvml
    assert rows["overlapped"][4] != "-" and rows["serial"][1] != "-", nvml
