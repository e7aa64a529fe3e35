"""tests/gpu: what each test measured and how it ended, for `make gpu-check`'s report.

A test asks for the `figures` fixture and puts what it measured there; with HAMI_GPU_RESULTS
naming a file, one JSON line per test is appended to it: its id, outcome (passed, failed,
skipped), the figures and, for a failure or a skip, the last line of the reason."""
import json
import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench" / "gpu"))


@pytest.fixture
def figures(request):
    found = {}
    request.node.hami_figures = found
    return found


def _reason(report) -> str:
    if report.passed:
        return ""
    if isinstance(report.longrepr, tuple):          # a skip: (file, line, reason)
        return str(report.longrepr[2])
    lines = [line for line in str(report.longrepr).splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("E ")]
    return (errors[0][1:].strip() if errors else lines[-1] if lines else "")[:400]


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    results = os.environ.get("HAMI_GPU_RESULTS")
    if not results or (report.when != "call" and report.passed):   # a call's outcome, or a setup's skip/error
        return
    line = {"test": item.nodeid, "when": report.when, "outcome": report.outcome,
            "figures": getattr(item, "hami_figures", {}), "reason": _reason(report),
            "seconds": round(report.duration, 1)}
    with open(results, "a") as out:
        out.write(json.dumps(line) + "\n")
