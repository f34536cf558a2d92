"""spark_imagenet.logs: the console's streams and prefixes, the notebook rule, collect()."""

import logging

from spark_imagenet import logs

TRAINING = logging.getLogger("spark_imagenet.training.driver.launch")
DATA = logging.getLogger("spark_imagenet.dataset.transfer")


def test_the_console_puts_the_training_lines_on_stdout_and_the_data_lines_on_stderr(capsys):
    with logs.console():
        TRAINING.info("training alexnet")
        TRAINING.warning("warning: a worker was lost")
        DATA.info("uploaded 6 shard(s)")
        logging.getLogger("py4j").info("not ours")  # other libraries' loggers are left alone
    TRAINING.info("after the console")  # not shown: the console is gone, INFO is below the root's level
    out, err = capsys.readouterr()
    assert out == "training alexnet\nwarning: a worker was lost\n"
    assert err == "uploaded 6 shard(s)\n"
    package = logging.getLogger("spark_imagenet")
    assert package.handlers == [] and package.propagate and package.level == logging.NOTSET


def test_the_task_and_worker_consoles_prefix_and_choose_their_stream(capsys):
    with logs.task_console(3):
        DATA.info("fetched shard 1")
        TRAINING.info("host: 2 train shard(s)")
    with logs.worker_console():
        TRAINING.info("Epoch 1/1")
    out, err = capsys.readouterr()
    assert err == "[rank 3] fetched shard 1\n[rank 3] host: 2 train shard(s)\n"
    assert out == "Epoch 1/1\n"


def test_no_line_is_printed_twice_through_a_root_handler(capsys):
    root = logging.getLogger()
    handler = logging.StreamHandler()  # a user's own logging set-up (stderr)
    root.addHandler(handler)
    try:
        with logs.console():
            TRAINING.warning("warning: once")
    finally:
        root.removeHandler(handler)
    out, err = capsys.readouterr()
    assert out == "warning: once\n" and err == ""


def test_ensure_console_only_where_logging_is_not_set_up(monkeypatch, capsys):
    package, root = logging.getLogger("spark_imagenet"), logging.getLogger()
    monkeypatch.setattr(root, "handlers", [])  # pytest's own capture handlers out of the way
    monkeypatch.setattr(package, "handlers", [])
    monkeypatch.setattr(package, "propagate", True)
    monkeypatch.setattr(package, "level", logging.NOTSET)
    logs.ensure_console()
    logs.ensure_console()  # once only
    assert len(package.handlers) == 1 and not package.propagate
    TRAINING.info("a notebook sees this")
    assert capsys.readouterr().out == "a notebook sees this\n"

    monkeypatch.setattr(package, "handlers", [])
    monkeypatch.setattr(root, "handlers", [logging.NullHandler()])  # the user configured logging
    logs.ensure_console()
    assert package.handlers == []


def test_collect_gives_the_lines_without_printing_them(capsys):
    with logs.collect() as lines:
        DATA.info("one")
        TRAINING.warning("warning: two")
        DATA.debug("not at INFO")
    DATA.info("after")
    assert lines == ["one", "warning: two"]
    assert capsys.readouterr().out == ""


MLFLOW_UNDER_THE_CONSOLE = """
import logging
from spark_imagenet import logs
with logs.console():
    from mlflow import MlflowClient
    logging.getLogger("mlflow.store").info("an MLflow INFO line")
    logging.getLogger("mlflow.store").warning("an MLflow warning")
    MlflowClient("http://127.0.0.1:1")._tracking_client._log_url("r")  # the end of a run's "View run" lines
"""


def test_the_console_keeps_mlflows_own_lines_off_and_restores_the_environment(monkeypatch):
    import os
    import subprocess
    import sys

    for name, _ in logs.MLFLOW_QUIET_ENV:
        monkeypatch.delenv(name, raising=False)
    p = subprocess.run([sys.executable, "-c", MLFLOW_UNDER_THE_CONSOLE], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert "INFO" not in p.stderr and "View run" not in p.stdout and "\U0001f3c3" not in p.stdout, p.stdout + p.stderr
    assert "an MLflow warning" in p.stderr  # its warnings stay
    with logs.worker_console():
        assert os.environ["MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT"] == "true"
        assert not logging.getLogger("mlflow.store").isEnabledFor(logging.INFO)
    assert "MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT" not in os.environ and "MLFLOW_LOGGING_LEVEL" not in os.environ
    monkeypatch.setenv("MLFLOW_LOGGING_LEVEL", "INFO")
    with logs.console():  # the user's own level is kept
        assert logging.getLogger("mlflow.store").isEnabledFor(logging.INFO)
