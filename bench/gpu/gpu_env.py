"""What tests/gpu, bench/gpu/run.py and `make gpu-check` need to know about the machine: is there
a GPU, which Python has PyTorch with CUDA, what the card and driver are, and how to make the
environment of a "container" in bare use (its own region, its activity stamp on a board).
Standard library only: it runs before any choice of interpreter is made."""
import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LIBVGPU = ROOT / "build" / "libvgpu.so"
DRIVER_PROBE = ROOT / "bench" / "gpu" / "driver_probe.py"
TORCH_PROBE = ROOT / "bench" / "gpu" / "torch_probe.py"
STAMP_BYTES = 64              # libvgpu_src/activity.h: HAMI_STAMP_BYTES
TORCH_CHECK = "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 3)"


def clean_env(**extra) -> dict:
    """This process's environment without libvgpu or its variables, plus `extra` (as strings)."""
    env = {k: v for k, v in os.environ.items()
           if k != "LD_PRELOAD" and not k.startswith(("CUDA_DEVICE_MEMORY_", "CUDA_DEVICE_SM_LIMIT", "GPU_CORE_",
                                                       "CUDA_ACTIVITY_", "CUDA_PRIORITY_", "CUDA_OVERSUBSCRIBE", "CUDA_TASK_"))}
    env.update({k: str(v) for k, v in extra.items()})
    return env


def no_gpu_reason():
    """None where an NVIDIA driver answers with at least one GPU, else why not (one line)."""
    if not shutil.which("nvidia-smi"):
        return "no NVIDIA driver here (nvidia-smi not found)"
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30, env=clean_env())
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"nvidia-smi -L failed: {exc}"
    if out.returncode or "GPU" not in out.stdout:
        return f"nvidia-smi -L lists no GPU (exit {out.returncode}: {(out.stderr or out.stdout).strip()[:200]})"
    return None


def torch_python_candidates() -> list:
    """In order: $HAMI_GPU_PYTHON, the python3 on PATH, /usr/bin/python3, make torch's venv."""
    found = [os.environ.get("HAMI_GPU_PYTHON"), shutil.which("python3"), "/usr/bin/python3",
             str(ROOT / "build" / "torch" / "venv" / "bin" / "python")]
    seen, out = set(), []
    for path in found:
        if path and Path(path).exists() and os.path.realpath(path) not in seen:
            seen.add(os.path.realpath(path))
            out.append(path)
    return out


def torch_python():
    """The first candidate whose PyTorch imports and sees CUDA (None if none does): the machine's
    own PyTorch where it has one, else build/torch/venv."""
    for path in torch_python_candidates():
        try:
            if subprocess.run([path, "-c", TORCH_CHECK], capture_output=True, timeout=120,
                              env=clean_env()).returncode == 0:
                return path
        except (OSError, subprocess.TimeoutExpired):
            continue
    return None


def smi(query: str) -> list:
    """nvidia-smi --query-gpu=<query>, outside libvgpu: one list of fields per GPU."""
    out = subprocess.run(["nvidia-smi", f"--query-gpu={query}", "--format=csv,noheader,nounits"],
                         capture_output=True, text=True, timeout=30, env=clean_env())
    return [[f.strip() for f in line.split(",")] for line in out.stdout.strip().splitlines()]


def failure(argv, proc) -> str:
    """One line for a probe that failed: its command, exit status and the last lines it wrote
    (PyTorch's warnings come first; a crash writes nothing)."""
    lines = [line.strip() for line in (proc.stderr or "").strip().splitlines() if line.strip()]
    status = f"killed by signal {-proc.returncode}" if proc.returncode < 0 else f"exit {proc.returncode}"
    return f"{Path(argv[1]).name} {' '.join(map(str, argv[2:]))}: {status}: {' / '.join(lines[-3:])[-600:]}"


def card() -> dict:
    """GPU 0's name, memory (MiB) and driver version as nvidia-smi says; fields it cannot give are absent."""
    keys = ["name", "memory_total_mib", "driver"]
    for query in ("name,memory.total,driver_version", "name,memory.total", "name"):
        rows = smi(query)
        if rows and len(rows[0]) == query.count(",") + 1:
            return dict(zip(keys, rows[0]))
    return {}


def smi_apps() -> list:
    """MiB each compute process uses, as nvidia-smi outside libvgpu says."""
    out = subprocess.run(["nvidia-smi", "--query-compute-apps=used_memory", "--format=csv,noheader,nounits"],
                         capture_output=True, text=True, timeout=30, env=clean_env())
    return [int(x) for x in out.stdout.split() if x.strip().isdigit()]


def device0() -> dict:
    """CUDA device 0 as the driver says outside libvgpu (driver_probe.py info: UUID, name, total MiB,
    SMs), so that a multi-GPU machine's nvidia-smi order cannot mix cards up."""
    import json
    out = subprocess.run([sys.executable, str(DRIVER_PROBE), "info"], capture_output=True, text=True,
                         timeout=120, env=clean_env())
    if out.returncode:
        raise RuntimeError(f"driver_probe.py info: {out.stderr.strip()[-500:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def container_env(workdir: Path, name: str, uuid: str, board: Path = None) -> dict:
    """One container's env in bare use: a region of its own (so its processes share a limit and
    no one else's); with `board`, its activity stamp for `uuid`, linked on that activity board,
    as the runtime does (hami_runtime/lifecycle/node_state/boards.py): `default` then holds the share only
    while another container on the board works."""
    env = {"CUDA_DEVICE_MEMORY_SHARED_CACHE": str(workdir / f"{name}.region")}
    if board is not None:
        stamps = workdir / f"stamps-{name}"
        stamps.mkdir(parents=True, exist_ok=True)
        stamp = stamps / uuid
        if not stamp.exists():
            stamp.write_bytes(bytes(STAMP_BYTES))
        entry = board / uuid / name
        entry.parent.mkdir(parents=True, exist_ok=True)
        if not entry.exists():
            os.link(stamp, entry)
        env.update(CUDA_ACTIVITY_BOARD=str(board), CUDA_ACTIVITY_STAMP_DIR=str(stamps))
    return env


if __name__ == "__main__":
    reason = no_gpu_reason()
    print(reason or f"GPU: {smi('name,uuid,memory.total,driver_version')}; PyTorch with CUDA: {torch_python()}")
    sys.exit(0)
