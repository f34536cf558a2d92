"""What the driver knows about each model without importing TensorFlow: one row per registered model.

Each registered model is declared once, in :data:`MODELS`: its smallest input side, whether its width is fixed,
its training recipe and where its builder lives (``package.module:function``). The builder itself imports
tf_keras and is imported only in the TensorFlow worker process
(:func:`spark_imagenet.training.worker.models.registry.get_builder`); the driver checks ``--model``,
``--image-size`` and ``--width`` against this table before it starts any Spark job, so a typo fails in a second
instead of after every worker has started TensorFlow. ``tests/test_models.py`` checks the table against the
models' own arithmetic and that every builder imports.

``--model`` is a registered name (a key of :data:`MODELS`) or ``package.module:function``, a user's own builder
``function(num_classes: int, image_size: int, width: float) -> tf_keras.Model`` (:func:`is_user_builder`),
checked here by reading its source (:func:`check_user_builder`) and in the TensorFlow worker by calling it.
"""

from __future__ import annotations

import ast
import dataclasses
import os
import re

from spark_imagenet.errors import ConfigError
from spark_imagenet.training.job import alexnet_layers

#: ``package.module:function``: a model builder (a registered model's, or a user's own ``--model``).
USER_BUILDER = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*")


@dataclasses.dataclass(frozen=True)
class Recipe:
    """A model's default training settings: what ``--learning-rate``, ``--lr-schedule``, ``--warmup-epochs``,
    ``--lr-scaling``, ``--momentum``, ``--weight-decay`` and ``--label-smoothing`` are when not given.

    Attributes:
        learning_rate: base learning rate (per 256 images when ``lr_scaling`` is ``"linear"``).
        lr_schedule: ``"constant"``, ``"step"`` or ``"cosine"``.
        warmup_epochs: linear warm-up epochs of a 90-epoch run; a run of E epochs warms up for
            ``warmup_epochs * E / 90`` (:meth:`value`), as the step schedule's default drops scale to ``E``.
        lr_scaling: ``"linear"`` or ``"none"``.
        momentum: optimizer momentum.
        weight_decay: L2 weight decay of the kernels (gradient term ``weight_decay * w``).
        label_smoothing: label smoothing of the cross-entropy.
        source: where the values come from (shown in ``--help`` and the docs).
    """

    learning_rate: float
    lr_schedule: str
    warmup_epochs: float
    lr_scaling: str
    momentum: float
    weight_decay: float
    label_smoothing: float
    source: str

    def value(self, key: str, epochs: int) -> float | str:
        """The recipe's value of setting ``key`` (a field name) for a run of ``epochs`` epochs.

        Args:
            key (str): one of the recipe's setting names, e.g. ``"warmup_epochs"``.
            epochs (int): the run's ``--epochs``.

        Returns:
            float | str: the field's value; ``warmup_epochs`` scaled from 90 epochs to ``epochs``.
        """
        value = getattr(self, key)
        return value * epochs / 90 if key == "warmup_epochs" else value


@dataclasses.dataclass(frozen=True)
class ModelSpec:
    """A registered model, as the driver knows it (without TensorFlow).

    Attributes:
        name: the ``--model`` value that selects it, e.g. ``"alexnet"``.
        min_image_size: smallest ``--image-size`` in pixels its layers take.
        fixed_width: whether its layer widths are fixed (then ``--width`` must be 1.0).
        recipe: its default training settings.
        builder: ``package.module:function`` of its builder
            ``function(num_classes: int, image_size: int, width: float) -> tf_keras.Model``, imported by the
            TensorFlow worker only.

    Raises:
        ValueError: ``builder`` is not of the form ``package.module:function``.
    """

    name: str
    min_image_size: int
    fixed_width: bool
    recipe: Recipe
    builder: str

    def __post_init__(self) -> None:
        if USER_BUILDER.fullmatch(self.builder) is None:
            raise ValueError(f"model {self.name!r}: builder {self.builder!r} is not package.module:function")


#: The registered models, by name.
MODELS: dict[str, ModelSpec] = {spec.name: spec for spec in (
    # The smallest input follows from AlexNet's layer arithmetic (67 px, :func:`alexnet_layers.min_image_size`).
    # Krizhevsky et al. 2012, section 5: batch 128, lr 0.01, momentum 0.9, weight decay 0.0005 (the paper divided
    # the rate by 10 three times: --lr-schedule step --warmup-epochs 0). The schedule is the modern one, a cosine
    # after a warm-up of 5 of 90 epochs: on the ILSVRC sample it beat both the constant rate and the step
    # schedule (docs/design.md, 'Training recipes').
    ModelSpec(name="alexnet", min_image_size=alexnet_layers.min_image_size(), fixed_width=False,
              recipe=Recipe(learning_rate=0.01, lr_schedule="cosine", warmup_epochs=5.0, lr_scaling="none",
                            momentum=0.9, weight_decay=5e-4, label_smoothing=0.0,
                            source="Krizhevsky et al. 2012"),
              builder="spark_imagenet.training.worker.models.alexnet:build_alexnet"),
    # 32 px: the smallest input ``tf_keras.applications.ResNet50`` accepts (five stride-2 stages); its widths are
    # fixed. Goyal et al. 2017 (ResNet-50 at any global batch): 0.1 per 256 images, 5 warm-up epochs, /10 at 30,
    # 60 and 80 of 90 epochs, momentum 0.9, weight decay 1e-4.
    ModelSpec(name="resnet50", min_image_size=32, fixed_width=True,
              recipe=Recipe(learning_rate=0.1, lr_schedule="step", warmup_epochs=5.0, lr_scaling="linear",
                            momentum=0.9, weight_decay=1e-4, label_smoothing=0.0,
                            source="Goyal et al. 2017"),
              builder="spark_imagenet.training.worker.models.resnet:build_resnet50"),
)}
#: The recipe of a user's own builder: plain SGD with momentum, no weight decay added (its layers may carry
#: their own regularisers).
USER_RECIPE = Recipe(learning_rate=0.01, lr_schedule="constant", warmup_epochs=0.0, lr_scaling="none",
                     momentum=0.9, weight_decay=0.0, label_smoothing=0.0, source="a user's builder")


def is_user_builder(model: str) -> bool:
    """Whether ``--model`` names a user's builder (``package.module:function``) rather than a registered model."""
    return isinstance(model, str) and USER_BUILDER.fullmatch(model) is not None


def recipe_for(model: str) -> Recipe:
    """The default training settings of ``--model`` (its row of :data:`MODELS`, or :data:`USER_RECIPE` for a
    user's builder)."""
    return USER_RECIPE if is_user_builder(model) else MODELS[model].recipe


def check_model_settings(model: str, image_size: int, width: float = 1.0) -> str | None:
    """Check a model name, input size and width at the driver (without importing TensorFlow).

    A user's builder (``package.module:function``) is checked by :func:`check_user_builder`: its module is found
    and its source read, not executed (its parent packages are imported, see there); the builder's result is
    checked in the TensorFlow worker (:func:`spark_imagenet.training.worker.models.registry.build_model`).

    Args:
        model: ``--model`` value: a registered name or ``package.module:function``.
        image_size: ``--image-size`` value in pixels.
        width: ``--width`` value.

    Returns:
        None for a registered model; for a user's builder, :func:`check_user_builder`'s note of where it was
        found (or why it is only checked in the first task).

    Raises:
        ConfigError: unknown model (the message lists the known ones and the builder form), a ``--model`` with
            a colon that is not of the form ``package.module:function``, a user's builder whose module cannot be
            found or does not define the function, an image size below the model's minimum, or a width other
            than 1.0 for a model of fixed width.
    """
    if is_user_builder(model):
        return check_user_builder(model)
    if isinstance(model, str) and ":" in model:
        raise ConfigError(f"model (--model) {model!r} is not of the form package.module:function (dotted Python "
                          "names, e.g. mypackage.models:build); give a registered model "
                          f"({', '.join(sorted(MODELS))}) or your own builder in that form", key="model", value=model)
    if model not in MODELS:
        import difflib

        close = difflib.get_close_matches(model, list(MODELS), n=1, cutoff=0.8)
        raise ConfigError(f"model (--model) {model!r} is not a known model"
                          + (f" (did you mean {close[0]!r}?)" if close else "")
                          + f"; choose one of: {', '.join(sorted(MODELS))}, or give your own builder as "
                            "package.module:function", key="model", value=model)
    spec = MODELS[model]
    if image_size < spec.min_image_size:
        raise ConfigError(f"image_size (--image-size) {image_size} is too small for {model}: its layers need at "
                          f"least {spec.min_image_size} px", key="image_size", value=image_size)
    if spec.fixed_width and width != 1.0:
        raise ConfigError(f"width (--width) {width:g} does not apply to {model}, whose layer widths are fixed: "
                          "leave --width at 1.0", key="width", value=width)
    return None


def _path_for_message(limit: int = 8) -> str:
    """The driver's ``sys.path`` for an error message: its first ``limit`` entries, then how many more."""
    import sys

    paths = [p or "''" for p in sys.path]
    shown = os.pathsep.join(paths[:limit])
    return shown + (f" ... and {len(paths) - limit} more" if len(paths) > limit else "")


def _process() -> str:
    """``"the TensorFlow worker"`` in the worker process (which checks its spec's config again), else
    ``"the driver"``."""
    import sys

    main = getattr(sys.modules.get("__main__"), "__spec__", None)
    return "the TensorFlow worker" if getattr(main, "name", None) == "spark_imagenet.training.worker.main" else "the driver"


def _find_module(model: str, module: str):
    """``importlib.util.find_spec(module)``, every failure as a ConfigError naming ``--model``."""
    import importlib.util

    where = ("install it, or put its folder on PYTHONPATH (e.g. PYTHONPATH=$PWD: the spark-imagenet command does "
             "not search the current folder; local mode passes it to the workers), or on a cluster ship it with "
             "spark-submit --py-files (spark.submit.pyFiles), which also puts it on the driver's path")
    try:
        spec = importlib.util.find_spec(module)
    except ModuleNotFoundError as e:
        spec, missing = None, f" (no package {e.name!r})" if e.name and e.name != module else ""
    except Exception as e:  # noqa: BLE001 - a parent package's own code failed while it was imported
        first = (str(e).strip().splitlines() or [""])[0][:300]
        raise ConfigError(f"model (--model) {model!r}: finding module {module} imports its parent package(s), "
                          f"which failed on {_process()} ({type(e).__name__}: {first}); make "
                          f"{module.rsplit('.', 1)[0]} importable there without errors",
                          key="model", value=model) from None
    else:
        missing = ""
    if spec is None:
        raise ConfigError(f"model (--model) {model!r}: cannot find module {module}{missing} on {_process()}'s "
                          f"Python path (sys.path: {_path_for_message()}); {where}", key="model", value=model)
    return spec


def _top_level_names(tree: ast.Module) -> tuple[set[str], bool]:
    """The names a module binds at its top level (``def``, ``class``, assignments, imports, also inside
    top-level ``if``/``try``/``with`` blocks), and whether it has ``from ... import *`` or a module
    ``__getattr__`` (then any name may exist)."""
    names: set[str] = set()
    open_ended = False
    body = list(tree.body)
    while body:
        node = body.pop(0)
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names.update(n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name))
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            for alias in node.names:
                if alias.name == "*":
                    open_ended = True
                else:
                    names.add(alias.asname or alias.name.split(".")[0])
        elif isinstance(node, (ast.If, ast.Try, ast.With)):
            body.extend(node.body + getattr(node, "orelse", []) + getattr(node, "finalbody", [])
                        + [n for h in getattr(node, "handlers", []) for n in h.body])
    return names, open_ended or "__getattr__" in names


def check_user_builder(model: str) -> str:
    """Check ``--model package.module:function`` on the driver without running the module's code.

    The module is found with ``importlib.util.find_spec``, which does not execute the module itself but does
    import its parent packages (``package/__init__.py`` runs on the driver: keep it free of TensorFlow, or the
    driver starts TensorFlow). Its source is read (from a file or a ``--py-files`` zip) and parsed with
    :mod:`ast`: ``function`` must be bound at the module's top level (``def``, ``class``, an assignment or an
    import of that name). A module without readable source (a compiled extension, a ``.pyc`` only) is accepted
    here and checked when the first task imports it. The TensorFlow worker runs the same check when it reads its
    spec (its messages then name the worker's Python path instead of the driver's), before it imports the module.

    Args:
        model: ``package.module:function`` (:func:`is_user_builder` is true).

    Returns:
        A one-line note: where the module was found, or that it is checked in the first task.

    Raises:
        ConfigError: the module cannot be found on the driver's ``sys.path`` (the message shows the path and how
            to ship the module), a parent package fails to import, the source does not parse, or ``function`` is
            not defined at its top level; every message names ``--model``.
    """
    module, function = model.split(":")
    spec = _find_module(model, module)
    if spec.origin is None and spec.submodule_search_locations is not None:  # a folder without __init__.py
        folder = os.pathsep.join(spec.submodule_search_locations)
        raise ConfigError(f"model (--model) {model!r}: {module} is a folder without code ({folder}); name the "
                          f"module that defines {function}, as {module}.MODULE:{function}", key="model", value=model)
    origin = spec.origin or "?"
    try:
        source = spec.loader.get_source(module) if spec.loader is not None else None
    except (ImportError, OSError, AttributeError):
        source = None
    if source is None:
        return f"{module} ({origin}) has no Python source to check here: {function} is checked in the first task"
    try:
        tree = ast.parse(source, filename=origin)
    except SyntaxError as e:
        raise ConfigError(f"model (--model) {model!r}: {origin} line {e.lineno} does not parse ({e.msg}); fix "
                          "the module", key="model", value=model) from None
    names, open_ended = _top_level_names(tree)
    if function not in names and not open_ended:
        import difflib

        close = difflib.get_close_matches(function, sorted(names), n=1)
        raise ConfigError(f"model (--model) {model!r}: {module} ({origin}) defines no top-level {function!r}"
                          + (f" (did you mean {close[0]!r}?)" if close else "")
                          + f"; define {function}(num_classes, image_size, width) -> tf_keras.Model in it",
                          key="model", value=model)
    if function not in names:
        return (f"{module} ({origin}) may define {function} at run time (`from ... import *` or a module "
                f"__getattr__): it is checked in the first task")
    return f"{model}: {function} found in {origin}"
