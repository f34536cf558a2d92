"""A small real file system for the full-disk tests: a tmpfs mounted for one test (needs root)."""

from __future__ import annotations

import contextlib
import os
import subprocess
from pathlib import Path
from typing import Iterator

import pytest


@contextlib.contextmanager
def small_tmpfs(where: Path, size: int) -> Iterator[Path]:
    """Mount a tmpfs of ``size`` bytes at ``where`` (made if missing) while inside; skips the test without root
    or when the mount is refused."""
    where.mkdir(parents=True, exist_ok=True)
    if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={int(size)}", "tmpfs", str(where)],
                                           capture_output=True).returncode != 0:
        pytest.skip("mounting a small tmpfs needs root (the full-disk tests)")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)
