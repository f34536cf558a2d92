"""The host's TensorFlow fork server and its clients: the address, the messages, and the client's child.

One server per executor and environment (:mod:`spark_imagenet.training.worker.forkserver`) imports TensorFlow
once and forks each barrier task's TensorFlow process from that state (docs/design.md, 'One TensorFlow import per
host: the fork server'). Its client is a task's supervisor (:mod:`spark_imagenet.training.task.supervisor`),
which holds a :class:`ForkedChild` where it would hold a ``subprocess.Popen``.

The protocol, over a Unix stream socket in Linux's abstract namespace (no file to leave behind; the name is
free again when the server ends), each message one line of UTF-8:

1. The client connects and sends :class:`ForkRequest` as one JSON line, with two file descriptors attached
   (``SCM_RIGHTS``): the child's stdin and its stdout (also its stderr).
2. The server forks the child once TensorFlow is imported (a client that connects earlier waits in the
   listen queue) and answers ``pid N``; when it has reaped the child, ``exit C`` (C as ``Popen.returncode``:
   negative for a killing signal). A server that could not import writes its error to the child's stdout and
   answers ``exit 1`` without a pid.
3. The client may send ``kill``: the server SIGKILLs the child (no pid is reused meanwhile: the server reaps
   it). A client whose connection ends while its child runs (its supervisor died) has its child SIGKILLed.

Standard library only (the supervisor imports it).
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
        key: what the forked processes depend on (the interpreter, module and environment:
            :func:`spark_imagenet.training.task.child.preload_key`); another key is another server.

    Returns:
        str: ``spark-imagenet-tf-UID-OWNER-DIGEST``.
    """
    digest = hashlib.sha256(repr(key).encode("utf-8", errors="surrogateescape")).hexdigest()[:20]
    return f"spark-imagenet-tf-{os.getuid()}-{owner}-{digest}"


def address(name: str) -> str:
    """The socket address of ``name`` in Linux's abstract namespace."""
    return "\0" + name


@dataclasses.dataclass(frozen=True)
class ForkRequest:
    """What a client asks the fork server to run.

    Attributes:
        argv: the command it stands for, ``[python, "-m", MODULE, ARG...]``: MODULE must be the server's; the
            child runs it as ``__main__`` with ``sys.argv[1:]`` = the ARGs.
        cwd: the child's working folder, also its ``TMPDIR`` (the task's folder).
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
                and isinstance(cwd, str)):
            raise ValueError("not a fork request: {argv: [python, -m, module, ...], cwd}")
        return cls(tuple(argv), cwd)


class ForkedChild:
    """A child forked by the fork server for this process, used as a ``subprocess.Popen`` with a stdin pipe.

    Attributes:
        pid: the child's pid once the server has forked it, else None.
        returncode: its exit status once reaped (negative: the killing signal), else None. A server that ends
            without saying is reported as ``-SIGKILL`` (its children die with it).
        stdin: the write end of the child's stdin (binary, unbuffered).
    """

    def __init__(self, sock: socket.socket, stdin) -> None:
        self._sock, self.stdin = sock, stdin
        self.pid: int | None = None
        self.returncode: int | None = None
        self._buffer = b""

    @classmethod
    def start(cls, name: str, argv: Sequence[str], cwd: str, stdout: int = 1) -> "ForkedChild":
        """Ask server ``name`` to fork ``argv`` in ``cwd`` with a new pipe as stdin and ``stdout`` as stdout
        and stderr; returns at once (the fork waits for the server's import).

        Raises:
            OSError: no server listens at ``name`` (``ConnectionRefusedError``), or the request failed.
        """
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        read, write = os.pipe()
        try:
            sock.connect(address(name))
            socket.send_fds(sock, [ForkRequest(tuple(argv), cwd).to_line()], [read, stdout])
        except BaseException:
            sock.close()
            os.close(write)
            raise
        finally:
            os.close(read)
        return cls(sock, os.fdopen(write, "wb", buffering=0))

    def _read(self, timeout: float | None) -> None:
        """Read the server's lines that arrive within ``timeout`` seconds (None: until one arrives)."""
        if self.returncode is not None:
            return
        if not select.select([self._sock], [], [], timeout)[0]:
            return
        data = self._sock.recv(4096)
        if not data:
            self.returncode = -signal.SIGKILL
            return
        self._buffer += data
        *lines, self._buffer = self._buffer.split(b"\n")
        for line in lines:
            word, _, value = line.decode().partition(" ")
            if word == "pid":
                self.pid = int(value)
            elif word == "exit":
                self.returncode = int(value)

    def poll(self) -> int | None:
        """The exit status if the child has ended, else None (does not block)."""
        self._read(0)
        return self.returncode

    def wait(self) -> int:
        """Wait for the child to end; return its exit status."""
        while self.returncode is None:
            self._read(None)
        self._sock.close()
        return self.returncode

    def kill(self) -> None:
        """SIGKILL the child (through the server); a child not forked yet is abandoned (the server kills it)."""
        if self.returncode is not None:
            return
        if self.pid is None:
            self._read(0)
        if self.pid is None:
            self._sock.close()
            self.returncode = -signal.SIGKILL
            return
        with contextlib.suppress(OSError):
            self._sock.sendall(b"kill\n")
