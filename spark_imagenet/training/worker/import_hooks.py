"""Code run around the import of a module (or of a package's modules), and what a TensorFlow process of ours
leaves unimported.

:func:`around_import` runs a module's code, when it is imported, inside a context manager, with the path finder
and the module's own loader otherwise (a ``sys.meta_path`` finder). Two uses, both installed by
:func:`spark_imagenet.training.worker.environment.prepare_tensorflow_process`, which the entry points of our
TensorFlow processes call before TensorFlow is imported (importing this module installs nothing):

* :func:`spark_imagenet.training.worker.native_log.install`: the first ``import tensorflow``, its native log lines
  filtered.
* :func:`leave_out_pandas`: ``tf_keras``'s data adapters import pandas when it is installed, only to accept
  pandas objects in ``fit``/``predict``, which a process of ours never passes (it feeds ``tf.data``); pandas is
  hidden while any module of ``tf_keras`` is imported (:func:`hidden`), so the process does not load it: 68 MB
  resident and 0.6 CPU-s less per TensorFlow process, the fork server's included (measured: docs/design.md, 'One
  TensorFlow import per host: the fork server'). Where pandas is already imported (a pandas UDF in a PySpark
  worker) it is used as before; an ``import pandas`` anywhere else (a user's model builder) works as always.
"""

from __future__ import annotations

import contextlib
import importlib.abc
import importlib.machinery
import sys
from typing import Callable, ContextManager, Iterator

#: The package whose modules are imported without pandas: its data adapters import pandas optionally (``try:
#: import pandas ... except ImportError``), the only module of tf_keras 2.21 that does.
TF_KERAS = "tf_keras"


class _AroundImport(importlib.abc.MetaPathFinder):
    """Finds module ``name`` (with ``submodules``, also each ``name.*``) with the path finder and runs its module
    code inside ``context()``; without ``submodules`` it removes itself once it found ``name``."""

    def __init__(self, name: str, context: Callable[[], ContextManager], submodules: bool) -> None:
        self.name, self.context, self.submodules = name, context, submodules

    def find_spec(self, name, path=None, target=None):
        if name != self.name and not (self.submodules and name.startswith(self.name + ".")):
            return None
        if not self.submodules:
            sys.meta_path.remove(self)
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        loader, exec_module, context = spec.loader, spec.loader.exec_module, self.context

        def exec_module_inside(module):
            try:
                with context():
                    exec_module(module)
            finally:
                del loader.exec_module  # back to the class's method

        loader.exec_module = exec_module_inside
        return spec


def around_import(name: str, context: Callable[[], ContextManager], submodules: bool = False) -> bool:
    """Run module ``name``'s code inside ``context()`` when this process first imports it; with ``submodules``,
    also the code of each of its submodules (``name.*``) this process imports from then on.

    Args:
        name: the module's full name (a module on ``sys.path``: it is found with the path finder).
        context: a callable returning a context manager, entered just before a module's code runs.
        submodules: the submodules too (the hook then stays in place).

    Returns:
        bool: True when in place; False when ``name`` is already imported or a hook for it is already installed.
    """
    if name in sys.modules or any(isinstance(f, _AroundImport) and f.name == name for f in sys.meta_path):
        return False
    sys.meta_path.insert(0, _AroundImport(name, context, submodules))
    return True


@contextlib.contextmanager
def hidden(module: str) -> Iterator[None]:
    """Inside: ``import module`` raises ``ImportError`` unless the module is already imported (``sys.modules``
    holds None for it); after: as before."""
    if module in sys.modules:
        yield
        return
    sys.modules[module] = None
    try:
        yield
    finally:
        if module in sys.modules and sys.modules[module] is None:
            del sys.modules[module]


def leave_out_pandas() -> bool:
    """Hide pandas from every tf_keras module this process imports, its data adapters included, whenever they are
    imported (tf_keras loads most of them lazily; see the module docstring); what :func:`around_import` returns."""
    return around_import(TF_KERAS, lambda: hidden("pandas"), submodules=True)
