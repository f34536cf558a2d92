"""spark_imagenet.training.worker.import_hooks: code around a module's import; pandas left out of tf_keras."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from data_util import REPO
from spark_imagenet.training.worker.import_hooks import around_import, hidden

#: A module that imports ``toy_optional`` optionally, as tf_keras's data adapters import pandas.
OPTIONAL_USER = """
try:
    import toy_optional
except ImportError:
    toy_optional = None
"""


@pytest.fixture
def toy(tmp_path, monkeypatch):
    """Fresh modules on sys.path: ``toy_optional``, ``toy_user`` (imports it optionally) and the package
    ``toy_pkg`` whose submodule ``toy_pkg.lazy`` does the same, imported after the package. All forgotten again
    after the test, with any hook left."""
    (tmp_path / "toy_optional.py").write_text("VALUE = 7\n")
    (tmp_path / "toy_user.py").write_text(OPTIONAL_USER)
    (tmp_path / "toy_pkg").mkdir()
    (tmp_path / "toy_pkg" / "__init__.py").write_text("")
    (tmp_path / "toy_pkg" / "lazy.py").write_text(OPTIONAL_USER)
    monkeypatch.syspath_prepend(str(tmp_path))
    hooks = list(sys.meta_path)
    yield tmp_path
    sys.meta_path[:] = hooks
    for name in ("toy_optional", "toy_user", "toy_pkg", "toy_pkg.lazy"):
        sys.modules.pop(name, None)


def test_a_hidden_module_is_left_out_of_that_import_only(toy):
    assert around_import("toy_user", lambda: hidden("toy_optional"))
    assert not around_import("toy_user", lambda: hidden("toy_optional"))  # one hook per module
    import toy_user

    assert toy_user.toy_optional is None and "toy_optional" not in sys.modules
    assert not any(getattr(f, "name", None) == "toy_user" for f in sys.meta_path)  # the hook removed itself
    import toy_optional  # anyone else's import works as always

    assert toy_optional.VALUE == 7


def test_with_submodules_a_module_imported_later_is_covered_too(toy):
    assert around_import("toy_pkg", lambda: hidden("toy_optional"), submodules=True)
    import toy_pkg  # noqa: F401
    import toy_optional  # noqa: F401  (between the package's imports: as always)

    del sys.modules["toy_optional"]
    import toy_pkg.lazy

    assert toy_pkg.lazy.toy_optional is None and "toy_optional" not in sys.modules


def test_a_module_already_imported_is_not_hidden(toy):
    import toy_optional

    assert around_import("toy_user", lambda: hidden("toy_optional"))
    import toy_user

    assert toy_user.toy_optional is toy_optional


def test_an_imported_module_gets_no_hook(toy):
    import toy_user  # noqa: F401

    assert not around_import("toy_user", lambda: hidden("toy_optional"))


def test_a_failing_import_leaves_nothing_hidden(toy):
    (toy / "toy_user.py").write_text("import toy_optional\n")
    around_import("toy_user", lambda: hidden("toy_optional"))
    with pytest.raises(ImportError):  # the hidden module's import fails, so the module's does
        import toy_user  # noqa: F401
    assert "toy_optional" not in sys.modules
    import toy_optional

    assert toy_optional.VALUE == 7


@pytest.mark.slow
def test_our_tensorflow_process_does_not_load_pandas():
    """The TensorFlow worker's imports (what the fork server preloads) leave pandas out; tf_keras then works
    without it, and pandas imports afterwards as usual."""
    code = textwrap.dedent("""
        import sys
        from spark_imagenet.training.worker.environment import prepare_tensorflow_process
        from spark_imagenet.training.worker.main import preload
        prepare_tensorflow_process()
        preload()
        from tf_keras.src.engine import data_adapter
        print("loaded:", "pandas" in sys.modules, "adapter:", data_adapter.pd)
        import pandas
        print("afterwards:", pandas.DataFrame({"a": [1]}).shape)
    """)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "loaded: False adapter: None" in proc.stdout and "afterwards: (1, 1)" in proc.stdout
