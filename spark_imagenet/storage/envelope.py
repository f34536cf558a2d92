"""Versioned JSON documents: every JSON file this package writes says what it is and in which version.

A document is one JSON object whose ``"format"`` names its kind and whose ``"format_version"`` is an
integer, beside the body's own keys::

    {"format": "spark-imagenet-manifest", "format_version": 1, "dataset_id": "...", ...}

:class:`Envelope` writes that form and reads it back, refusing another kind or a version it does not read
with an error naming the file and what to do. Serves the dataset manifest, the quality report, the
checkpoint meta, the learning-rate schedule, the training config, the worker spec, the worker's result and
failure, the task's result and ``results.json``. :meth:`Envelope.fields_for` also checks a body against the
fields of the dataclass it becomes (a missing or unknown key, named).

Example::

    >>> from spark_imagenet.errors import ManifestError
    >>> MANIFEST = Envelope("spark-imagenet-manifest", 1, "spark-imagenet manifest", error=ManifestError,
    ...                     remedy="rebuild the shards")
    >>> text = MANIFEST.dumps({"dataset_id": "abc"})
    >>> MANIFEST.loads(text, "gs://b/ds/manifest.json")
    {'dataset_id': 'abc'}
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any, Mapping

from spark_imagenet.errors import ConfigError, SparkImagenetError

#: The two keys of the envelope; a body never holds them.
FORMAT_KEY = "format"
VERSION_KEY = "format_version"


@dataclasses.dataclass(frozen=True)
class Envelope:
    """The kind and version of one JSON document format.

    Attributes:
        format: the ``"format"`` value, e.g. ``"spark-imagenet-checkpoint"``.
        version: the ``"format_version"`` this code writes.
        title: what a document of this kind is, for messages (``"spark-imagenet checkpoint"``).
        error: the :class:`~spark_imagenet.errors.SparkImagenetError` subclass raised for a bad document.
        remedy: what the user can do about a document this code cannot read, appended to messages.
    """

    format: str
    version: int
    title: str
    error: type[SparkImagenetError] = ConfigError
    remedy: str = ""

    def _fail(self, where: str, problem: str, **about: Any) -> SparkImagenetError:
        return self.error(f"{where}: {problem}" + (f"; {self.remedy}" if self.remedy else ""), **about)

    def to_json(self, body: Mapping[str, Any]) -> dict[str, Any]:
        """The document of ``body``: ``{"format", "format_version", **body}``.

        Raises:
            ValueError: ``body`` holds ``"format"`` or ``"format_version"`` (a programming error).
        """
        if FORMAT_KEY in body or VERSION_KEY in body:
            raise ValueError(f"the body of a {self.title} must not hold {FORMAT_KEY!r} or {VERSION_KEY!r}")
        return {FORMAT_KEY: self.format, VERSION_KEY: self.version, **body}

    def version_of(self, data: Any, where: str) -> int:
        """The version of a decoded document, checked to be this kind and the version this code reads.

        Raises:
            SparkImagenetError: (``error``) not a JSON object of this ``format``, or another version than
                ``version``; the message names ``where`` and the version this code reads.
        """
        if not isinstance(data, dict) or data.get(FORMAT_KEY) != self.format:
            raise self._fail(where, f"not a {self.title} (expected \"{FORMAT_KEY}\": \"{self.format}\")",
                             key=FORMAT_KEY, value=data.get(FORMAT_KEY) if isinstance(data, dict) else data)
        version = data.get(VERSION_KEY)
        if isinstance(version, bool) or version != self.version:
            raise self._fail(where, f"{VERSION_KEY} {version!r} is not supported by this version of spark-imagenet "
                                    f"(which reads {self.version}); use the version of spark-imagenet that wrote it",
                             key=VERSION_KEY, value=version)
        return version

    def from_json(self, data: Any, where: str) -> dict[str, Any]:
        """The body of a decoded document (:meth:`version_of` checks it first).

        Args:
            data: the decoded JSON.
            where: the file, named in messages.

        Returns:
            dict: every key but ``"format"`` and ``"format_version"``.

        Raises:
            SparkImagenetError: (``error``) as :meth:`version_of`.
        """
        self.version_of(data, where)
        return {k: v for k, v in data.items() if k not in (FORMAT_KEY, VERSION_KEY)}

    def fields_for(self, cls: type, data: Any, where: str) -> dict[str, Any]:
        """The body of a decoded document (:meth:`from_json`), checked to hold the fields of the dataclass ``cls``.

        Args:
            cls: the dataclass the body becomes (``cls(**body)``).
            data: the decoded JSON.
            where: the file or value, named in messages.

        Returns:
            dict: the body; every required field of ``cls`` present, no other key.

        Raises:
            SparkImagenetError: (``error``) as :meth:`from_json`, or a missing or unknown key (each named).
        """
        body = self.from_json(data, where)
        fields = dataclasses.fields(cls)
        unknown = sorted(set(body) - {f.name for f in fields})
        missing = [f.name for f in fields if f.name not in body and f.default is dataclasses.MISSING
                   and f.default_factory is dataclasses.MISSING]
        if unknown or missing:
            raise self._fail(where, "; ".join(([f"unknown key(s) {', '.join(unknown)}"] if unknown else [])
                                              + ([f"missing key(s) {', '.join(missing)}"] if missing else [])),
                             key=(unknown or missing)[0])
        return body

    def dumps(self, body: Mapping[str, Any], *, indent: int | None = 2) -> str:
        """The document of ``body`` as JSON text (non-ASCII kept), ending with a newline."""
        return json.dumps(self.to_json(body), indent=indent, ensure_ascii=False) + "\n"

    def decode(self, text: str | bytes, where: str) -> Any:
        """JSON text decoded, unchecked.

        Raises:
            SparkImagenetError: (``error``) not JSON; names ``where``.
        """
        try:
            return json.loads(text)
        except ValueError as e:
            raise self._fail(where, f"not valid JSON ({e})") from None

    def loads(self, text: str | bytes, where: str) -> dict[str, Any]:
        """The body of a document's JSON text (:meth:`decode`, then :meth:`from_json`)."""
        return self.from_json(self.decode(text, where), where)
