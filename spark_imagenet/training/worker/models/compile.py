"""Compiling a model for training: precision, optimizer, weight decay, loss and metrics (imports TensorFlow;
worker side only).

The order a training process follows (the worker and ``benchmarks/gpu.py``)::

    >>> from spark_imagenet.training.worker.models.registry import build_model
    >>> set_precision("float32")                 # config.recipe.precision, before the model is built
    >>> model = float32_logits(build_model("alexnet", num_classes=4, image_size=67, width=0.25))   # float32 logits
    >>> model = compile_model(model, 0.01, optimizer="sgd", momentum=0.9, weight_decay=5e-4, label_smoothing=0.1)
    >>> model.outputs[0].dtype.name
    'float32'

Weight decay (every model): the papers' L2 decay, gradient ``weight_decay * w`` on the conv and dense kernels
(:func:`decayed_kernels`; not biases, not batch-norm gamma/beta), is applied inside the optimizer's step, after
the gradients are all-reduced: with ``optimizer="sgd"`` by :class:`~spark_imagenet.training.worker.optimizers.DecayedSGD`
(the same update as plain SGD on the loss plus ``weight_decay / 2 * sum(w ** 2)``, without that term's forward
and backward passes over every weight), with ``optimizer="lars"`` inside LARS' update. No term is added to the
loss: the reported ``loss`` is the data loss.

XLA (``jit_compile=True``): with one replica in sync, ``model.compile(jit_compile=True)`` compiles the whole
train step. With several (MultiWorkerMirroredStrategy, MirroredStrategy) the gradient all-reduce must stay
outside XLA: TensorFlow 2.21 refuses to compile collectives for CPU devices ("Collectives are not yet
implemented for CPU devices when compiling with XLA", b/194942685), and across hosts it is not verified here.
The model's train step then runs the forward pass, the loss and the gradients as one XLA function and the
all-reduce and the optimizer's update after it (:func:`_xla_gradients_train_step`); on GPUs tf-keras also
XLA-compiles the optimizer's per-variable update itself.
"""

from __future__ import annotations

import types
from typing import Any


import tensorflow as tf  # noqa: E402
import tf_keras as keras  # noqa: E402

from spark_imagenet.errors import ConfigError  # noqa: E402
from spark_imagenet.training.worker import tf_internals  # noqa: E402

#: Momentum of the SGD optimizer (Krizhevsky et al. 2012, section 5).
MOMENTUM = 0.9
#: ``--optimizer`` choices.
OPTIMIZERS = ("sgd", "lars")
#: ``--precision`` choices: Keras mixed-precision policy names.
PRECISIONS = ("float32", "mixed_float16", "mixed_bfloat16")
#: The layer attributes that hold a decayed kernel (Conv*/Dense/EinsumDense, depthwise and separable convs).
KERNEL_ATTRIBUTES = ("kernel", "depthwise_kernel", "pointwise_kernel")


def set_precision(name: str) -> None:
    """Set Keras' global mixed-precision policy; layers built afterwards compute in its dtype.

    ``float32``: everything float32. ``mixed_float16`` / ``mixed_bfloat16``: variables float32, computation
    in float16 / bfloat16 (fast on GPUs with tensor cores; on CPU it runs, usually slower than float32).
    Call it before building the model; the policy is global to the process (tests reset it with
    ``set_precision("float32")``).

    Args:
        name (str): one of :data:`PRECISIONS`.

    Raises:
        ConfigError: another name (names ``--precision`` and the choices).
    """
    if name not in PRECISIONS:
        raise ConfigError(f"precision (--precision) must be one of {', '.join(PRECISIONS)}, got {name!r}",
                          key="precision", value=name)
    keras.mixed_precision.set_global_policy(name)


def float32_logits(model: keras.Model) -> keras.Model:
    """The model with float32 outputs: a final float32 ``Activation("linear")`` cast where an output is not.

    Under a mixed policy the last Dense layer returns float16/bfloat16 logits; softmax and cross-entropy in
    that dtype lose precision, so they get float32 logits instead.

    Args:
        model (keras.Model): a built model mapping images to logits ``[B, C]``.

    Returns:
        keras.Model: ``model`` itself if every output is float32; else a model with the same name, inputs and
        layers plus one weightless float32 layer per output (``<output>_float32``), returning float32 logits.
    """
    outputs = getattr(model, "outputs", None)
    if not outputs:  # a subclassed model: no symbolic outputs to inspect
        if keras.mixed_precision.global_policy().compute_dtype == "float32":
            return model
        cast = keras.layers.Activation("linear", dtype="float32", name="logits_float32")
        return keras.Sequential([model, cast], name=model.name)
    if all(t.dtype == tf.float32 for t in outputs):
        return model
    cast = [keras.layers.Activation("linear", dtype="float32", name=f"{t.name.split('/')[0]}_float32")(t)
            if t.dtype != tf.float32 else t for t in outputs]
    return keras.Model(model.inputs, cast if len(cast) > 1 else cast[0], name=model.name)


def decayed_kernels(model: keras.Model) -> list[tf.Variable]:
    """The trainable conv and dense kernels of ``model`` and its nested layers, once each, in layer order.

    A kernel is a layer attribute named in :data:`KERNEL_ATTRIBUTES` holding a trainable variable; biases,
    batch-norm gamma/beta, embeddings and non-trainable weights are not kernels.
    """
    kernels, seen = [], set()
    for layer in tf_internals.flatten_layers(model):  # tf-keras' own walk over nested layers, in layer order
        for attribute in KERNEL_ATTRIBUTES:
            var = getattr(layer, attribute, None)
            if isinstance(var, tf.Variable) and var.trainable and id(var) not in seen:
                seen.add(id(var))
                kernels.append(var)
    return kernels


@keras.saving.register_keras_serializable(package="spark_imagenet")
class SmoothedSparseCrossentropy(keras.losses.Loss):
    """Cross-entropy of logits against smoothed one-hot integer labels.

    The label ``y`` becomes ``(1 - s) * one_hot(y) + s / C`` (``C`` classes, ``s`` = ``label_smoothing``), as
    ``CategoricalCrossentropy(from_logits=True, label_smoothing=s)`` does (tf-keras'
    ``SparseCategoricalCrossentropy`` has no smoothing).

    Args:
        label_smoothing (float): ``s`` in [0, 1).
        name (str): the loss' name.

    Call arguments: ``y_true`` int labels ``[B]`` or ``[B, 1]``; ``y_pred`` logits ``[B, C]``; returns the
    per-example loss ``[B]`` (float32 for float32 logits), reduced by Keras.
    """

    def __init__(self, label_smoothing: float = 0.0, name: str = "smoothed_sparse_crossentropy",
                 **kwargs: Any) -> None:
        super().__init__(name=name, **kwargs)
        self.label_smoothing = float(label_smoothing)

    def call(self, y_true: tf.Tensor, y_pred: tf.Tensor) -> tf.Tensor:
        labels = tf.reshape(tf.cast(y_true, tf.int32), [-1])
        one_hot = tf.one_hot(labels, tf.shape(y_pred)[-1], dtype=y_pred.dtype)
        return keras.losses.categorical_crossentropy(one_hot, y_pred, from_logits=True,
                                                     label_smoothing=self.label_smoothing)

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), "label_smoothing": self.label_smoothing}


def _xla_gradients_train_step(self: keras.Model, data: Any) -> dict[str, Any]:
    """tf-keras' ``Model.train_step`` with the forward pass, loss and gradients in one XLA function and the
    (all-reducing) ``apply_gradients`` outside it; loss scaling as ``optimizer.minimize`` does it."""
    x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(data)
    optimizer = self.optimizer
    scaled = hasattr(optimizer, "get_scaled_loss")  # a LossScaleOptimizer

    if getattr(self, "_spark_imagenet_xla_gradients", None) is None:
        @tf.function(jit_compile=True, reduce_retracing=True)
        def gradients(x, y, sample_weight):
            with tf.GradientTape() as tape:
                y_pred = self(x, training=True)
                loss = self.compute_loss(x, y, y_pred, sample_weight)
                objective = optimizer.get_scaled_loss(loss) if scaled else loss
            return y_pred, loss, tape.gradient(objective, self.trainable_variables)

        object.__setattr__(self, "_spark_imagenet_xla_gradients", gradients)  # not a tracked attribute
    y_pred, loss, grads = self._spark_imagenet_xla_gradients(x, y, sample_weight)
    self._validate_target_and_loss(y, loss)
    if scaled:
        grads = optimizer.get_unscaled_gradients(grads)
    optimizer.apply_gradients(zip(grads, self.trainable_variables))
    return self.compute_metrics(x, y, y_pred, sample_weight)


def _normalizing(step: Any) -> Any:
    """``step`` (a train or test step taking ``(self, data)``) with its ``x`` through
    :func:`~spark_imagenet.training.worker.preprocessing.normalize_batch` first: the pipeline's uint8 batches are
    normalized inside the step, on its device; float32 batches pass as they are."""
    from spark_imagenet.training.worker.preprocessing import normalize_batch

    def normalizing_step(self: keras.Model, data: Any) -> dict[str, Any]:
        x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(data)
        return step(self, keras.utils.pack_x_y_sample_weight(normalize_batch(x), y, sample_weight))

    return normalizing_step


def _set_steps(model: keras.Model, jit_compile: bool) -> bool:
    """Install the model's train and test steps; return whether ``model.compile`` should compile the whole step
    with XLA.

    Both normalize uint8 input first (:func:`_normalizing`). The train step is
    :func:`_xla_gradients_train_step` when XLA is asked for and the strategy has several replicas, else tf-keras'
    own. The steps are set on the instance, untracked (the model's layers, checkpoints and saved file do not
    change)."""
    for name in ("train_step", "test_step", "_spark_imagenet_xla_gradients", "_spark_imagenet_split_xla"):
        model.__dict__.pop(name, None)
    split = bool(jit_compile) and model.distribute_strategy.num_replicas_in_sync > 1
    normalize_in_steps(model, _xla_gradients_train_step if split else None)
    object.__setattr__(model, "_spark_imagenet_split_xla", split)
    return bool(jit_compile) and not split


def normalize_in_steps(model: keras.Model, train_step: Any = None) -> None:
    """Make ``model``'s train and test steps normalize uint8 input first (``fit``/``evaluate`` then take the
    input pipeline's batches: uint8 ``[B, S, S, 3]`` pixels, or ``(pixels, shifts float32 [B, 3])``; float32
    batches pass unchanged). :func:`compile_model` does it (a later ``model.compile`` keeps the steps).

    Args:
        model: a model taking float32 normalized images (it is not changed: only its steps, set on the instance,
            untracked, so its layers, checkpoints and saved file stay as they are).
        train_step: the train step to wrap, a function of ``(model, data)``; None: the model class' own.
    """
    from spark_imagenet.training.worker.preprocessing import xla_available

    xla_available()  # decided once, eagerly, before a step is traced
    train = train_step if train_step is not None else type(model).train_step
    object.__setattr__(model, "train_step", types.MethodType(_normalizing(train), model))
    object.__setattr__(model, "test_step", types.MethodType(_normalizing(type(model).test_step), model))


def describe_compiled(model: keras.Model) -> str:
    """What a compiled model trains with, for a log line: ``"LARS, compute bfloat16, XLA: the whole step"``.

    The optimizer's class (``"SGD in LossScaleOptimizer"`` under float16 loss scaling); the compute dtype of
    the model's layers (that of its first layer with weights); the XLA mode: ``"the whole step"``,
    ``"forward and gradients (all-reduce outside)"`` or ``"off"``.
    """
    opt = model.optimizer
    inner = getattr(opt, "inner_optimizer", None)
    name = f"{type(inner).__name__} in LossScaleOptimizer" if inner is not None else type(opt).__name__
    layers = [layer for layer in tf_internals.flatten_layers(model, include_self=False) if layer.weights]
    compute = layers[0].compute_dtype if layers else model.compute_dtype
    xla = ("forward and gradients (all-reduce outside)" if model.__dict__.get("_spark_imagenet_split_xla")
           else "the whole step" if model.jit_compile else "off")
    return f"{name}, compute {compute}, XLA: {xla}"


def _check(learning_rate: Any, optimizer: str, momentum: Any, weight_decay: Any, label_smoothing: Any) -> bool:
    """Validate compile_model's arguments; return whether ``learning_rate`` is a schedule."""
    schedule = isinstance(learning_rate, keras.optimizers.schedules.LearningRateSchedule)
    if not schedule and (not isinstance(learning_rate, (int, float)) or not learning_rate > 0):
        raise ConfigError(f"--learning-rate must be a positive number, got {learning_rate!r}",
                          key="learning_rate", value=learning_rate)
    if optimizer not in OPTIMIZERS:
        raise ConfigError(f"optimizer (--optimizer) must be one of {', '.join(OPTIMIZERS)}, got {optimizer!r}",
                          key="optimizer", value=optimizer)
    if not isinstance(momentum, (int, float)) or not 0 <= momentum < 1:
        raise ConfigError(f"momentum (--momentum) must be in [0, 1), got {momentum!r}", key="momentum", value=momentum)
    if not isinstance(weight_decay, (int, float)) or not weight_decay >= 0:
        raise ConfigError(f"weight_decay (--weight-decay) must be a number >= 0, got {weight_decay!r}",
                          key="weight_decay", value=weight_decay)
    if not isinstance(label_smoothing, (int, float)) or not 0 <= label_smoothing < 1:
        raise ConfigError(f"label_smoothing (--label-smoothing) must be in [0, 1), got {label_smoothing!r}",
                          key="label_smoothing", value=label_smoothing)
    return schedule


def _loss_scaled(model: keras.Model, opt: keras.optimizers.Optimizer) -> keras.optimizers.Optimizer:
    """``opt`` in a dynamic ``LossScaleOptimizer`` when the model or global policy is ``mixed_float16``
    (tf-keras' compile would wrap it too; doing it here makes it explicit and independent of the model's own
    policy)."""
    policies = {keras.mixed_precision.global_policy().name, getattr(model.dtype_policy, "name", None)}
    if "mixed_float16" in policies:
        return keras.mixed_precision.LossScaleOptimizer(opt)
    return opt


def compile_model(model: keras.Model, learning_rate: float | keras.optimizers.schedules.LearningRateSchedule, *,
                  optimizer: str = "sgd", momentum: float = MOMENTUM, weight_decay: float = 0.0,
                  label_smoothing: float = 0.0, jit_compile: bool = False) -> keras.Model:
    """Compile a model for training and exact weighted evaluation.

    Optimizer: ``"sgd"``, ``SGD(learning_rate, momentum)`` with the L2 term of the module doc; ``"lars"``,
    :class:`~spark_imagenet.training.worker.optimizers.LARS` with the decay in its update. Under ``mixed_float16``
    it is wrapped in a dynamic ``LossScaleOptimizer`` (``model.optimizer.inner_optimizer`` is then the SGD or
    LARS). Loss: ``SparseCategoricalCrossentropy(from_logits=True)``, or with ``label_smoothing > 0``
    :class:`SmoothedSparseCrossentropy`; plus the weight-decay term.

    Metrics (all in ``weighted_metrics``, so they honour the sample weights of the evaluation dataset, whose
    zero-weight padding rows then count for nothing; ``tf_keras`` passes sample weights only to
    ``weighted_metrics``):

    * ``top1``: ``SparseCategoricalAccuracy`` (argmax of the logits == label).
    * ``top5``: ``SparseTopKCategoricalAccuracy(k=5)`` (with fewer than 5 classes it is 1.0).
    * ``xent``: ``SparseCategoricalCrossentropy(from_logits=True)``, the weighted mean cross-entropy per
      example, unsmoothed and without weight decay: the exact validation loss (Keras' own ``loss`` adds
      both and divides by the batch including padding rows).

    Under MultiWorkerMirroredStrategy the metric states are summed over all workers.

    Args:
        model: an uncompiled model (built inside the strategy scope if any; with float32 logits under a mixed
            policy, see :func:`float32_logits`); call this inside the same scope.
        learning_rate: the rate (> 0), or a schedule of the optimizer's step
            (:class:`~spark_imagenet.training.worker.keras_schedule.KerasSchedule`).
        optimizer: ``"sgd"`` or ``"lars"``.
        momentum: momentum in [0, 1).
        weight_decay: ``wd`` >= 0, the gradient term ``wd * w`` on the conv and dense kernels.
        label_smoothing: in [0, 1); 0 = the plain cross-entropy.
        jit_compile: compile with XLA (runs on CPU too): with one replica the whole train, test and predict
            steps (``model.compile(jit_compile=True)``); with several the forward pass, loss and gradients of
            the train step, the all-reduce and update outside XLA (module doc).

    Returns:
        The same model, compiled.

    Raises:
        ConfigError: a value out of range; the message names the option (``--learning-rate``, ``--optimizer``,
            ``--momentum``, ``--weight-decay``, ``--label-smoothing``).
    """
    schedule = _check(learning_rate, optimizer, momentum, weight_decay, label_smoothing)
    rate = learning_rate if schedule else float(learning_rate)
    if optimizer == "lars":
        from spark_imagenet.training.worker.optimizers import LARS

        opt = LARS(rate, momentum=float(momentum), weight_decay=float(weight_decay))
    else:
        from spark_imagenet.training.worker.optimizers import DecayedSGD

        opt = DecayedSGD(rate, momentum=float(momentum), weight_decay=float(weight_decay),
                         decayed=decayed_kernels(model))
    loss = (SmoothedSparseCrossentropy(float(label_smoothing)) if label_smoothing > 0
            else keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    whole_step = _set_steps(model, bool(jit_compile))
    model.compile(
        optimizer=_loss_scaled(model, opt),
        loss=loss,
        weighted_metrics=[
            keras.metrics.SparseCategoricalAccuracy(name="top1"),
            keras.metrics.SparseTopKCategoricalAccuracy(k=5, name="top5"),
            keras.metrics.SparseCategoricalCrossentropy(from_logits=True, name="xent"),
        ],
        jit_compile=whole_step,
    )
    return model


__all__ = ["KERNEL_ATTRIBUTES", "MOMENTUM", "OPTIMIZERS", "PRECISIONS", "SmoothedSparseCrossentropy",
           "compile_model", "decayed_kernels", "describe_compiled", "float32_logits", "normalize_in_steps", "set_precision"]
