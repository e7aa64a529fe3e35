"""What every process of a container lives with: exports, env mistakes, logging,
dlsym(RTLD_NEXT) for other interposers, no trace in programs that never use CUDA; and
calls between its files that go one way."""
import re
import subprocess

import pytest

from tests.conftest import LIBVGPU, ROOT, cycles

from .conftest import MIB

PHYSICAL = 16384 * MIB


def hooked_names():
    text = (ROOT / "libvgpu_src" / "hooks.h").read_text()
    return set(re.findall(r"^\s*X\((\w+), (?:CUDA|NVML)\)", text, re.M))


def test_only_interposed_symbols_are_exported(probe):
    out = subprocess.run(["nm", "-D", "--defined-only", str(LIBVGPU)], capture_output=True,
                         text=True, check=True, timeout=30).stdout
    exported = {line.split()[-1] for line in out.splitlines() if line.strip()}
    assert exported == hooked_names() | {"dlsym"}


def test_every_hook_is_defined_through_hami_hook():
    """Re-entrancy is decided in HAMI_HOOK alone: no entry point is exported past it
    (dlsym, which is no driver entry point, aside)."""
    direct = [f"{path.name}: {line.strip()}"
              for path in sorted((ROOT / "libvgpu_src").glob("*.c"))
              for line in path.read_text().splitlines()
              if "HAMI_EXPORT" in line and not line.lstrip().startswith(("/*", "*"))]
    assert direct == ["interpose.c: HAMI_EXPORT void *dlsym(void *__restrict handle, "
                      "const char *__restrict name)"]


@pytest.mark.parametrize("name, value", [
    ("CUDA_DEVICE_MEMORY_LIMIT", "banana"),
    ("CUDA_DEVICE_MEMORY_LIMIT", "-5"),
    ("CUDA_DEVICE_MEMORY_LIMIT", "12q"),
    ("CUDA_DEVICE_MEMORY_LIMIT", " 1g"),
    ("CUDA_DEVICE_MEMORY_LIMIT_0", "99999999999999999999g"),
    ("CUDA_DEVICE_SM_LIMIT", "250"),
    ("CUDA_DEVICE_SM_LIMIT", "-1"),
    ("CUDA_DEVICE_SM_LIMIT_0", "half"),
    ("GPU_CORE_UTILIZATION_POLICY", "sometimes"),
    ("CUDA_TASK_PRIORITY", "7"),
    ("CUDA_PRIORITY_IDLE_MS", "0"),
    ("CUDA_PRIORITY_IDLE_MS", "60001"),
    ("CUDA_PRIORITY_IDLE_MS", "2s"),
    ("CUDA_PRIORITY_BOARD", "relative/board"),
    ("CUDA_ACTIVITY_BOARD", "relative/board"),
    ("CUDA_ACTIVITY_STAMP_DIR", "stamps"),
    ("CUDA_OVERSUBSCRIBE", "yes"),
    ("LIBCUDA_LOG_LEVEL", "9"),
])
def test_bad_env_value_is_one_line_and_ignored(probe, name, value):
    result = probe.run("link", "info", **{name: value})
    lines = [l for l in result.stderr.splitlines() if l.startswith("[hami]")]
    assert len(lines) == 1, result.stderr
    assert name in lines[0] and value in lines[0]
    assert result.fields["total"] == PHYSICAL  # ignored: nothing limited by it


def test_log_level_zero_is_silent(probe):
    result = probe.run("link", "info", CUDA_DEVICE_MEMORY_LIMIT="banana", LIBCUDA_LOG_LEVEL=0)
    assert "[hami]" not in result.stderr


def test_refusal_is_logged_at_info_level(probe):
    result = probe.run("link", "alloc", "mem", 2048 * MIB, CUDA_DEVICE_MEMORY_LIMIT="1g",
                       LIBCUDA_LOG_LEVEL=3)
    assert result.fields["rc"] == 2
    assert any("refused" in l for l in result.stderr.splitlines() if l.startswith("[hami] info"))


def test_rtld_next_still_means_after_the_caller(probe):
    assert probe.run("none", "rtldnext").fields["same"] == 1


def test_program_that_never_uses_cuda_is_untouched(probe):
    env = probe.env(shared=True, CUDA_DEVICE_MEMORY_LIMIT="1g")
    result = subprocess.run(["/bin/sh", "-c", "echo ok"], env=env, capture_output=True,
                            text=True, timeout=10, check=True)
    assert result.stdout == "ok\n" and result.stderr == ""
    assert not probe.region.exists()  # nothing mapped, no slot taken


def test_untracked_free_goes_to_the_driver_unchanged(probe):
    plain = probe.run("link", "badfree", preload=False).fields["rc"]
    hooked = probe.run("link", "badfree", CUDA_DEVICE_MEMORY_LIMIT="1g").fields["rc"]
    assert hooked == plain != 0


def test_null_outputs_get_the_drivers_answer(probe):
    plain = probe.run("link", "nullsafe", preload=False).fields
    hooked = probe.run("link", "nullsafe", CUDA_DEVICE_MEMORY_LIMIT="1g").fields
    assert hooked == plain and all(rc != 0 for rc in hooked.values())


def call_graph(objects):
    """libvgpu's files, each to the files defining what it calls (from the object
    files: its undefined symbols, resolved to the file that defines them)."""
    defined, undefined = {}, {}
    sources = sorted((ROOT / "libvgpu_src").glob("*.c"))
    for source in sources:
        obj = objects / f"{source.stem}.o"
        subprocess.run(["gcc", "-O2", "-fPIC", "-std=gnu11", "-D_GNU_SOURCE", "-fvisibility=hidden",
                        "-c", str(source), "-o", str(obj)], check=True, timeout=120)
        for line in subprocess.run(["nm", str(obj)], capture_output=True, text=True,
                                   check=True, timeout=30).stdout.splitlines():
            fields = line.split()
            if len(fields) == 2 and fields[0] == "U":
                undefined.setdefault(source.name, set()).add(fields[1])
            elif len(fields) == 3 and fields[1].isupper():
                defined.setdefault(fields[2], source.name)
    return {s.name: {defined[u] for u in undefined.get(s.name, ()) if defined.get(u, s.name) != s.name}
            for s in sources}


def test_calls_between_files_go_one_way(tmp_path):
    graph = call_graph(tmp_path)
    assert "memory.c" in graph["cuda_memory.c"]  # it sees calls
    assert cycles(graph) == []
