"""The host's TensorFlow fork server and its clients: the address, the messages, and the client's child.

One server per executor and environment (:mod:`spark_imagenet.training.worker.forkserver`) imports TensorFlow
once and forks each barrier task's TensorFlow process from that state (docs/design.md, 'One TensorFlow import per
host: the fork server'). Its client is the barrier task, which holds a :class:`ForkedChild` where it would hold a
``subprocess.Popen``.

The protocol, over a Unix stream socket in Linux's abstract namespace (no file to leave behind; the name is
free again when the server ends), each message one line of UTF-8:

1. The client creates the child's folder, connects and sends :class:`ForkRequest` as one JSON line, with two
   file descriptors attached (``SCM_RIGHTS``): the read end of the child's stdin pipe and the write end of its
   output pipe (its stdout and stderr). From then on the folder is the server's to remove.
2. The server forks the child once TensorFlow is imported (a client that connects earlier waits in the
   listen queue) and answers ``pid N``; when it has reaped the child, ``exit C`` (C as ``Popen.returncode``:
   negative for a killing signal). When it cannot fork (its import failed, another module, ``fork`` failed) it
   answers ``error REASON`` (one line) instead, removes the folder and closes the connection.
3. The client may send ``kill``: the server SIGKILLs the child (no pid is reused meanwhile: the server reaps
   it). The connection is the child's lifeline: when it ends (the client closed it, or died: PySpark SIGKILLs a
   cancelled task's Python worker) while the child runs, the server SIGKILLs the child.
4. Once the child is reaped and the client's side of the connection has ended, the server removes the folder
   and closes its side, so a client that half-closes (:meth:`ForkedChild.close`) and reads to the end knows the
   folder is gone. The server removes the folders of the children it still has when it ends too.

Standard library only.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import select
import signal
import socket
import sys
from typing import Sequence

#: Linux prctl(2) option: signal sent to this process when its parent thread dies.
PR_SET_PDEATHSIG = 1
#: The largest request line accepted (bytes).
MAX_REQUEST = 1 << 16
#: Seconds :meth:`ForkedChild.close` waits for the server to remove the folder and close its side.
CLOSE_WAIT_S = 30


def set_death_signal(sig: int, parent_pid: int | None = None) -> None:
    """Ask Linux to send ``sig`` to this process when its parent thread dies (no-op elsewhere).

    Args:
        sig: the signal (``signal.SIGKILL``, ``signal.SIGTERM``).
        parent_pid: when given, exit at once (status 1) if the parent is
            already not this pid (it died before the request took effect).
    """
    if sys.platform.startswith("linux"):
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0)
    if parent_pid is not None and os.getppid() != parent_pid:
        os._exit(1)


def server_name(owner: int, key: object) -> str:
    """The abstract socket name (without its leading NUL) of the fork server of ``owner`` for ``key``.

    Args:
        owner: the pid the server lives as long as (the executor's PySpark daemon, or the process itself).
        key: what the forked processes depend on (the interpreter, module and environment); another key is
            another server.

    Returns:
        str: ``spark-imagenet-tf-UID-OWNER-DIGEST``.
    """
    digest = hashlib.sha256(repr(key).encode("utf-8", errors="surrogateescape")).hexdigest()[:20]
    return f"spark-imagenet-tf-{os.getuid()}-{owner}-{digest}"


def address(name: str) -> str:
    """The socket address of ``name`` in Linux's abstract namespace."""
    return "\0" + name


class ForkError(OSError):
    """The fork server could not fork the child; the message is the server's one-line reason."""


@dataclasses.dataclass(frozen=True)
class ForkRequest:
    """What a client asks the fork server to run.

    Attributes:
        argv: the command it stands for, ``[python, "-m", MODULE, ARG...]``: MODULE must be the server's; the
            child runs it as ``__main__`` with ``sys.argv[1:]`` = the ARGs.
        cwd: the child's folder (the task created it): its working folder and ``TMPDIR``, removed by the server.
    """

    argv: tuple[str, ...]
    cwd: str

    def to_line(self) -> bytes:
        """The request as one JSON line."""
        return (json.dumps({"argv": list(self.argv), "cwd": self.cwd}) + "\n").encode("utf-8", "surrogateescape")

    @classmethod
    def from_line(cls, line: bytes) -> "ForkRequest":
        """Parse :meth:`to_line`'s form.

        Raises:
            ValueError: not such a line.
        """
        data = json.loads(line.decode("utf-8", "surrogateescape"))
        argv, cwd = data.get("argv") if isinstance(data, dict) else None, data.get("cwd")
        if not (isinstance(argv, list) and len(argv) >= 3 and all(isinstance(a, str) for a in argv)
                and isinstance(cwd, str) and os.path.isabs(cwd)):
            raise ValueError("not a fork request: {argv: [python, -m, module, ...], cwd: an absolute path}")
        return cls(tuple(argv), cwd)


class ForkedChild:
    """A child forked by the fork server for this process, used as a ``subprocess.Popen`` with pipes.

    Attributes:
        pid: the child's pid once the server has said it, else None.
        returncode: its exit status once reaped (negative: the killing signal), else None. A server that ends
            without saying is reported as ``-SIGKILL`` (its children die with it).
        stdin: the write end of the child's stdin (binary, unbuffered).
        stdout: the read end of the child's stdout and stderr (binary).
    """

    def __init__(self, sock: socket.socket, stdin, stdout) -> None:
        self._sock, self.stdin, self.stdout = sock, stdin, stdout
        self.pid: int | None = None
        self.returncode: int | None = None
        self._error: str | None = None
        self._buffer = b""

    @classmethod
    def start(cls, name: str, argv: Sequence[str], cwd: str) -> "ForkedChild":
        """Ask server ``name`` to fork ``argv`` in the folder ``cwd`` (which the server then removes) with new
        pipes as stdin and stdout (stderr merged); returns at once (the fork waits for the server's import).

        Raises:
            OSError: no server listens at ``name`` (``ConnectionRefusedError``), or the request failed (the
                folder is then still the caller's).
        """
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        stdin_r, stdin_w = os.pipe()
        out_r, out_w = os.pipe()
        try:
            sock.connect(address(name))
            socket.send_fds(sock, [ForkRequest(tuple(argv), cwd).to_line()], [stdin_r, out_w])
        except BaseException:
            sock.close()
            os.close(stdin_w)
            os.close(out_r)
            raise
        finally:
            os.close(stdin_r)
            os.close(out_w)
        return cls(sock, os.fdopen(stdin_w, "wb", buffering=0), os.fdopen(out_r, "rb"))

    def _read(self, timeout: float | None) -> None:
        """Read the server's lines that arrive within ``timeout`` seconds (None: until one arrives)."""
        if self.returncode is not None or self._error is not None:
            return
        if not select.select([self._sock], [], [], timeout)[0]:
            return
        data = self._sock.recv(4096)
        if not data:
            if self.pid is None:
                self._error = "the TensorFlow fork server closed the connection without forking"
            else:
                self.returncode = -signal.SIGKILL
            return
        self._buffer += data
        *lines, self._buffer = self._buffer.split(b"\n")
        for line in lines:
            word, _, value = line.decode("utf-8", errors="replace").partition(" ")
            if word == "pid":
                self.pid = int(value)
            elif word == "exit":
                self.returncode = int(value)
            elif word == "error":
                self._error = value

    def _result(self) -> int | None:
        if self._error is not None:
            raise ForkError(self._error)
        return self.returncode

    def poll(self) -> int | None:
        """The exit status if the child has ended, else None (does not block).

        Raises:
            ForkError: the server could not fork it (its reason).
        """
        self._read(0)
        return self._result()

    def wait(self) -> int:
        """Wait for the child to end; return its exit status.

        Raises:
            ForkError: the server could not fork it (its reason).
        """
        while self.returncode is None and self._error is None:
            self._read(None)
        return self._result()

    def kill(self) -> None:
        """SIGKILL the child (through the server; a child not forked yet is killed once forked)."""
        if self.returncode is None and self._error is None:
            with contextlib.suppress(OSError):
                self._sock.sendall(b"kill\n")

    def close(self) -> None:
        """End the connection (the child's lifeline: a running child is SIGKILLed) and wait, at most
        :data:`CLOSE_WAIT_S` seconds, until the server has reaped the child and removed its folder; close the
        pipes. Idempotent."""
        if self._sock.fileno() >= 0:
            with contextlib.suppress(OSError):
                self._sock.shutdown(socket.SHUT_WR)
                while select.select([self._sock], [], [], CLOSE_WAIT_S)[0] and self._sock.recv(4096):
                    pass
            self._sock.close()
        for stream in (self.stdin, self.stdout):
            with contextlib.suppress(OSError):
                stream.close()
