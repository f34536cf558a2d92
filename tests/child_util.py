"""The barrier task's own ways to run its TensorFlow process and build its environment, composed as the task
composes them (spark_imagenet.training.task.child and .environment), for tests that run a child outside a Spark
task; and a small stand-in for the TensorFlow worker module, forked by a real fork server (no TensorFlow)."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Sequence

from spark_imagenet.training.task.child import end_child, finish_child, start_preloaded
from spark_imagenet.training.task.environment import job_env, preload_env

#: The stand-in for TensorFlow: counts its imports.
FAKE_TENSORFLOW = '''import os
with open(os.path.join(os.environ["FAKE_LOG"], "imports"), "a") as f:
    f.write(f"{os.getpid()}\\n")
'''
#: The stand-in worker: imports the stand-in TensorFlow, writes its pid to ``pid.txt`` in its folder, waits for
#: its go; then runs its folder's ``script.py`` as ``__main__`` when there is one (``sys.argv[1:]`` its own), else
#: says what a fork sees in one line and exits as ``code.txt`` says (after two minutes when ``sleep.txt`` exists).
FAKE_WORKER = '''import os, runpy, sys, threading, time
import fake_tensorflow  # what the real worker imports at its top: TensorFlow

def main():
    with open("pid.tmp", "w") as f:
        f.write(str(os.getpid()))
    os.replace("pid.tmp", "pid.txt")
    go = sys.stdin.readline().strip()
    if os.path.exists("script.py"):
        sys.argv = ["script.py", *sys.argv[1:]]
        runpy.run_path("script.py", run_name="__main__")
        return
    print("pid", os.getpid(), "threads", threading.active_count(), "folder", os.path.basename(os.getcwd()),
          "tmpdir", os.environ["TMPDIR"] == os.getcwd(), "args", " ".join(sys.argv[1:2]), "go", go, flush=True)
    if os.path.exists("sleep.txt"):
        time.sleep(120)
    sys.exit(int(open("code.txt").read()) if os.path.exists("code.txt") else 0)

if __name__ == "__main__":
    main()
'''
#: The stand-in worker's module.
WORKER = "fake_tf.worker"


@contextlib.contextmanager
def fake_worker(folder: Path) -> Iterator[tuple[dict[str, str], int]]:
    """While inside, ``(environment, owner)``: the stand-in modules written under ``folder`` and on PYTHONPATH
    (``TMPDIR`` and ``FAKE_LOG`` are ``folder``), and an owner process for the fork server, ended on the way out
    (and with it the server)."""
    (folder / "fake_tf").mkdir()  # a module in a package, as the real worker is (runpy warns of such a rerun)
    (folder / "fake_tf" / "__init__.py").write_text("")
    (folder / "fake_tf" / "worker.py").write_text(FAKE_WORKER)
    (folder / "fake_tensorflow.py").write_text(FAKE_TENSORFLOW)
    path = [str(folder), os.path.dirname(os.path.dirname(os.path.abspath(__file__))), os.environ.get("PYTHONPATH", "")]
    env = dict(os.environ, TMPDIR=str(folder), FAKE_LOG=str(folder), PYTHONPATH=os.pathsep.join(filter(None, path)))
    owner = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        yield env, owner.pid
    finally:
        owner.kill()
        owner.wait()


def run_child(env: Mapping[str, str], owner: int, prefix: str, script: str | None = None,
              prepare: Callable[[str], None] | None = None, collect: Callable[[str], None] | None = None,
              rank: int = 0, **options: Any) -> tuple[int, list[str]]:
    """One task's process as the task runs it: :func:`start_preloaded` (the stand-in worker of
    :func:`fake_worker`), :func:`finish_child` (``script``: written as the folder's ``script.py`` before the go;
    ``options``: :func:`finish_child`'s ``tail_lines``, ``out``, ``shown``), :func:`end_child`."""
    def inputs(folder: str) -> None:
        if script is not None:
            Path(folder, "script.py").write_text(script)
        if prepare is not None:
            prepare(folder)

    held = start_preloaded(env, WORKER, rank, owner=owner)
    try:
        return finish_child(held, prefix, inputs, collect or (lambda folder: None), **options)
    finally:
        end_child(held)


def worker_env(base: Mapping[str, str], tf_config: Mapping[str, Any] | None, gpu_addresses: Sequence[str] | None,
               local_workers: int, task_path: Sequence[str] = ()) -> dict[str, str]:
    """The TensorFlow worker's environment once it trains: started with :func:`preload_env`, then given
    :func:`job_env` after its go."""
    return {**preload_env(base, gpu_addresses, task_path), **job_env(base, tf_config, gpu_addresses, local_workers)}
