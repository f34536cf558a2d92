"""The optimizers of training: :class:`LARS` (layer-wise adaptive rate scaling) and :class:`DecayedSGD` (SGD with
the L2 weight decay inside its step), ``tf_keras`` optimizers (import TensorFlow; worker side only).

Reference: Y. You, I. Gitman, B. Ginsburg, "Large Batch Training of Convolutional Networks" (2017),
arXiv:1708.03888, Algorithm 1 and equation (6); used by You et al. (2017, "ImageNet Training in Minutes") to
train AlexNet at a global batch of 32K. Why our own: tensorflow-addons is end of life and has none; TF Model
Garden's (``tf-models-official``) is a legacy-optimizer class in a heavy package (docs/design.md, 'LARS').

The update of one weight tensor ``w`` with gradient ``g`` (a "layer" of the paper is one weight tensor), at
learning rate ``lr`` (the schedule's value at this step), momentum ``m``, weight decay ``wd`` and trust
coefficient ``eta``::

    local_lr = eta * ||w|| / (||g|| + wd * ||w||)     # 1 where ||w|| or ||g|| is 0
    v        = m * v + lr * local_lr * (g + wd * w)
    w        = w - v

Tensors of rank 0 or 1 (biases, batch-norm gamma and beta) are neither adapted nor decayed: for them
``v = m * v + lr * g`` and ``w = w - v``, plain momentum SGD (the same update as ``tf_keras``' ``SGD``,
written with the opposite sign of ``v``). The weight decay is part of the update, so a model trained with
LARS must not also carry an L2 loss term (:func:`spark_imagenet.training.worker.models.compile.compile_model` adds
none for it).

The velocities are the optimizer's variables ``velocities`` (one per model weight, float32 like the weight):
``tf.train.Checkpoint(optimizer=...)`` saves and restores them with ``iterations``. Under a distribution
strategy tf-keras all-reduces the gradients first and then runs the update per weight on every replica, so
all replicas compute the same norms and stay equal. Registered for ``.keras`` saving as
``spark_imagenet>LARS``.
"""

from __future__ import annotations

from typing import Any, Sequence


import tensorflow as tf  # noqa: E402
import tf_keras as keras  # noqa: E402

from spark_imagenet.errors import ConfigError  # noqa: E402

#: The paper's trust coefficient ``eta`` (You, Gitman and Ginsburg 2017, section 4: 0.001).
TRUST_COEFFICIENT = 0.001


def adapted(variable: tf.Variable) -> bool:
    """Whether LARS adapts and decays ``variable``: weight tensors of rank 2 or more (conv and dense kernels);
    rank 0 and 1 (biases, batch-norm gamma/beta) get plain momentum SGD."""
    return variable.shape.rank is None or variable.shape.rank >= 2


@keras.saving.register_keras_serializable(package="spark_imagenet")
class LARS(keras.optimizers.Optimizer):
    """Momentum SGD with a per-tensor learning rate ``eta * ||w|| / (||g|| + wd * ||w||)`` (see the module doc).

    Args:
        learning_rate: float > 0, or a ``LearningRateSchedule`` of the step (the global rate ``lr``).
        momentum: float in [0, 1).
        weight_decay: float >= 0, the ``wd`` of the update (applied to rank >= 2 tensors only).
        trust_coefficient: float > 0, the paper's ``eta``.
        name: the optimizer's name.
        **kwargs: the other arguments of ``tf_keras.optimizers.Optimizer`` (``clipnorm``, ``jit_compile``, ...).

    Raises:
        ConfigError: a hyperparameter out of range (names ``--momentum`` / ``--weight-decay``).
    """

    def __init__(self, learning_rate: Any = 0.1, momentum: float = 0.9, weight_decay: float = 0.0,
                 trust_coefficient: float = TRUST_COEFFICIENT, name: str = "LARS", **kwargs: Any) -> None:
        if not isinstance(momentum, (int, float)) or not 0 <= momentum < 1:
            raise ConfigError(f"momentum (--momentum) must be in [0, 1), got {momentum!r}")
        if not isinstance(weight_decay, (int, float)) or not weight_decay >= 0:
            raise ConfigError(f"weight_decay (--weight-decay) must be a number >= 0, got {weight_decay!r}")
        if not isinstance(trust_coefficient, (int, float)) or not trust_coefficient > 0:
            raise ConfigError(f"LARS trust_coefficient must be a number > 0, got {trust_coefficient!r}")
        kwargs.pop("is_legacy_optimizer", None)  # in get_config of every tf-keras optimizer
        # the base class's own weight_decay is decoupled decay (w -= lr * wd * w before the update): not LARS'
        super().__init__(name=name, weight_decay=None, **kwargs)
        self._learning_rate = self._build_learning_rate(learning_rate)
        self.momentum = float(momentum)
        self.lars_weight_decay = float(weight_decay)
        self.trust_coefficient = float(trust_coefficient)

    def build(self, var_list: list[tf.Variable]) -> None:
        """Create one zero velocity per variable of ``var_list`` (once)."""
        super().build(var_list)
        if getattr(self, "_built", False):
            return
        self.velocities = [self.add_variable_from_reference(v, "velocity") for v in var_list]
        self._built = True

    def local_learning_rate(self, gradient: tf.Tensor, variable: tf.Variable) -> tf.Tensor:
        """``eta * ||w|| / (||g|| + wd * ||w||)``, a scalar of the variable's dtype; 1 where a norm is 0."""
        w_norm = tf.norm(variable)
        g_norm = tf.norm(gradient)
        wd = tf.cast(self.lars_weight_decay, variable.dtype)
        ratio = self.trust_coefficient * w_norm / (g_norm + wd * w_norm)
        return tf.where(tf.logical_and(w_norm > 0, g_norm > 0), ratio, tf.ones_like(ratio))

    def update_step(self, gradient: Any, variable: tf.Variable) -> None:
        """One LARS update of ``variable`` with its (all-reduced) ``gradient`` (dense or ``IndexedSlices``)."""
        lr = tf.cast(self.learning_rate, variable.dtype)
        velocity = self.velocities[self._index_dict[self._var_key(variable)]]
        gradient = tf.convert_to_tensor(gradient)  # an IndexedSlices (embeddings) becomes dense
        if adapted(variable):
            wd = tf.cast(self.lars_weight_decay, variable.dtype)
            step = lr * self.local_learning_rate(gradient, variable) * (gradient + wd * variable)
        else:
            step = lr * gradient
        velocity.assign(self.momentum * velocity + step)
        variable.assign_sub(velocity)

    def get_config(self) -> dict[str, Any]:
        """The constructor's arguments (for ``.keras`` saving)."""
        config = super().get_config()
        config.update({
            "learning_rate": self._serialize_hyperparameter(self._learning_rate),
            "momentum": self.momentum,
            "weight_decay": self.lars_weight_decay,
            "trust_coefficient": self.trust_coefficient,
        })
        return config


@keras.saving.register_keras_serializable(package="spark_imagenet")
class DecayedSGD(keras.optimizers.SGD):
    """SGD with momentum whose update adds ``weight_decay * w`` to the gradient of the decayed variables: the
    gradient of the L2 term ``weight_decay / 2 * sum(w ** 2)``, applied in the optimizer's step instead of
    through the loss.

    The update of each decayed variable is exactly that of plain SGD on the loss plus the L2 term (the same
    velocity, the same step; tests/test_compile.py compares them), without the term's forward pass, its
    backward pass and the full-size temporaries of both. The reported ``loss`` then holds no decay term.

    Args:
        learning_rate: float > 0, or a ``LearningRateSchedule`` of the step.
        momentum: float in [0, 1).
        weight_decay: float >= 0.
        decayed: the variables to decay (:func:`~spark_imagenet.training.worker.models.compile.decayed_kernels`:
            conv and dense kernels); not stored by ``get_config``: a reloaded optimizer decays nothing.
        name: the optimizer's name.
        **kwargs: the other arguments of ``tf_keras.optimizers.SGD``.

    Raises:
        ConfigError: ``weight_decay`` below 0 (names ``--weight-decay``).
    """

    def __init__(self, learning_rate: Any = 0.01, momentum: float = 0.0, weight_decay: float = 0.0,
                 decayed: Sequence[tf.Variable] = (), name: str = "SGD", **kwargs: Any) -> None:
        l2 = kwargs.pop("l2_weight_decay", None)
        if l2 is not None:  # from get_config, whose "weight_decay" is the base class's decoupled decay (None)
            weight_decay = l2
        if not isinstance(weight_decay, (int, float)) or not weight_decay >= 0:
            raise ConfigError(f"weight_decay (--weight-decay) must be a number >= 0, got {weight_decay!r}")
        kwargs.pop("is_legacy_optimizer", None)
        super().__init__(learning_rate=learning_rate, momentum=momentum, name=name, **kwargs)
        self.l2_weight_decay = float(weight_decay)
        self._decayed = {self._var_key(v) for v in decayed}

    def update_step(self, gradient: Any, variable: tf.Variable) -> None:
        """SGD's update of ``variable`` with ``gradient + weight_decay * variable`` when it is decayed."""
        if self.l2_weight_decay and self._var_key(variable) in self._decayed:
            gradient = tf.convert_to_tensor(gradient) + tf.cast(self.l2_weight_decay, variable.dtype) * variable
        super().update_step(gradient, variable)

    def get_config(self) -> dict[str, Any]:
        """SGD's arguments and ``l2_weight_decay`` (for ``.keras`` saving; the decayed variables are not kept)."""
        config = super().get_config()
        config["l2_weight_decay"] = self.l2_weight_decay
        return config


__all__ = ["DecayedSGD", "LARS", "TRUST_COEFFICIENT", "adapted"]
