"""The rendezvous on the driver: a real MeetingServer on a socket, tasks meeting through it as they would through
allGather, and every way it falls back or refuses (docs/design.md, 'Rendezvous and ports').

The barrier task's context is a stand-in here (its ``allGather`` records that it was used); the real Spark
jobs of the other tests (``local[2]``, the two-host cluster) meet through the same server.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from spark_imagenet.errors import PeerFailed, TrainingError
from spark_imagenet.training.driver.meeting_server import MeetingServer
from spark_imagenet.training.job.logchannel import ChannelSpec
from spark_imagenet.training.task.rendezvous import DriverMeeting, rendezvous


class _Info:
    def __init__(self, address: str) -> None:
        self.address = address


class Context:
    """What :func:`rendezvous` and :meth:`DriverMeeting.open` read of a BarrierTaskContext."""

    def __init__(self, rank: int, tasks: int, stage: int = 7) -> None:
        self.rank, self.tasks, self.stage = rank, tasks, stage
        self.all_gathered: list[str] = []

    def partitionId(self) -> int:  # noqa: N802 - PySpark's name
        return self.rank

    def stageId(self) -> int:  # noqa: N802
        return self.stage

    def getTaskInfos(self) -> list[_Info]:  # noqa: N802
        return [_Info(f"127.0.0.1:{40000 + r}") for r in range(self.tasks)]

    def allGather(self, message: str) -> list[str]:  # noqa: N802
        self.all_gathered.append(message)
        return [message if r == self.rank else json.dumps({"address": f"127.0.0.1:{50000 + r}"})
                for r in range(self.tasks)]


def _meet(spec: ChannelSpec | None, contexts: list[Context], failures: dict[int, str] | None = None):
    """Every task's rendezvous at once (a thread each); each result, or the exception it raised."""
    def one(ctx: Context):
        meeting = DriverMeeting.open(spec, ctx)
        try:
            return rendezvous(ctx, (failures or {}).get(ctx.rank), meeting)
        except Exception as e:  # noqa: BLE001 - returned for the test to look at
            return e
        finally:
            if meeting is not None:
                meeting.close()

    with ThreadPoolExecutor(len(contexts)) as pool:
        return list(pool.map(one, contexts))


def test_tasks_meet_on_the_driver_and_get_every_address_in_rank_order():
    with MeetingServer("127.0.0.1") as server:
        contexts = [Context(r, 3) for r in range(3)]
        results = _meet(server.spec, contexts)
    assert all(not isinstance(r, Exception) for r in results), results
    lists = {tuple(addresses) for _, addresses, _ in results}
    assert len(lists) == 1  # the same list everywhere
    addresses = lists.pop()
    assert [rank for rank, _, _ in results] == [0, 1, 2]
    assert [a.rsplit(":", 1)[0] for a in addresses] == ["127.0.0.1"] * 3 and len(set(addresses)) == 3
    assert all(ctx.all_gathered == [] for ctx in contexts)  # Spark's allGather was not used
    assert server.met == 3 and server.fell_back == []


def test_a_failed_task_stops_every_peer_through_the_driver():
    with MeetingServer("127.0.0.1") as server:
        results = _meet(server.spec, [Context(r, 2) for r in range(2)], {1: "its shards could not be staged"})
    assert all(isinstance(r, PeerFailed) for r in results), results
    assert "rank 1: its shards could not be staged" in str(results[0])


def test_a_task_that_cannot_reach_the_driver_makes_the_stage_meet_through_allgather():
    with MeetingServer("127.0.0.1", hello_window=0.5) as server:
        lost = ChannelSpec("127.0.0.1", _closed_port(), server.spec.secret)  # no server listens there
        present, absent = Context(0, 2), Context(1, 2)
        with ThreadPoolExecutor(2) as pool:
            first = pool.submit(_meet, server.spec, [present])
            second = pool.submit(_meet, lost, [absent])
            results = first.result(30) + second.result(30)
        late = _meet(server.spec, [Context(1, 2)])  # a hello after the decision: told allgather at once
    assert all(not isinstance(r, Exception) for r in results + late), results + late
    assert present.all_gathered and absent.all_gathered  # both met through Spark's allGather
    assert server.fell_back == [7] and server.met == 0


def test_the_driver_refuses_a_wrong_secret_and_a_hello_that_does_not_fit():
    with MeetingServer("127.0.0.1") as server:
        wrong = ChannelSpec(server.spec.host, server.spec.port, "0" * 32)
        with pytest.raises(TrainingError, match="closed the connection"):
            DriverMeeting.open(wrong, Context(0, 2)).mode()
        with pytest.raises(TrainingError, match="refused this task: hello: rank 5 of 2"):
            DriverMeeting.open(server.spec, Context(5, 2)).mode()
        meeting = DriverMeeting.open(server.spec, Context(0, 2))
        deadline = time.monotonic() + 30  # its hello is in before the second one of rank 0
        while 7 not in server._attempts or server._attempts[7].hellos != {0}:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        with pytest.raises(TrainingError, match="refused this task: .*ranks said: \\[0\\]"):
            DriverMeeting.open(server.spec, Context(0, 2)).mode()  # rank 0 twice
        meeting.close()


def test_a_driver_that_goes_away_fails_the_waiting_task_with_one_message():
    server = MeetingServer("127.0.0.1").start()
    meeting = DriverMeeting.open(server.spec, Context(0, 2))
    waiting: list[BaseException] = []

    def wait() -> None:
        try:
            meeting.mode()
        except TrainingError as e:
            waiting.append(e)

    thread = threading.Thread(target=wait)
    thread.start()
    server.close()
    thread.join(30)
    assert waiting and "closed the connection while this task waited for the way to meet" in str(waiting[0])
    meeting.close()


def test_without_a_driver_meeting_the_tasks_use_allgather():
    ctx = Context(0, 2)
    assert DriverMeeting.open(None, ctx) is None
    rank, addresses, host = rendezvous(ctx, None, None)
    assert rank == 0 and len(ctx.all_gathered) == 1 and host == "127.0.0.1"


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
