"""Every check before the barrier stage, in one place; each returns findings instead of raising or logging.

A check returns a :class:`~.findings.Finding` (``ok``, ``warning`` or ``problem``, with its message; a problem
carries the error to raise). The checks run in three phases (:mod:`.phases`), each one function returning
:class:`~.findings.Findings`:

1. :func:`~.phases.check_before_spark`: what the settings alone tell, before any JVM starts;
2. :func:`~.phases.check_folders` and :func:`~.phases.check_plan`: the run's folders, then the planned job
   (the dataset's listing, the resume point found once, tracking, settings without effect);
3. :func:`~.phases.check_job`: the session's facts read once (:class:`~.session.SessionFacts`) and the job
   checked against them (slots, dynamic allocation, reach from the executors, encryption, GPUs), giving the
   :class:`~.phases.CheckedJob` the launch takes.

The driver raises the first problem and logs the warnings; ``spark-imagenet doctor`` prints every finding.
The modules: :mod:`.findings` (the type), :mod:`.rules` (the checks of plain values), :mod:`.gpus` (Spark's
GPU settings), :mod:`.session` (the session's facts and their checks), :mod:`.phases`.
"""

from spark_imagenet.training.driver.preflight.findings import Finding, Findings
from spark_imagenet.training.driver.preflight.gpus import check_gpu_conf
from spark_imagenet.training.driver.preflight.phases import (
    CheckedJob,
    check_before_spark,
    check_folders,
    check_job,
    check_plan,
    check_reach,
    check_settings,
    find_resume,
)
from spark_imagenet.training.driver.preflight.rules import (
    NETWORK_ENCRYPTION_KEYS,
    check_dataset_reachable,
    check_encryption,
    check_output_reachable,
    check_output_unused,
    check_results_path,
    check_slots_of_master_url,
    check_train_shards,
    check_yarn_conf,
)
from spark_imagenet.training.driver.preflight.session import (
    SessionFacts,
    available_slots,
    barrier_timeout_seconds,
    check_session,
    executor_wait_seconds,
    free_slots,
    read_session_facts,
    slots_from_master,
    spark_context,
    spark_seconds,
)

__all__ = [
    "available_slots", "barrier_timeout_seconds", "check_before_spark", "check_dataset_reachable", "check_encryption",
    "check_folders", "check_gpu_conf", "check_job", "check_output_reachable", "check_output_unused", "check_plan",
    "check_reach", "check_results_path", "check_session", "check_settings", "check_slots_of_master_url",
    "check_train_shards", "check_yarn_conf", "CheckedJob", "executor_wait_seconds", "find_resume", "Finding",
    "Findings", "free_slots", "NETWORK_ENCRYPTION_KEYS", "read_session_facts", "SessionFacts", "slots_from_master",
    "spark_context", "spark_seconds",
]
