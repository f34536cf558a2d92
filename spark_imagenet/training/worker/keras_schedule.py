"""A :class:`spark_imagenet.training.job.schedules.Schedule` as a Keras learning-rate schedule.

This module imports TensorFlow (through ``tf_keras``), so only the TensorFlow worker process and tests import
it, never the driver.

:class:`KerasSchedule` computes exactly the formulas of :mod:`spark_imagenet.training.job.schedules` with TF ops on
the optimizer's step (``iterations``, int64): in float64, cast to float32 at the end, so it agrees with
:meth:`Schedule.at` to float32 rounding even where the cosine is near 0. Give it to the optimizer
(``SGD(learning_rate=KerasSchedule(schedule), ...)``): tf-keras evaluates it at ``iterations`` before each
update (``optimizer.learning_rate`` then holds the rate of the last step), and since ``iterations`` is in the
optimizer's checkpoint, a resumed run continues with the rate of the step it resumes at. The rate of the next
step is ``schedule(optimizer.iterations)`` with the :class:`KerasSchedule` at hand (for TensorBoard).

It is registered as ``spark_imagenet>KerasSchedule``, so a ``.keras`` model saved with its optimizer reloads
with ``tf_keras.models.load_model`` once this module is imported (no ``custom_objects`` needed).
"""

from __future__ import annotations

import math
from typing import Any


import tensorflow as tf  # noqa: E402
import tf_keras as keras  # noqa: E402

from spark_imagenet.training.job.schedules import Schedule  # noqa: E402


def _warmup_or(s: Schedule, step: tf.Tensor, after: tf.Tensor) -> tf.Tensor:
    """``peak * (step + 1) / W`` for ``step < W``, else ``after`` (float64 tensors)."""
    if not s.warmup_steps:
        return after
    warm = tf.constant(s.peak, tf.float64) * (step + 1.0) / float(s.warmup_steps)
    return tf.where(step < float(s.warmup_steps), warm, after)


def _step_decay(s: Schedule, step: tf.Tensor) -> tf.Tensor:
    """``peak / factor ** k``, ``k`` the boundary steps ``<= step`` (the same values as :meth:`Schedule.at`)."""
    boundaries = tf.constant(s.boundary_steps, tf.float64, shape=[len(s.boundary_steps)])
    k = tf.reduce_sum(tf.cast(boundaries <= step, tf.int32))
    return tf.gather(tf.constant(s.step_values, tf.float64), k)


def _cosine_decay(s: Schedule, step: tf.Tensor) -> tf.Tensor:
    """``peak * 0.5 * (1 + cos(pi * t))``, ``t`` the fraction of the post-warm-up steps done; 0 from step T."""
    span = float(max(1, s.total_steps - s.warmup_steps))
    t = tf.minimum(tf.constant(1.0, tf.float64), (step - float(s.warmup_steps)) / span)
    value = tf.constant(s.peak, tf.float64) * 0.5 * (1.0 + tf.cos(math.pi * t))
    return tf.where(step >= float(s.total_steps), tf.constant(0.0, tf.float64), value)


def learning_rate_at(s: Schedule, step: Any) -> tf.Tensor:
    """The learning rate of a step, with TF ops (usable inside ``tf.function``).

    Args:
        s (Schedule): the schedule.
        step (tf.Tensor | int): the 0-based global step (the optimizer's ``iterations``: int64), a scalar.

    Returns:
        tf.Tensor: float32 scalar, :meth:`Schedule.at` of ``step`` (to float32 rounding).
    """
    step = tf.cast(tf.convert_to_tensor(step), tf.float64)  # exact for any step below 2**53
    if s.kind == "step":
        after = _step_decay(s, step)
    elif s.kind == "cosine":
        after = _cosine_decay(s, step)
    else:
        after = tf.constant(s.peak, tf.float64)
    return tf.cast(_warmup_or(s, step, after), tf.float32)


@keras.saving.register_keras_serializable(package="spark_imagenet")
class KerasSchedule(keras.optimizers.schedules.LearningRateSchedule):
    """A :class:`Schedule` for a tf-keras optimizer: ``KerasSchedule(schedule)(step) == schedule.at(step)``.

    Args:
        schedule (Schedule): the schedule to follow.
        name (str): a name for the ops, default ``"KerasSchedule"``.

    Raises:
        TypeError: ``schedule`` is not a :class:`Schedule`.
    """

    def __init__(self, schedule: Schedule, name: str = "KerasSchedule"):
        super().__init__()
        if not isinstance(schedule, Schedule):
            raise TypeError(f"KerasSchedule takes a spark_imagenet.training.job.schedules.Schedule, got "
                            f"{type(schedule).__name__}")
        self.schedule = schedule
        self.name = name

    def __call__(self, step: Any) -> tf.Tensor:
        """The learning rate of ``step``.

        Args:
            step (tf.Tensor | int): the 0-based global step (the optimizer's ``iterations``), a scalar.

        Returns:
            tf.Tensor: float32 scalar learning rate.
        """
        with tf.name_scope(self.name):
            return learning_rate_at(self.schedule, step)

    def get_config(self) -> dict[str, Any]:
        """``{"schedule": Schedule.to_json(), "name": name}`` (JSON-serialisable)."""
        return {"schedule": self.schedule.to_json(), "name": self.name}

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> "KerasSchedule":
        """Inverse of :meth:`get_config`.

        Args:
            config (dict): as :meth:`get_config` returns it.

        Returns:
            KerasSchedule: the schedule.

        Raises:
            ConfigError: the ``schedule`` entry is not a valid schedule (see :meth:`Schedule.from_json`).
        """
        schedule = Schedule.from_json(config["schedule"], "KerasSchedule config")
        return cls(schedule, name=config.get("name", "KerasSchedule"))


__all__ = ["KerasSchedule", "learning_rate_at"]
