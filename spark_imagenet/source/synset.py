"""WordNet synsets (classes) of ILSVRC: reading ``LOC_synset_mapping.txt``
and choosing a subset of classes.

``LOC_synset_mapping.txt`` (Kaggle ``imagenet-object-localization-challenge``)
has one line per class, ``<wnid> <name>, <name>, ...``, sorted by wnid; the
0-based line index is the class id used by TFDS and by this project.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
import dataclasses
from typing import Any, Iterable, Sequence

from spark_imagenet.errors import ConfigError, LayoutError

WNID_RE = re.compile(r"^n\d{8}$")


@dataclasses.dataclass(frozen=True)
class SynsetClass:
    """One class of the dataset.

    Attributes:
        id: global 0-based class id, the label stored in every example.
        wnid: WordNet synset id, e.g. ``"n01440764"``.
        names: human-readable names from ``LOC_synset_mapping.txt``.
    """

    id: int
    wnid: str
    names: tuple[str, ...]

    def to_json(self) -> dict[str, Any]:
        """``{"id", "wnid", "names"}``, as stored in the manifest's class list."""
        return {"id": self.id, "wnid": self.wnid, "names": list(self.names)}


def read_synset_mapping(path: str | os.PathLike) -> tuple[SynsetClass, ...]:
    """Read ``LOC_synset_mapping.txt``.

    Args:
        path: the mapping file.

    Returns:
        tuple[SynsetClass, ...]: classes in file order; ``id`` = 0-based line
        index (blank lines are not allowed between entries).

    Raises:
        LayoutError: the file is missing, a line is not ``<wnid> <names>``,
            or a wnid repeats. The message names the file and line.
    """
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise LayoutError(f"{path} is missing (the class list of the Kaggle layout)") from None
    return parse_synset_mapping(text, str(path))


def parse_synset_mapping(text: str, where: str) -> tuple[SynsetClass, ...]:
    """Parse the text of ``LOC_synset_mapping.txt`` (see :func:`read_synset_mapping`).

    Args:
        text: the file's text.
        where: how messages name the file (a path, or a zip and its member).

    Returns:
        tuple[SynsetClass, ...]: classes in file order, ``id`` = line index.

    Raises:
        LayoutError: a line is not ``<wnid> <names>``, a wnid repeats, or no
            class is listed; the message names ``where`` and the line.
    """
    path = where
    classes: list[SynsetClass] = []
    seen: dict[str, int] = {}
    lines = text.splitlines()
    while lines and not lines[-1].strip():
        lines.pop()
    for lineno, line in enumerate(lines, 1):
        line = line.strip()
        wnid, _, rest = line.partition(" ")
        if not WNID_RE.match(wnid):
            raise LayoutError(
                f"{path}:{lineno}: expected '<wnid> <names>' with a wnid like n01440764, got {line[:80]!r}"
            )
        if wnid in seen:
            raise LayoutError(f"{path}:{lineno}: wnid {wnid} repeats line {seen[wnid]}")
        seen[wnid] = lineno
        names = tuple(n.strip() for n in rest.split(",") if n.strip())
        classes.append(SynsetClass(len(classes), wnid, names))
    if not classes:
        raise LayoutError(f"{path} lists no classes")
    return tuple(classes)


def read_class_list(path: str | os.PathLike) -> list[str]:
    """Read a file of wnids (one per line, or whitespace/comma separated;
    ``#`` starts a comment).

    Raises:
        ConfigError: the file is missing, empty, or holds something that is
            not a wnid (named with its line).
    """
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as e:
        raise ConfigError(f"--class-list {path}: cannot read it ({e.strerror or e})",
                          key="--class-list", value=path) from None
    wnids: list[str] = []
    for lineno, line in enumerate(text.splitlines(), 1):
        for tok in re.split(r"[\s,]+", line.split("#", 1)[0].strip()):
            if not tok:
                continue
            if not WNID_RE.match(tok):
                raise ConfigError(f"--class-list {path}:{lineno}: {tok!r} is not a wnid like n01440764",
                                  key="--class-list", value=path)
            wnids.append(tok)
    if not wnids:
        raise ConfigError(f"--class-list {path} holds no wnids", key="--class-list", value=path)
    return wnids


def select_classes(
    classes: Sequence[SynsetClass],
    num_classes: int | None = None,
    wnids: Iterable[str] | None = None,
) -> tuple[SynsetClass, ...]:
    """Choose the classes of a dataset and number them 0..K-1.

    The chosen classes keep the mapping file's order, so the first K classes
    of ILSVRC-2012 get ids 0..K-1 whichever way they were chosen.

    Args:
        classes: all classes, as read by :func:`read_synset_mapping`.
        num_classes: keep the first ``num_classes`` classes (``--classes K``).
        wnids: keep exactly these wnids (``--class-list FILE``).

    Returns:
        tuple[SynsetClass, ...]: the chosen classes, re-numbered from 0.

    Raises:
        ConfigError: both or neither-but-invalid selections, K out of range,
            or a wnid that is not in the mapping (all unknown ones listed).
    """
    if num_classes is not None and wnids is not None:
        raise ConfigError("--classes and --class-list are exclusive: give one of them", key="--class-list",
                          value=wnids)
    chosen: list[SynsetClass]
    if num_classes is not None:
        if not 1 <= num_classes <= len(classes):
            raise ConfigError(f"--classes {num_classes}: must be between 1 and {len(classes)} (the classes in the mapping)",
                              key="--classes", value=num_classes)
        chosen = list(classes[:num_classes])
    elif wnids is not None:
        wanted = list(dict.fromkeys(wnids))
        known = {c.wnid for c in classes}
        unknown = [w for w in wanted if w not in known]
        if unknown:
            raise ConfigError(
                f"--class-list: {len(unknown)} wnid(s) not in LOC_synset_mapping.txt: {', '.join(unknown[:10])}"
                + (" ..." if len(unknown) > 10 else ""), key="--class-list", value=unknown
            )
        wanted_set = set(wanted)
        chosen = [c for c in classes if c.wnid in wanted_set]
    else:
        chosen = list(classes)
    return tuple(SynsetClass(i, c.wnid, c.names) for i, c in enumerate(chosen))
