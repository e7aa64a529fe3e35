"""The README and docs/ as a reader uses them: the tour runs as written, and
every link between the pages leads somewhere."""
import re
import subprocess

import pytest

from tests.conftest import ROOT

PAGES = [ROOT / "README.md", ROOT / "BENCHMARKS.md", *sorted((ROOT / "docs").glob("*.md")),
         *sorted(p for p in ROOT.glob("*/**/README.md") if not p.is_relative_to(ROOT / "build")
                 and ".venv" not in p.parts)]
LINK = re.compile(r"\]\(([^)\s]+)\)")


def fenced_block_after(text: str, marker: str) -> str:
    after = text[text.index(marker):]
    match = re.search(r"```sh\n(.*?)```", after, re.S)
    return match.group(1)


def anchors(markdown: str) -> set:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces as '-'."""
    text = re.sub(r"```.*?```", "", markdown, flags=re.S)
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-")
            for h in re.findall(r"^#+ (.+)$", text, re.M)}


def relative_links() -> list:
    return [pytest.param(page, target, id=f"{page.relative_to(ROOT)}:{target}")
            for page in PAGES for target in LINK.findall(page.read_text())
            if not re.match(r"[a-z]+:", target)]


@pytest.mark.parametrize("page,target", relative_links())
def test_link_leads_somewhere(page, target):
    path, _, anchor = target.partition("#")
    resolved = (page.parent / path).resolve() if path else page
    assert resolved.exists(), f"{page.name}: {target}: no such file"
    if anchor and resolved.suffix == ".md":
        assert anchor in anchors(resolved.read_text()), f"{page.name}: {target}: no such heading"


def test_tour_runs_as_written(tmp_path):
    script = fenced_block_after((ROOT / "README.md").read_text(), "<!-- tour -->")
    out = tmp_path / "out"
    with open(out, "w") as sink:  # runc forwards stdio: a file, never a pipe
        result = subprocess.run(["bash", "-euo", "pipefail", "-c", script], cwd=ROOT, stdout=sink,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, timeout=300,
                                env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "HOME": str(tmp_path),
                                     "TMPDIR": str(tmp_path)})
    text = out.read_text()
    assert result.returncode == 0, text
    assert len(re.findall(r"^\d+\s+GPU-\S+\s+HAMi Simulated GPU\s+16384MiB", text, re.M)) == 2, text
    assert "0, 3000 MiB" in text
    assert re.search(r"allocated \d+ MiB; the next 1 MiB was refused: CUDA_ERROR_OUT_OF_MEMORY", text)
    assert re.search(r"^CONTAINER\s+GPU\s+UUID.*\n\Z", text, re.M), text  # ps: nothing held
    assert [p.name for p in tmp_path.iterdir()] == ["out"]  # the bundle went with rm -rf
