"""Code run around the first import of one module, and what a TensorFlow process of ours leaves unimported.

:func:`around_first_import` runs a module's code, the first time it is imported, inside a context manager, with
the normal finders and loader otherwise (a ``sys.meta_path`` finder that removes itself once used). Two uses,
both installed by the package's ``__init__`` before any module here imports TensorFlow:

* :func:`spark_imagenet.training.worker.native_log.install`: ``import tensorflow`` with its native log lines
  filtered.
* :func:`leave_out_pandas`: ``tf_keras``'s data adapters import pandas when it is installed, only to accept
  pandas objects in ``fit``/``predict``, which a process of ours never passes (it feeds ``tf.data``); pandas is
  hidden from that one module's import (:func:`hidden`), so the process does not load it: 68 MB resident and
  0.6 CPU-s less per TensorFlow process, the fork server's included (measured: docs/design.md, 'One TensorFlow
  import per host: the fork server'). Where pandas is already imported (a pandas UDF in a PySpark worker) it is
  used as before; an ``import pandas`` anywhere else (a user's model builder) works as always.
"""

from __future__ import annotations

import contextlib
import importlib.abc
import importlib.util
import sys
from typing import Callable, ContextManager, Iterator

#: The tf_keras module that imports pandas, optionally (``try: import pandas ... except ImportError``).
TF_KERAS_DATA_ADAPTER = "tf_keras.src.engine.data_adapter"


class _AroundFirstImport(importlib.abc.MetaPathFinder):
    """Finds module ``name`` once, with the normal finders, and runs its module code inside ``context()``."""

    def __init__(self, name: str, context: Callable[[], ContextManager]) -> None:
        self.name, self.context = name, context

    def find_spec(self, name, path=None, target=None):
        if name != self.name:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
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


def around_first_import(name: str, context: Callable[[], ContextManager]) -> bool:
    """Run module ``name``'s code inside ``context()`` the first time this process imports it.

    Args:
        name: the module's full name.
        context: a callable returning a context manager, entered just before the module's code runs.

    Returns:
        bool: True when in place for the first import; False when ``name`` is already imported or a hook for
        it is already installed.
    """
    if name in sys.modules or any(isinstance(f, _AroundFirstImport) and f.name == name for f in sys.meta_path):
        return False
    sys.meta_path.insert(0, _AroundFirstImport(name, context))
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
    """Hide pandas from tf_keras's data adapters' first import (see the module docstring); what
    :func:`around_first_import` returns."""
    return around_first_import(TF_KERAS_DATA_ADAPTER, lambda: hidden("pandas"))
