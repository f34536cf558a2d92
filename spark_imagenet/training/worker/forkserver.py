"""The host's TensorFlow fork server: one TensorFlow import, a fork of it for each barrier task.

Usage (started by :func:`spark_imagenet.training.task.child.fork_server`, detached, in a session of its own)::

    python -m spark_imagenet.training.worker.forkserver --listen-fd FD --owner PID --module MODULE

FD is a listening Unix socket that the starting task bound (the bind is the lock: two tasks of one host never
start two servers for one name; :func:`spark_imagenet.training.job.forking.server_name`). The server imports
MODULE and calls its ``preload()`` when it has one (the TensorFlow worker's: TensorFlow, tf-keras and the
training modules; no strategy, no device, no op), checks that no Python thread but its own runs (a fork keeps
only the forking thread), then serves the protocol of :mod:`spark_imagenet.training.job.forking`: for each
request it forks a child that runs MODULE as ``__main__`` (as ``python -m MODULE ARG...`` would) with the
request's stdin and stdout, in its folder, in a session of its own, dying with the server (``PR_SET_PDEATHSIG``
= SIGKILL); it reaps each child, reports its exit status to the child's client (the barrier task), SIGKILLs a
child whose client's connection ends, and removes the child's folder once the child is reaped and the
connection has ended. It ends, SIGKILLing the children it still has and removing their folders, when its owner
ends (the executor's PySpark daemon: every task of the executor is gone). docs/design.md, 'One TensorFlow import
per host: the fork server'.

MODULE must do its work under ``if __name__ == "__main__":`` (the server imports it; each child runs it again as
``__main__``, its imports already done). Its own stdout and stderr are ``/dev/null``: a failed import is each
requester's ``error`` answer instead.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import os
import re
import runpy
import selectors
import shutil
import signal
import socket
import struct
import sys
import tempfile
import threading
import warnings

from spark_imagenet.training.job.forking import MAX_REQUEST, ForkRequest, set_death_signal
from spark_imagenet.training.worker.environment import prepare_tensorflow_process


def prepare(module: str) -> str | None:
    """Set the process up for TensorFlow (:func:`.environment.prepare_tensorflow_process`), import ``module`` and
    run its ``preload()``; return None when the process may fork, else why not (one
    line: the import failed, or a Python thread besides the main one runs)."""
    try:
        prepare_tensorflow_process()
        loaded = importlib.import_module(module)
        preload = getattr(loaded, "preload", None)
        if callable(preload):
            preload()
    except BaseException as e:  # noqa: BLE001 - every requester is told
        return f"the TensorFlow fork server could not import {module}: {type(e).__name__}: {e}"
    if threading.active_count() != 1:
        names = sorted(t.name for t in threading.enumerate() if t is not threading.main_thread())
        return (f"the TensorFlow fork server cannot fork: {module}'s import left Python threads running ({names}), "
                "which a forked process would lose")
    return None


def _run_child(module: str, request: ForkRequest, fds: list[int], close: list, server: int) -> None:
    """In a fresh fork of ``server`` (its pid): become the requested process and run ``module`` as ``__main__``;
    never returns."""
    code = 1
    try:
        os.setsid()
        set_death_signal(signal.SIGKILL, server)  # exits at once if the server is already gone
        for thing in close:  # the server's sockets, selector and pidfds: no other task's ends stay open here
            with contextlib.suppress(OSError):
                thing.close() if hasattr(thing, "close") else os.close(thing)
        os.dup2(fds[0], 0)
        os.dup2(fds[1], 1)
        os.dup2(fds[1], 2)
        for fd in set(fds) - {0, 1, 2}:
            os.close(fd)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.chdir(request.cwd)
        os.environ["TMPDIR"] = request.cwd  # TensorFlow's temporary files (autograph's modules) go with the folder
        tempfile.tempdir = None
        sys.argv = [module, *request.argv[3:]]
        # the server imported the module; running it again as __main__ is the point, not a mistake to warn of
        warnings.filterwarnings("ignore", message=re.escape(f"'{module}' found in sys.modules"),
                                category=RuntimeWarning)
        runpy.run_module(module, run_name="__main__", alter_sys=True)
        code = 0
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except BaseException as e:  # noqa: BLE001 - the child's last word, then its exit status
        with contextlib.suppress(Exception):
            print(f"forked TensorFlow process failed: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
    finally:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)


@dataclasses.dataclass
class _Child:
    """A forked child: its pidfd, its client's connection and folder, and which of the two ends has come."""

    pidfd: int
    conn: socket.socket
    folder: str
    reaped: bool = False
    client_ended: bool = False


class ForkServer:
    """The server's loop (see the module docstring).

    Args:
        listener: the listening socket.
        owner: a pidfd of the owner.
        module: the module each child runs.
        error: why no child can be forked (:func:`prepare`), or None.
    """

    def __init__(self, listener: socket.socket, owner: int, module: str, error: str | None) -> None:
        self.listener, self.owner, self.module, self.error = listener, owner, module, error
        self.selector = selectors.DefaultSelector()
        self.selector.register(listener, selectors.EVENT_READ, self._accept)
        self.selector.register(owner, selectors.EVENT_READ, None)
        self.children: dict[int, _Child] = {}  # by pid

    def serve(self) -> None:
        """Serve until the owner ends; then SIGKILL and reap the children left and remove their folders."""
        while True:
            for key, _ in self.selector.select():
                if key.data is None:
                    return self._shut_down()
                key.data(key.fileobj)

    def _accept(self, listener: socket.socket) -> None:
        conn, _ = listener.accept()
        try:
            uid = struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i")))[1]
            conn.settimeout(30)
            data, fds, _, _ = socket.recv_fds(conn, MAX_REQUEST, 2)
            while data and not data.endswith(b"\n") and len(data) < MAX_REQUEST:
                more = conn.recv(MAX_REQUEST)
                if not more:
                    break
                data += more
            request = ForkRequest.from_line(data.split(b"\n", 1)[0])
        except (OSError, ValueError):
            conn.close()
            return
        if uid != os.getuid() or len(fds) != 2:  # only this user's processes may have a process forked
            for fd in fds:
                os.close(fd)
            conn.close()
            return
        conn.setblocking(False)
        self._fork(conn, request, fds)

    def _refuse(self, conn: socket.socket, request: ForkRequest, fds: list[int], error: str) -> None:
        """Answer ``error`` for a request that cannot be forked; remove its folder."""
        for fd in fds:
            os.close(fd)
        shutil.rmtree(request.cwd, ignore_errors=True)
        with contextlib.suppress(OSError):
            conn.setblocking(True)
            conn.sendall(f"error {' '.join(error.split())}\n".encode())
        conn.close()

    def _fork(self, conn: socket.socket, request: ForkRequest, fds: list[int]) -> None:
        error = self.error
        if error is None and list(request.argv[1:3]) != ["-m", self.module]:
            error = f"the TensorFlow fork server runs -m {self.module}, not {' '.join(request.argv[1:3])}"
        if error is not None:
            return self._refuse(conn, request, fds, error)
        close = [self.selector, self.listener, self.owner, conn]
        close += [c.conn for c in self.children.values()] + [c.pidfd for c in self.children.values() if not c.reaped]
        server = os.getpid()
        try:
            pid = os.fork()
        except OSError as e:
            return self._refuse(conn, request, fds, f"the TensorFlow fork server could not fork: {e}")
        if pid == 0:
            _run_child(self.module, request, fds, close, server)
        for fd in fds:
            os.close(fd)
        pidfd = os.pidfd_open(pid)
        self.children[pid] = _Child(pidfd, conn, request.cwd)
        self.selector.register(pidfd, selectors.EVENT_READ, lambda _fd, pid=pid: self._reap(pid))
        self.selector.register(conn, selectors.EVENT_READ, lambda c, pid=pid: self._client(c, pid))
        with contextlib.suppress(OSError):
            conn.sendall(f"pid {pid}\n".encode())

    def _client(self, conn: socket.socket, pid: int) -> None:
        """A client's ``kill``, or the end of its side of the connection: either way its child is SIGKILLed."""
        try:
            data = conn.recv(4096)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if data and b"kill" not in data:
            return
        child = self.children[pid]
        if not child.reaped:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)  # not reaped yet: the pid is its own
        if not data:
            self.selector.unregister(conn)
            child.client_ended = True
            if child.reaped:
                self._finish(pid)

    def _reap(self, pid: int) -> None:
        """Reap ``pid`` and tell its client how it ended; done with it once the client's side has ended too."""
        child = self.children[pid]
        status = os.waitpid(pid, 0)[1]
        code = -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
        self.selector.unregister(child.pidfd)
        os.close(child.pidfd)
        child.reaped = True
        if child.client_ended:
            return self._finish(pid)
        with contextlib.suppress(OSError):
            child.conn.setblocking(True)
            child.conn.sendall(f"exit {code}\n".encode())
            child.conn.setblocking(False)

    def _finish(self, pid: int) -> None:
        """The child is reaped and its client's side has ended: remove the folder, then close the connection
        (the client that waits for that knows the folder is gone)."""
        child = self.children.pop(pid)
        shutil.rmtree(child.folder, ignore_errors=True)
        child.conn.close()

    def _shut_down(self) -> None:
        """SIGKILL the children left, reap them, remove their folders and close their connections."""
        for pid, child in self.children.items():
            if not child.reaped:
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
        for pid in list(self.children):
            if pid in self.children and not self.children[pid].reaped:
                self._reap(pid)
            if pid in self.children:
                self._finish(pid)


def _parse(argv: list[str]) -> tuple[int, int, str]:
    """``(listen_fd, owner_pid, module)``.

    Raises:
        ValueError: not ``--listen-fd FD --owner PID --module MODULE``.
    """
    values = dict(zip(argv[::2], argv[1::2]))
    if len(argv) != 6 or set(values) != {"--listen-fd", "--owner", "--module"}:
        raise ValueError("usage: --listen-fd FD --owner PID --module MODULE")
    return int(values["--listen-fd"]), int(values["--owner"]), values["--module"]


def main(argv: list[str] | None = None) -> int:
    """Command-line entry (see the module docstring). Returns 2 on wrong usage, 0 once the owner has ended."""
    try:
        fd, owner_pid, module = _parse(sys.argv[1:] if argv is None else argv)
    except ValueError as e:
        print(f"forkserver: {e}", file=sys.stderr, flush=True)
        return 2
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    listener = socket.socket(fileno=fd)
    try:
        owner = os.pidfd_open(owner_pid)
    except ProcessLookupError:
        return 0
    ForkServer(listener, owner, module, prepare(module)).serve()
    return 0


if __name__ == "__main__":
    os._exit(main())
