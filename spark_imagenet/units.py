"""Readable numbers for messages: byte counts."""

from __future__ import annotations


def human_size(n: int | float) -> str:
    """A byte count for messages, in a unit that keeps it readable.

    Args:
        n: a number of bytes.

    Returns:
        str: ``"0 bytes"``, ``"999 bytes"``, ``"1.50 KB"``, ``"2.40 MB"``,
        ``"155 GB"``, ``"35.2 TB"``: bytes below 1000, else KB, MB, GB, TB or
        PB (powers of 1000, like Kaggle's and ``df -H``'s), three significant
        digits, so that a small number never shows as ``0.0 GB``.
    """
    n = int(n)
    if abs(n) < 1000:
        return f"{n} byte" + ("" if abs(n) == 1 else "s")
    value, unit = float(n), "bytes"
    for unit in ("KB", "MB", "GB", "TB", "PB"):
        value /= 1000
        if abs(value) < 999.5:
            break
    digits = 2 if abs(value) < 9.995 else 1 if abs(value) < 99.95 else 0
    return f"{value:.{digits}f} {unit}"
