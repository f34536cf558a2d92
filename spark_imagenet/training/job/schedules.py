"""Learning-rate schedules as pure functions of the global optimizer step.

No TensorFlow here: the driver imports this module to check the settings and print the resolved peak learning
rate before Spark starts; the TensorFlow worker process wraps a :class:`Schedule` in
:class:`spark_imagenet.training.worker.keras_schedule.KerasSchedule`, which computes the same formula with TF ops on the
optimizer's ``iterations``. Because the rate depends on the global step only, a run resumed from a checkpoint
(which restores ``iterations``) continues exactly where it stopped, and the rate of any step can be logged.

Definitions (``step`` is 0-based: the value of the optimizer's ``iterations`` before the update it is used for):

* ``peak`` = ``base_lr * global_batch / 256`` with ``scaling="linear"`` (the linear scaling rule of Goyal et al.
  2017, "Accurate, Large Minibatch SGD: Training ImageNet in 1 Hour": the rate is stated per 256 images), or
  ``base_lr`` with ``scaling="none"``.
* ``T`` = ``epochs * steps_per_epoch``, the training steps; ``W`` = ``warmup_epochs * steps_per_epoch`` rounded
  to the nearest step (halves up), the warm-up steps (``W <= T``).
* warm-up (Goyal et al. 2017, section 2.2, gradual warm-up): ``lr(step) = peak * (step + 1) / W`` for
  ``step < W``, i.e. ``peak / W`` at step 0 (never 0) up to ``peak`` at step ``W - 1``.
* after the warm-up, by ``kind``:

  * ``"constant"``: ``peak``.
  * ``"step"``: ``peak / factor ** k``, ``k`` the number of boundary steps ``<= step``. A boundary at epoch ``b``
    is step ``round(b * steps_per_epoch)`` (halves up): the first step of the epoch after it trains at the
    lower rate. Default boundaries (``boundaries=()``): Krizhevsky et al. 2012 ("ImageNet Classification with
    Deep Convolutional Neural Networks", section 5) divided the rate by 10 three times over about 90 epochs;
    the common reading of that shape is drops at epochs 30, 60 and 80 of 90, here scaled to the run:
    ``round(epochs * b / 90)`` for ``b`` in 30, 60, 80, those that round to 0 left out and duplicates merged
    (90 epochs: 30, 60, 80; 10 epochs: 3, 7, 9; 1 epoch: 1). ``epochs / 3``, ``2 * epochs / 3`` and
    ``8 * epochs / 9`` never end in exactly .5 for an integer ``epochs``, so the rounding rule never matters.
  * ``"cosine"``: ``peak * 0.5 * (1 + cos(pi * t))`` with ``t = min(1, (step - W) / max(1, T - W))``, the
    fraction of the post-warm-up steps done (Loshchilov and Hutter 2017, "SGDR: Stochastic Gradient Descent with
    Warm Restarts", without restarts): ``peak`` at step ``W``, ``peak / 2`` half-way, and 0 at step ``T`` (the
    step after the last one; every step ``>= T`` is 0). There is no floor: the last trained step ``T - 1`` gets
    ``peak * 0.5 * (1 + cos(pi * (T - 1 - W) / (T - W)))``, small but above 0.

JSON form (``format_version`` 1), e.g. inside a worker spec::

    {"format": "spark-imagenet-lr-schedule", "format_version": 1, "kind": "step", "base_lr": 0.01,
     "global_batch": 1024, "scaling": "linear", "steps_per_epoch": 50, "epochs": 90, "warmup_epochs": 5.0,
     "boundaries": [], "factor": 10.0}
"""

from __future__ import annotations

import dataclasses
import math
import numbers
import operator
from typing import Any

from spark_imagenet.errors import ConfigError
from spark_imagenet.storage.envelope import Envelope

#: The JSON form of a :class:`Schedule`.
ENVELOPE = Envelope("spark-imagenet-lr-schedule", 1, "spark-imagenet learning-rate schedule",
                    remedy="use the same spark-imagenet version on the driver and executors")
#: Schedule kinds (``--lr-schedule``).
KINDS = ("constant", "step", "cosine")
#: Learning-rate scaling rules (``--lr-scaling``).
SCALINGS = ("linear", "none")
#: Images the base learning rate is stated for (Goyal et al. 2017: ``lr = 0.1 * batch / 256``).
REFERENCE_BATCH = 256
#: The default drops of the step schedule, as epochs of a 90-epoch run (Krizhevsky et al. 2012, read as 30/60/80).
DEFAULT_BOUNDARIES_OF_90 = (30, 60, 80)
#: How error messages name each field: the command-line option that sets it.
OPTIONS = {
    "kind": "--lr-schedule",
    "base_lr": "--learning-rate",
    "global_batch": "the global batch (--workers x --batch-size)",
    "scaling": "--lr-scaling",
    "steps_per_epoch": "the steps per epoch",
    "epochs": "--epochs",
    "warmup_epochs": "--warmup-epochs",
    "boundaries": "--lr-boundaries",
    "factor": "the step schedule's factor",
}


def round_half_up(x: float) -> int:
    """``x`` rounded to the nearest integer, halves up (not Python's halves-to-even).

    Args:
        x (float): a finite number.

    Returns:
        int: ``floor(x + 0.5)``.
    """
    return math.floor(x + 0.5)


def epochs_to_steps(epochs: float, steps_per_epoch: int) -> int:
    """The global step at which a number of epochs is done.

    Args:
        epochs (float): epochs, >= 0 (fractions allowed).
        steps_per_epoch (int): optimizer steps per epoch.

    Returns:
        int: ``epochs * steps_per_epoch`` rounded to the nearest step (halves up).
    """
    return round_half_up(epochs * steps_per_epoch)


def default_boundaries(epochs: int) -> tuple[int, ...]:
    """The step schedule's default drops for a run of ``epochs`` epochs (see the module doc).

    Args:
        epochs (int): training epochs, >= 1.

    Returns:
        tuple[int, ...]: ``round(epochs * b / 90)`` for ``b`` in 30, 60, 80, increasing, zeros left out and
        duplicates merged: ``(30, 60, 80)`` for 90 epochs, ``(3, 7, 9)`` for 10, ``(1,)`` for 1.
    """
    rounded = (round(epochs * b / 90) for b in DEFAULT_BOUNDARIES_OF_90)
    return tuple(sorted({b for b in rounded if b > 0}))


def scaled_peak(base_lr: float, global_batch: int, scaling: str) -> float:
    """The peak learning rate (after any warm-up, before any decay).

    Args:
        base_lr (float): learning rate per 256 images (``--learning-rate``).
        global_batch (int): images per synchronous step of the whole cluster.
        scaling (str): ``"linear"`` (Goyal et al. 2017) or ``"none"``.

    Returns:
        float: ``base_lr * global_batch / 256`` for ``"linear"``, ``base_lr`` for ``"none"``.
    """
    return base_lr * global_batch / REFERENCE_BATCH if scaling == "linear" else float(base_lr)


def _is_int(x: Any) -> bool:
    return isinstance(x, numbers.Integral) and not isinstance(x, bool)


def _is_real(x: Any) -> bool:
    return isinstance(x, numbers.Real) and not isinstance(x, bool) and math.isfinite(x)


def _number(x: Any) -> str:
    """A number as the log lines show it: ``5`` rather than ``5.0``, ``2.222`` rather than ``2.2222222222222223``
    (4 significant digits), else ``repr``."""
    if _is_real(x) and float(x).is_integer():
        return str(int(x))
    return f"{float(x):.4g}" if _is_real(x) else repr(x)


def _epochs(x: float) -> str:
    """``1 epoch``, ``5 epochs``, ``0.5 epochs``."""
    return f"{_number(x)} epoch" + ("" if x == 1 else "s")


def _field_problems(s: "Schedule") -> list[str]:
    """The problems of each field on its own (types and ranges), each naming its option."""
    problems = []
    if s.kind not in KINDS:
        problems.append(f"{OPTIONS['kind']} must be one of {', '.join(KINDS)}, got {s.kind!r}")
    if s.scaling not in SCALINGS:
        problems.append(f"{OPTIONS['scaling']} must be one of {', '.join(SCALINGS)}, got {s.scaling!r}")
    if not (_is_real(s.base_lr) and s.base_lr > 0):
        problems.append(f"{OPTIONS['base_lr']} must be a positive number, got {s.base_lr!r}")
    for name in ("global_batch", "steps_per_epoch", "epochs"):
        value = getattr(s, name)
        if not (_is_int(value) and value >= 1):
            problems.append(f"{OPTIONS[name]} must be a positive integer, got {value!r}")
    if not (_is_real(s.warmup_epochs) and s.warmup_epochs >= 0):
        problems.append(f"{OPTIONS['warmup_epochs']} must be a number >= 0, got {s.warmup_epochs!r}")
    if not (_is_real(s.factor) and s.factor > 1):
        problems.append(f"{OPTIONS['factor']} (what the step schedule divides by) must be a number > 1, "
                        f"got {s.factor!r}")
    if not (isinstance(s.boundaries, tuple) and all(_is_real(b) for b in s.boundaries)):
        problems.append(f"{OPTIONS['boundaries']} must be epochs (numbers), got {s.boundaries!r}")
    return problems


def _boundary_problems(s: "Schedule") -> list[str]:
    """The problems of the step schedule's boundaries against the run (fields already valid on their own)."""
    opt = OPTIONS["boundaries"]
    if s.kind != "step":
        return [f"{opt} apply only to {OPTIONS['kind']} step, not {s.kind}"] if s.boundaries else []
    given = bool(s.boundaries)
    epochs = s.boundary_epochs
    source = f"{opt} {', '.join(map(_number, epochs))}" if given else (
        f"the default drops at epochs {', '.join(map(_number, epochs))} (30, 60, 80 of 90 scaled to {s.epochs} "
        f"epochs)")
    problems = []
    outside = [b for b in epochs if not 0 < b <= s.epochs]
    if outside:
        problems.append(f"{source}: epoch(s) {', '.join(map(_number, outside))} outside (0, {s.epochs}] "
                        f"({OPTIONS['epochs']})")
    if given and list(epochs) != sorted(set(epochs)):
        problems.append(f"{source}: must be strictly increasing")
    steps = [epochs_to_steps(b, s.steps_per_epoch) for b in epochs]
    if not problems and len(set(steps)) != len(steps):
        problems.append(f"{source}: two boundaries fall on the same step ({s.steps_per_epoch} steps per epoch)")
    early = [b for b, step in zip(epochs, steps) if step <= s.warmup_steps]
    if not problems and early:
        what = (f"within the {_number(s.warmup_epochs)}-epoch warm-up ({OPTIONS['warmup_epochs']}, "
                f"{s.warmup_steps} steps)") if s.warmup_steps else "before the first step"
        # the default drops are not an option of their own: name what the user can change instead
        later = f"give later {opt}" if given else f"train more {OPTIONS['epochs']}, or use {OPTIONS['kind']} cosine"
        problems.append(f"{source}: epoch(s) {', '.join(map(_number, early))} fall {what}; a drop must come "
                        f"after the warm-up (shorten the warm-up or {later})")
    return problems


def problems_of(s: "Schedule") -> list[str]:
    """Every reason a schedule cannot work, each naming the option to change.

    Args:
        s (Schedule): the schedule to check.

    Returns:
        list[str]: the problems; empty if the schedule is valid.
    """
    problems = _field_problems(s)
    if problems:
        return problems
    if s.warmup_steps > s.total_steps:
        problems.append(f"{OPTIONS['warmup_epochs']} {_number(s.warmup_epochs)} ({s.warmup_steps} steps) is longer "
                        f"than training ({OPTIONS['epochs']} {s.epochs}, {s.total_steps} steps)")
        return problems
    return _boundary_problems(s)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Schedule:
    """A learning-rate schedule: the rate of every optimizer step (formulas in the module doc).

    All fields are keyword-only.

    Attributes:
        kind (str): ``"constant"``, ``"step"`` or ``"cosine"`` (``--lr-schedule``).
        base_lr (float): the learning rate per 256 images (``--learning-rate``), > 0.
        global_batch (int): images per synchronous step of the whole cluster (workers x per-worker batch), >= 1.
        steps_per_epoch (int): optimizer steps per epoch, >= 1.
        epochs (int): training epochs (``--epochs``), >= 1.
        scaling (str): ``"linear"`` (default: peak = ``base_lr * global_batch / 256``, Goyal et al. 2017) or
            ``"none"`` (peak = ``base_lr``) (``--lr-scaling``).
        warmup_epochs (float): epochs of linear warm-up (``--warmup-epochs``), >= 0, at most ``epochs``; default 0.
        boundaries (tuple[float, ...]): for ``"step"`` only: the epochs after which the rate is divided by
            ``factor``, strictly increasing, in (0, epochs], after the warm-up; empty (default): 30, 60, 80 of 90
            scaled to ``epochs`` (see :func:`default_boundaries`). A list is accepted and stored as a tuple.
        factor (float): what the step schedule divides by at each boundary, > 1; default 10.

    Raises:
        ConfigError: an invalid value or combination, every problem listed with the option that sets it: an
            unknown kind or scaling, a non-positive rate, batch, step count or epoch count, a negative warm-up
            or one longer than training, a boundary outside (0, epochs], not increasing, within the warm-up or
            given for a kind other than ``"step"``, a factor not above 1.
    """

    kind: str
    base_lr: float
    global_batch: int
    steps_per_epoch: int
    epochs: int
    scaling: str = "linear"
    warmup_epochs: float = 0.0
    boundaries: tuple[float, ...] = ()
    factor: float = 10.0

    def __post_init__(self) -> None:
        if isinstance(self.boundaries, list):
            object.__setattr__(self, "boundaries", tuple(self.boundaries))
        problems = problems_of(self)
        if problems:
            raise ConfigError("invalid learning-rate schedule: " + "; ".join(problems))
        for name in ("base_lr", "warmup_epochs", "factor"):
            if _is_int(getattr(self, name)):
                object.__setattr__(self, name, float(getattr(self, name)))

    # ------------------------------------------------------------ derived values
    @property
    def peak(self) -> float:
        """float: the learning rate after the warm-up, before any decay (see :func:`scaled_peak`)."""
        return scaled_peak(self.base_lr, self.global_batch, self.scaling)

    @property
    def total_steps(self) -> int:
        """int: ``epochs * steps_per_epoch``, the optimizer steps of the whole run."""
        return self.epochs * self.steps_per_epoch

    @property
    def warmup_steps(self) -> int:
        """int: the warm-up's steps, ``warmup_epochs * steps_per_epoch`` rounded to the nearest step (halves up)."""
        return epochs_to_steps(self.warmup_epochs, self.steps_per_epoch)

    @property
    def boundary_epochs(self) -> tuple[float, ...]:
        """tuple[float, ...]: the epochs of the step schedule's drops (``boundaries`` or the default); ``()``
        for the other kinds."""
        if self.kind != "step":
            return ()
        return self.boundaries or default_boundaries(self.epochs)

    @property
    def boundary_steps(self) -> tuple[int, ...]:
        """tuple[int, ...]: the steps at which the step schedule drops: step ``boundary_steps[i]`` is the first
        one at ``peak / factor ** (i + 1)``; ``()`` for the other kinds."""
        return tuple(epochs_to_steps(b, self.steps_per_epoch) for b in self.boundary_epochs)

    @property
    def step_values(self) -> tuple[float, ...]:
        """tuple[float, ...]: the step schedule's rates after the warm-up: ``peak / factor ** k`` for ``k`` =
        0 .. len(boundary_steps); ``(peak,)`` for the other kinds."""
        return tuple(self.peak / self.factor ** k for k in range(len(self.boundary_steps) + 1))

    # ------------------------------------------------------------ the schedule
    def at(self, step: int) -> float:
        """The learning rate of one optimizer step.

        Args:
            step (int): 0-based global step: the optimizer's ``iterations`` before the update (>= 0; steps at
                or past ``total_steps`` are allowed: the rate stays at its last value, 0 for ``"cosine"``).

        Returns:
            float: the learning rate (formulas in the module doc).

        Raises:
            ValueError: ``step`` negative.
            TypeError: ``step`` not an integer.
        """
        step = operator.index(step)
        if step < 0:
            raise ValueError(f"a step is >= 0, got {step}")
        if step < self.warmup_steps:
            return self.peak * (step + 1) / self.warmup_steps
        if self.kind == "step":
            return self.step_values[sum(1 for b in self.boundary_steps if b <= step)]
        if self.kind == "cosine":
            if step >= self.total_steps:
                return 0.0
            t = min(1.0, (step - self.warmup_steps) / max(1, self.total_steps - self.warmup_steps))
            return self.peak * 0.5 * (1.0 + math.cos(math.pi * t))
        return self.peak

    def describe(self) -> str:
        """One log line, e.g. ``lr: step schedule, peak 0.04 (0.01 per 256 images x 1024 / 256, linear scaling),
        warm-up 5 epochs (250 steps), /10 at epochs 30, 60, 80``.

        Returns:
            str: the kind, the peak and how it was derived, the warm-up and the decay.
        """
        if self.scaling == "linear":
            how = f"{self.base_lr:g} per 256 images x {self.global_batch} / 256, linear scaling"
        else:
            how = "no scaling"
        parts = [f"lr: {self.kind} schedule, peak {self.peak:.6g} ({how})"]
        if self.warmup_steps:
            parts.append(f"warm-up {_epochs(self.warmup_epochs)} ({self.warmup_steps} steps)")
        else:
            parts.append("no warm-up")
        if self.kind == "step":
            parts.append(f"/{_number(self.factor)} at epochs {', '.join(map(_number, self.boundary_epochs))}"
                         + ("" if self.boundaries else " (default)"))
        elif self.kind == "cosine":
            parts.append(f"cosine decay to 0 at step {self.total_steps} (end of {_epochs(self.epochs)})")
        return ", ".join(parts)

    # ------------------------------------------------------------ JSON
    def to_json(self) -> dict[str, Any]:
        """The schedule as a JSON-serialisable dict (format of the module doc; ``boundaries`` as given)."""
        data = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        data["boundaries"] = list(self.boundaries)
        return ENVELOPE.to_json(data)

    @classmethod
    def from_json(cls, data: Any, where: str = "lr schedule") -> "Schedule":
        """Inverse of :meth:`to_json`.

        Args:
            data (dict): the decoded JSON object.
            where (str): what holds it, named in error messages.

        Returns:
            Schedule: the schedule, validated.

        Raises:
            ConfigError: not an object of this format and version, a missing or unknown field, or an invalid
                value (as the class).
        """
        fields = ENVELOPE.fields_for(cls, data, where)
        if isinstance(fields.get("boundaries"), list):
            fields["boundaries"] = tuple(fields["boundaries"])
        try:
            return cls(**fields)
        except ConfigError as e:
            raise ConfigError(f"{where}: {e}") from e


__all__ = ["DEFAULT_BOUNDARIES_OF_90", "ENVELOPE", "KINDS", "OPTIONS", "REFERENCE_BATCH",
           "SCALINGS", "Schedule", "default_boundaries", "epochs_to_steps", "extension_note", "problems_of",
           "round_half_up", "scaled_peak", "schedule_for"]


def schedule_for(config: Any, steps_per_epoch: int) -> Schedule:
    """The :class:`Schedule` of a training job (a :class:`~spark_imagenet.training.job.config.TrainConfig`) whose
    epochs have ``steps_per_epoch`` steps.

    Raises:
        ConfigError: as :class:`Schedule` (naming the options).
    """
    return Schedule(kind=config.recipe.lr_schedule, base_lr=config.recipe.learning_rate, global_batch=config.global_batch_size,
                    scaling=config.recipe.lr_scaling, steps_per_epoch=steps_per_epoch, epochs=config.recipe.epochs,
                    warmup_epochs=config.recipe.warmup_epochs, boundaries=tuple(config.recipe.lr_boundaries))


def extension_note(schedule: Schedule, planned_epochs: int, epochs_done: int) -> str | None:
    """What changes for the learning rate when a run planned for ``planned_epochs`` resumes under ``schedule``.

    The schedule is a function of the step and of ``--epochs``: a run resumed with another ``--epochs`` (a
    finished run extended) follows the schedule of the new length from the resumed step on, so a cosine
    schedule (or the step schedule's default drops) is stretched and the rate jumps back up (cosine over 4
    epochs ends near 0; the same step of a 10-epoch cosine is well above it). That is kept (a fixed end would
    train the added epochs at a rate near 0) and said in one line.

    Args:
        schedule: the resumed job's schedule (``epochs`` = the new ``--epochs``).
        planned_epochs: the ``--epochs`` of the run that wrote the checkpoint.
        epochs_done: the epochs the checkpoint holds (>= 1).

    Returns:
        str | None: one line (``"lr: --epochs 10 instead of the checkpoint's 4 stretches the cosine schedule
        to 10 epochs: the learning rate goes from 2e-05 (the last step trained) to 0.00123 at epoch 5 (the
        4-epoch schedule had 0)"``), or None when the rate of the next step is what the checkpoint's run
        planned (the same ``--epochs``, a constant schedule, fixed ``--lr-boundaries``).

    Example::

        >>> extension_note(Schedule(kind="cosine", base_lr=0.01, global_batch=256, steps_per_epoch=10, epochs=10),
        ...                planned_epochs=4, epochs_done=4)
        "lr: --epochs 10 instead of the checkpoint's 4 stretches the cosine schedule to 10 epochs: the learning
        rate goes from 1.54e-05 (the last step trained) to 0.00655 at epoch 5 (the 4-epoch schedule had 0)"
    """
    if planned_epochs == schedule.epochs or epochs_done >= schedule.epochs:
        return None
    try:
        planned = dataclasses.replace(schedule, epochs=planned_epochs)
    except ConfigError:  # the new schedule's settings would not fit the old length: nothing to compare
        return None
    step = epochs_done * schedule.steps_per_epoch
    was, now = planned.at(step), schedule.at(step)
    if math.isclose(was, now, rel_tol=1e-6, abs_tol=1e-12):
        return None
    return (f"lr: {OPTIONS['epochs']} {schedule.epochs} instead of the checkpoint's {planned_epochs} stretches the "
            f"{schedule.kind} schedule to {schedule.epochs} epochs: the learning rate goes from "
            f"{planned.at(step - 1):.3g} (the last step trained) to {now:.3g} at epoch {epochs_done + 1} "
            f"(the {planned_epochs}-epoch schedule had {was:.3g})")
