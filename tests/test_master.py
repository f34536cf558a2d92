"""The one Spark master URL parser (spark_imagenet.training.job.master): every form, and the malformed ones."""

from __future__ import annotations

import re

import pytest

from spark_imagenet.errors import ConfigError
from spark_imagenet.training.job.master import FORMS, KINDS, Master, kind_of, master_error


@pytest.mark.parametrize("url, threads, all_cores, failures", [
    ("local", 1, False, None), ("local[4]", 4, False, None), (" local[4] ", 4, False, None),
    ("local[2,3]", 2, False, 3), ("local[2 , 3]", 2, False, 3), ("local[*]", None, True, None),
    ("local[*,2]", None, True, 2)])
def test_local_forms_run_in_the_drivers_jvm_with_their_threads(url, threads, all_cores, failures):
    m = Master.parse(url)
    assert (m.url, m.kind, m.threads, m.all_cores, m.max_failures) == (url.strip(), "local", threads, all_cores,
                                                                        failures)
    assert m.runs_in_driver_jvm and m.runs_on_this_host and m.host is None and m.addresses == ()


def test_local_cores_and_slots_come_from_the_url_and_star_from_the_machine_the_driver_runs_on():
    assert Master.parse("local").slots(1) == 1
    assert Master.parse("local[4, 2]").cores() == 4 and Master.parse("local[4]").slots(2) == 2
    assert Master.parse("local[3]").slots(0) == 3  # a task_cpus below 1 counts as 1
    star = Master.parse("local[*]")
    assert star.cores() is None and star.slots(1) is None  # a Connect server's machine: not known here
    assert star.cores(cpu_count=8) == 8 and star.slots(2, cpu_count=8) == 4


def test_local_cluster_runs_executor_jvms_on_this_host():
    m = Master.parse("local-cluster[ 2 , 3 , 1024 ]")
    assert (m.kind, m.executors, m.executor_cores, m.executor_memory_mb) == ("local-cluster", 2, 3, 1024)
    assert m.runs_on_this_host and not m.runs_in_driver_jvm
    assert m.cores() == 6 and m.slots(2) == 3 and m.threads is None


@pytest.mark.parametrize("url, addresses", [
    ("spark://h:7077", (("h", 7077),)),
    ("spark://h1:7077,h2:7078", (("h1", 7077), ("h2", 7078))),
    ("spark://10.0.0.1:7077, [::1]:7077", (("10.0.0.1", 7077), ("::1", 7077)))])
def test_standalone_masters_with_every_address(url, addresses):
    m = Master.parse(url)
    assert m.kind == "standalone" and m.addresses == addresses and m.host == addresses[0][0]
    assert not m.runs_on_this_host and not m.runs_in_driver_jvm  # even on this machine: its workers decide
    assert m.cores() is None and m.slots(1, cpu_count=8) is None


@pytest.mark.parametrize("url, kind, addresses", [
    ("yarn", "yarn", ()), ("k8s://https://h:6443", "k8s", ()), ("k8s://h:6443", "k8s", ()),
    ("sc://h:15002", "connect", (("h", 15002),)), ("sc://h", "connect", (("h", None),)),
    ("sc://127.0.0.1:15002/;token=abc;use_ssl=true", "connect", (("127.0.0.1", 15002),))])
def test_cluster_and_connect_masters(url, kind, addresses):
    m = Master.parse(url)
    assert (m.kind, m.addresses) == (kind, addresses)
    assert not m.runs_on_this_host and not m.runs_in_driver_jvm and m.slots(1, cpu_count=8) is None


def test_no_master_is_unset():
    m = Master.parse(None)
    assert (m.url, m.kind) == (None, "unset") and not m.runs_on_this_host and m.slots(1) is None


@pytest.mark.parametrize("url, reason", [
    ("local[x]", "local[N] takes N"), ("local[2", "local[N] takes N"), ("local[]", "local[N] takes N"),
    ("local[2,]", "local[N] takes N"), ("local[ 2]", "local[N] takes N"), ("local[0]", "N is at least 1"),
    ("local[0,2]", "N is at least 1"), ("local-cluster[2,1]", "three whole numbers"),
    ("local-cluster[0,1,1024]", "at least 1"), ("local-cluster[2,1,0]", "at least 1"),
    ("spark://", "spark://HOST:PORT: no host"), ("spark://:7077", "no host"), ("spark://h", "has no port"),
    ("spark://h:x", "is not a number"), ("spark://h:7077/path", "more than HOST:PORT"),
    ("spark://h1:7077,", "no host"), ("sc://", "sc://HOST:PORT: no host"), ("sc:///;token=x", "no host"),
    ("sc://h:port", "is not a number"), ("k8s://", "Kubernetes API server"),
    ("yarn-client", None), ("mesos://h:5050", None), ("bogus://x", None), ("", None), ("localhost:7077", None)])
def test_a_malformed_master_is_one_config_error_naming_the_option_and_the_forms(url, reason):
    with pytest.raises(ConfigError) as e:
        Master.parse(url)
    message = str(e.value)
    assert message.startswith(f"master (--master) {url!r} is not a Spark master URL: use local, local[N], local[*]")
    assert FORMS in message
    if reason is None:
        assert message.endswith(FORMS)
    else:
        assert re.search(rf"\(.*{re.escape(reason)}.*\)$", message), message


@pytest.mark.parametrize("url, kind", [
    ("local[x]", "local"), ("local-cluster[junk]", "local-cluster"), ("spark://", "standalone"),
    ("sc://", "connect"), ("mesos://h:5050", "other"), ("", "other")])
def test_unchecked_a_master_keeps_its_kind_without_the_details_it_cannot_parse(url, kind):
    m = Master.parse(url, check=False)
    assert (m.url, m.kind, m.threads, m.executors, m.addresses) == (url, kind, None, None, ())
    assert m.slots(1, cpu_count=8) is None
    assert Master.parse("local[4]", check=False).threads == 4  # a well-formed one is parsed in full


def test_kinds_and_the_message():
    assert {kind_of(u) for u in ("local", "local[2]", "local-cluster[1,1,1]", "spark://h:1", "yarn", "k8s://h",
                                 "sc://h", "x")} | {"unset"} == set(KINDS)
    assert master_error("x") == f"master (--master) 'x' is not a Spark master URL: use {FORMS}"
    assert master_error("x", "why").endswith(f"{FORMS} (why)")


def test_which_masters_run_on_this_host_and_which_in_the_drivers_jvm():
    def where(master):
        m = Master.parse(master, check=False)
        return m.runs_on_this_host, m.runs_in_driver_jvm

    for master in ("local", "local[2]", " local[*] ", "local[2,3]"):
        assert where(master) == (True, True), master
    assert where("local-cluster[2,1,1024]") == (True, False)
    for master in ("yarn", "spark://h:7077", "k8s://https://h:6443", "sc://h:15002"):
        assert where(master) == (False, False), master
