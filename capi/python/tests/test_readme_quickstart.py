"""The root README's quick start, as written, and the links of the README and docs/.

The README's two vLLM scripts are the files ``examples/vllm_one_process.py`` and
``examples/vllm_tp2.py``: each sits in the README as a ```python block right after a
``<!-- example: PATH -->`` line, and the block must equal the file byte for byte. Then each file
runs, unchanged, in real vLLM (the CPU build in the venv ``scripts/setup-vllm`` makes) with the tutti
package as ``pip install .`` makes it: the wheel of this checkout installed with ``pip install
--target`` (tests/installed_package.py), its directory on ``PYTHONPATH`` and its ``bin/`` on
``PATH``, with no ``TUTTI_LIB``/``TUTTI_BIN``. Each script checks its own result (the second
prompt's 96 shared tokens come back from tutti) and exits non-zero otherwise. Without the venv
the two runs skip, saying why; under ``CI=true`` they fail.

Every relative link in README.md, capi/python/README.md and docs/**.md must name a file that exists and, for a
``#fragment`` into a Markdown file, a heading of that file (GitHub's anchor rules).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import installed_package

REPO = Path(__file__).resolve().parents[3]
README = REPO / "README.md"
EXAMPLES = ["examples/vllm_one_process.py", "examples/vllm_tp2.py"]
VENV = Path(os.environ.get("TUTTI_VLLM_VENV") or Path.home() / ".cache" / "tutti" / "vllm-venv")
PY = os.environ.get("TUTTI_VLLM_PYTHON") or str(VENV / "bin" / "python")
MARK = re.compile(r"^<!-- example: (\S+) -->\n```python\n(.*?)^```$", re.M | re.S)


def readme_examples(text: str) -> dict[str, str]:
    return {m.group(1): m.group(2) for m in MARK.finditer(text)}


def test_the_readme_scripts_are_the_example_files_byte_for_byte():
    blocks = readme_examples(README.read_text())
    assert sorted(blocks) == sorted(EXAMPLES), f"README example markers: {sorted(blocks)}"
    for path, block in blocks.items():
        assert block == (REPO / path).read_text(), f"README's block for {path} differs from the file"


def test_the_marker_parser_notices_a_changed_block():
    text = README.read_text()
    one = EXAMPLES[0]
    changed = text.replace("max_tokens=4", "max_tokens=5", 1)
    assert readme_examples(changed)[one] != (REPO / one).read_text()


# ---- running them in real vLLM -----------------------------------------------------------------


def _unavailable() -> str | None:
    if not Path(PY).exists():
        return f"no vLLM venv at {VENV} (run scripts/setup-vllm, or set TUTTI_VLLM_PYTHON)"
    done = subprocess.run([PY, "-c", "import vllm, transformers"], capture_output=True, text=True, timeout=300)
    if done.returncode != 0:
        return f"{PY} cannot import vllm and transformers: {done.stderr.strip()[-500:]}"
    return None


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    why = _unavailable()
    if why is not None:
        if os.environ.get("CI") == "true":
            pytest.fail(f"real vLLM is required under CI=true: {why}")
        print(f"SKIP: {why}", file=sys.stderr)
        pytest.skip(why)
    return installed_package.install(tmp_path_factory.mktemp("readme-tutti"))


def run_example(path: str, site: Path, work: Path) -> subprocess.CompletedProcess:
    env = installed_package.child_env({
        "PYTHONPATH": str(site), "PATH": f"{site / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}",
        "TUTTI_LIB": None, "TUTTI_BIN": None, "TUTTI_TEST_INSTALLED": None,
        # The scripts set these themselves: the test must not.
        "VLLM_ENABLE_V1_MULTIPROCESSING": None, "VLLM_CPU_OMP_THREADS_BIND": None,
    })
    done = subprocess.run([PY, str(REPO / path), str(work)], capture_output=True, text=True, timeout=900,
                          env=env, cwd=work.parent)
    assert done.returncode == 0, f"{path} failed ({done.returncode}):\n{done.stdout[-4000:]}\n{done.stderr[-6000:]}"
    return done


def test_the_one_process_script_runs_as_written(installed, tmp_path):
    done = run_example(EXAMPLES[0], installed, tmp_path / "work")
    out = done.stdout
    assert "150 prompt tokens, 0 loaded by tutti" in out, out[-3000:]
    assert "141 prompt tokens, 96 loaded by tutti" in out, out[-3000:]
    # vLLM's prefix cache is off in the script, so those 96 tokens can only have come from the
    # connector, which says so in vLLM's log, with where its pool is.
    log = out + done.stderr
    assert "96 tokens (3 blocks) hit in the pool, loading them" in log, log[-3000:]
    assert f"pool in this process: 2 emulated drives of 64 MiB (files in {tmp_path / 'work' / 'pool'})" in log


def test_the_tp2_script_runs_as_written_each_rank_a_client_of_tuttid(installed, tmp_path):
    done = run_example(EXAMPLES[1], installed, tmp_path / "work")
    out = done.stdout
    assert "141 prompt tokens, 96 loaded by tutti" in out, out[-3000:]
    # `tutti status` while vLLM ran: the scheduler and one worker per rank.
    for client in ("vllm-scheduler-tp0-pp0", "vllm-worker-tp0-pp0", "vllm-worker-tp1-pp0"):
        assert client in out, out[-3000:]
    assert "geometry: 2 layers × 1 KV heads × head dim 32 × 32 tokens/block, f32" in out
    log = out + done.stderr
    assert "96 tokens (3 blocks) hit in the pool, loading them" in log, log[-3000:]
    assert f"scheduler side: pool in tuttid at {tmp_path / 'work' / 'tuttid.sock'}" in log, log[-3000:]
    # tuttid stopped on SIGTERM and removed its socket.
    assert not (tmp_path / "work" / "tuttid.sock").exists()


# ---- links --------------------------------------------------------------------------------------

LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")


def anchors(md: str) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces to hyphens, -N for repeats."""
    seen: dict[str, int] = {}
    out = set()
    in_code = False
    for line in md.splitlines():
        if line.startswith("```"):
            in_code = not in_code
            continue
        m = re.match(r"^#{1,6} (.*)$", line)
        if in_code or not m:
            continue
        slug = re.sub(r"[^\w\- ]", "", m.group(1).strip().lower()).replace(" ", "-")
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        out.add(slug if n == 0 else f"{slug}-{n}")
    return out


def _rel(p: Path) -> str:
    return os.path.relpath(p, REPO)


def broken_links(doc: Path) -> list[str]:
    text = re.sub(r"^```.*?^```", "", doc.read_text(), flags=re.M | re.S)
    bad = []
    for target in LINK.findall(text):
        if re.match(r"^[a-z]+:", target):
            continue  # http:, https:, mailto:
        path, _, frag = target.partition("#")
        dest = (doc.parent / path).resolve() if path else doc
        if not dest.exists():
            bad.append(f"{_rel(doc)}: {target}: no such file")
        elif frag and dest.suffix == ".md" and frag not in anchors(dest.read_text()):
            bad.append(f"{_rel(doc)}: {target}: no heading #{frag} in {_rel(dest)}")
    return bad


def test_every_relative_link_of_the_readmes_and_docs_resolves():
    docs = [README, REPO / "capi" / "python" / "README.md", *sorted((REPO / "docs").glob("*.md")),
            *sorted((REPO / "docs" / "perf").glob("*.md"))]
    bad = [b for d in docs for b in broken_links(d)]
    assert not bad, "\n".join(bad)


def test_the_link_check_notices_a_missing_file_and_heading(tmp_path):
    (tmp_path / "other.md").write_text("# Other page: `a` — b\n")
    doc = tmp_path / "probe.md"
    doc.write_text("# Probe\n\n[a](other.md#no-such-heading) [b](nowhere.md) [c](#probe) "
                   "[d](other.md#other-page-a--b)\n```\n[e](in-code.md)\n```\n")
    bad = broken_links(doc)
    assert len(bad) == 2 and "no heading #no-such-heading" in bad[0] and "nowhere.md: no such file" in bad[1], bad


def test_the_readme_stays_a_page_a_newcomer_reads():
    """Issue 31: about 300 lines, under 350; detail goes to docs/."""
    lines = README.read_text().count("\n")
    assert lines < 350, f"README.md has {lines} lines; move detail to docs/"
