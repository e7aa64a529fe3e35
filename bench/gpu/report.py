"""The markdown of `make gpu-check`'s report (and of bench/gpu/run.py's tables), from data:

    {"environment": {"date", "gpu", "memory_mib", "driver", "torch", "torch_cuda", ...},
     "tests": [{"test", "outcome", "figures", "reason", "seconds"}, ...],   # tests/gpu/conftest.py
     "tests_status": "...",                                                # pytest's summary / why not run
     "bench": {"sections": [{"title", "columns", "rows", "note"} | {"title", "skipped"|"error"}, ...]},
     "bench_status": "..."}

Standard library only. `python3 bench/gpu/report.py results.json` prints it.
"""
import json
import sys


def _cell(value) -> str:
    if isinstance(value, float):
        return f"{value:.1f}"
    if isinstance(value, (list, tuple)):
        return " ".join(_cell(v) for v in value)
    if isinstance(value, dict):
        return "; ".join(f"{k} {_cell(v)}" for k, v in value.items())
    return str(value).replace("|", "\\|").replace("\n", " ")


def table(columns, rows) -> str:
    lines = ["| " + " | ".join(_cell(c) for c in columns) + " |", "| " + " | ".join("---" for _ in columns) + " |"]
    lines += ["| " + " | ".join(_cell(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def environment_line(env: dict) -> str:
    parts = [f"Measured {env.get('date', '?')} on {env.get('gpu', '?')}"]
    if env.get("memory_mib"):
        parts[0] += f" ({env['memory_mib']} MiB)"
    for key, label in (("driver", "driver"), ("torch_cuda", "CUDA"), ("torch", "PyTorch"), ("python", "Python"),
                       ("kernel", "kernel"), ("commit", "checkout")):
        if env.get(key):
            parts.append(f"{label} {env[key]}")
    return ", ".join(parts) + "."


def section_markdown(sec: dict) -> str:
    took = f" ({sec['seconds']:.0f} s)" if "seconds" in sec else ""  # what it took of the check's window
    head = f"### {sec.get('title', sec.get('name', '?'))}{took}\n\n"
    if "skipped" in sec:
        return head + f"Skipped: {sec['skipped']}\n"
    if "error" in sec:
        return head + f"**Error**: {_cell(sec['error'])}\n"
    text = head + table(sec["columns"], sec["rows"]) + "\n"
    if sec.get("note"):
        text += f"\n{sec['note']}\n"
    return text


def tests_markdown(tests: list) -> str:
    """One row a test: outcome, seconds (of the check's window), its figures, and why it failed
    or skipped."""
    if not tests:
        return "No test result recorded.\n"
    rows = []
    for t in tests:
        name = t["test"].split("::", 1)[-1]
        outcome = t["outcome"].upper() if t["outcome"] == "failed" else t["outcome"]
        seconds = f"{t['seconds']:.0f}" if isinstance(t.get("seconds"), (int, float)) else "-"
        rows.append([name, outcome, seconds, _cell(t.get("figures") or {}) or "-", t.get("reason") or "-"])
    counts = {}
    for t in tests:
        counts[t["outcome"]] = counts.get(t["outcome"], 0) + 1
    summary = ", ".join(f"{n} {k}" for k, n in sorted(counts.items()))
    return f"{summary}.\n\n" + table(["test", "outcome", "s", "figures", "reason"], rows) + "\n"


def render(results: dict) -> str:
    env = results.get("environment") or {}
    out = ["## Real GPU: " + env.get("gpu", "unknown GPU"), "", environment_line(env), ""]
    if results.get("command"):
        out += [f"Command: `{results['command']}`.", ""]
    out += ["### tests/gpu", ""]
    if results.get("tests_status"):
        out += [results["tests_status"], ""]
    out.append(tests_markdown(results.get("tests") or []))
    out += ["### bench/gpu/run.py", ""]
    if results.get("bench_status"):
        out += [results["bench_status"], ""]
    for sec in (results.get("bench") or {}).get("sections", []):
        out.append(section_markdown(sec).replace("### ", "#### ", 1))
    return "\n".join(out).rstrip() + "\n"


if __name__ == "__main__":
    print(render(json.loads(open(sys.argv[1]).read())), end="")
