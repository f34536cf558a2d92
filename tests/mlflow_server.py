"""A real MLflow tracking server for tests: ``mlflow server`` with a SQLite backend and a local artifact root, on
127.0.0.1 on a free port, in its own process."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from gcs_emulator import free_port
from server_util import stop_server, wait_for_http


class Unavailable(Exception):
    """mlflow is not installed; the message says what to install."""


class MlflowServer:
    """A running ``mlflow server``.

    Attributes:
        uri: ``http://127.0.0.1:PORT``, the tracking URI.
    """

    def __init__(self, work: Path):
        try:
            import mlflow  # noqa: F401
        except ImportError as e:
            raise Unavailable(f"mlflow is not installed ({e}); pip install '.[mlflow]'") from None
        work = Path(work)
        self.port = free_port()
        self.uri = f"http://127.0.0.1:{self.port}"
        self.log = open(work / "mlflow-server.log", "wb")
        mlflow_cli = shutil.which("mlflow", path=str(Path(sys.executable).parent)) or "mlflow"
        self.proc = subprocess.Popen(
            [mlflow_cli, "server", "--backend-store-uri", f"sqlite:///{work / 'mlflow.db'}",
             "--default-artifact-root", str(work / "artifacts"), "--host", "127.0.0.1", "--port", str(self.port),
             "--workers", "1"], stdout=self.log, stderr=subprocess.STDOUT,
            # no job runner: MLflow 3's server otherwise starts eight more processes (huey consumers for its
            # prompt-optimization jobs, about 6 CPU-s of imports each) that no tracking call uses
            env={**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"})
        if not wait_for_http(f"{self.uri}/health", self.proc, 120):
            self.stop()
            raise RuntimeError(f"mlflow server did not start (see {self.log.name})")

    def client(self):
        """An ``MlflowClient`` of the server."""
        from mlflow import MlflowClient

        return MlflowClient(self.uri)

    def stop(self) -> None:
        stop_server(self.proc, self.log)
