"""Groups spanning processes (jax_llar.distributed, issue 13), on CPU.

The protocol runs here with one thread per simulated process, an in-memory
key-value store with jax.distributed's two calls, and a fake native module;
the real two-process run on GPUs is tests/gpu/test_multiprocess.py. F10
(process modes) is named in the tests that cover it.
"""

from __future__ import annotations

import logging
import os
import threading

import jax
import numpy as np
import pytest
from jax._src.sharding_impls import SPMDAxisContext
from jax.sharding import Mesh

from jax_llar import _ext, agreement, comm, dispatch, distributed, inputs
from jax_llar.algorithms import Algorithm
from jax_llar.config import settings

ONE_SHOT_LL = Algorithm.ONE_SHOT_LL


class Store:
  """jax.distributed's key_value_set / blocking_key_value_get, in memory."""

  def __init__(self):
    self.values = {}
    self.cond = threading.Condition()

  def key_value_set(self, key, value):
    with self.cond:
      if key in self.values:
        raise RuntimeError(f"ALREADY_EXISTS: {key}")  # as the real store
      self.values[key] = value
      self.cond.notify_all()

  def blocking_key_value_get(self, key, timeout_in_ms):
    with self.cond:
      if not self.cond.wait_for(lambda: key in self.values, timeout_in_ms / 1000):
        raise TimeoutError(f"DEADLINE_EXCEEDED: {key}")
      return self.values[key]


class Native:
  """What distributed.create calls of jax_llar._llar, for one process.
  With `entered`/`release`, the creation sets `entered` and then waits for
  `release` (a process stuck inside NCCL's set-up). A creation that succeeds
  returns `comm_id`; `destroyed` lists the ids given to destroy_comm_set,
  which raises `destroy_fails` when set."""

  def __init__(self, fail=None, entered=None, release=None, comm_id=3, destroy_fails=None):
    self.fail = fail
    self.specs = None
    self.setup_timeout_ms = None
    self.entered, self.release = entered, release
    self.comm_id = comm_id
    self.destroyed = []
    self.destroy_fails = destroy_fails

  def nccl_unique_id(self):
    return os.urandom(128)

  def create_comm_set_of_ranks(self, specs, timeout_ns, setup_timeout_ms):
    assert timeout_ns > 0 and setup_timeout_ms > 0
    self.setup_timeout_ms = setup_timeout_ms
    if self.entered is not None:
      self.entered.set()
      assert self.release.wait(60)
    if self.fail:
      raise RuntimeError(self.fail)
    self.specs = specs
    return self.comm_id

  def destroy_comm_set(self, comm_id):
    self.destroyed.append(comm_id)
    if self.destroy_fails:
      raise RuntimeError(self.destroy_fails)


def _record(host="node-a", **inputs):
  base = {"max_bytes": 1 << 20, "algorithm": "auto"}
  base.update(inputs)
  return {"host": host, "inputs": base}


def _ordinals(groups, me):
  """Device id -> CUDA ordinal of process `me`'s devices: its devices in
  order of id get ordinals 0, 1, ..."""
  mine = sorted({d for g in groups for p, d in g if p == me})
  return {d: i for i, d in enumerate(mine)}


def _run(groups, records, natives, timeout_ms=5000):
  """distributed.create in one thread per process; {process: result or
  exception}. Group members are (process index, global device id)."""
  kv, out = Store(), {}

  def one(me):
    try:
      out[me] = distributed.create(natives[me], kv, groups, me, records[me], 1000,
                                   _ordinals(groups, me), timeout_ms=timeout_ms)
    except agreement.SpanError as e:
      out[me] = e

  threads = [threading.Thread(target=one, args=(p,)) for p in records]
  for t in threads:
    t.start()
  for t in threads:
    t.join(60)
  return out, kv


def test_f10_one_gpu_per_process_shares_one_nccl_unique_id():
  groups = [[(0, 0), (1, 1)]]
  natives = {0: Native(), 1: Native()}
  out, _ = _run(groups, {0: _record(), 1: _record()}, natives)
  assert out == {0: (3, [0]), 1: (3, [0])}
  assert natives[0].destroyed == natives[1].destroyed == []  # the sets are in use
  (w0, r0, o0, u0), = natives[0].specs
  (w1, r1, o1, u1), = natives[1].specs
  assert (w0, r0, o0, w1, r1, o1) == (2, [0], [0], 2, [1], [0])
  assert len(u0) == 128 and u0 == u1


def test_f10_two_processes_of_two_gpus_cross_and_local_groups():
  # A 2 x 2 mesh, processes on the first axis: the second axis' groups are
  # inside one process (ncclCommInitAll), the first axis' span both.
  cross = [[(0, 0), (1, 2)], [(0, 1), (1, 3)]]
  natives = {0: Native(), 1: Native()}
  out, _ = _run(cross, {0: _record(), 1: _record()}, natives)
  assert out == {0: (3, [0, 1]), 1: (3, [0, 1])}
  assert [s[1:3] for s in natives[1].specs] == [([1], [0]), ([1], [1])]
  assert [s[3] for s in natives[0].specs] == [s[3] for s in natives[1].specs]
  assert natives[0].specs[0][3] != natives[0].specs[1][3]  # one id per group
  local = [[(0, 0), (0, 1)], [(1, 2), (1, 3)]]
  natives = {0: Native(), 1: Native()}
  out, _ = _run(local, {0: _record(), 1: _record()}, natives)
  assert out == {0: (3, [0]), 1: (3, [1])}
  assert natives[1].specs == [(2, [0, 1], [0, 1], b"")]


def test_f10_groups_across_nodes_are_refused_alike_in_every_process():
  out, kv = _run([[(0, 0), (1, 1)]], {0: _record("node-a"), 1: _record("node-b")},
                 {0: Native(), 1: Native()})
  assert all(isinstance(e, agreement.SpanError) for e in out.values())
  assert str(out[0]) == str(out[1]) and "spans 2 nodes" in str(out[0])
  assert not any("/uid/" in k for k in kv.values)  # no communicator was started


def test_f10_the_native_set_up_gets_the_store_bound():
  """Every collective NCCL step of the creation is bounded by the same
  bound as the store's reads (the native ``setup_timeout_ms``)."""
  natives = {0: Native(), 1: Native()}
  _run([[(0, 0), (1, 1)]], {0: _record(), 1: _record()}, natives, timeout_ms=4321)
  assert natives[0].setup_timeout_ms == natives[1].setup_timeout_ms == 4321
  # Without a bound given, both are bootstrap_timeout_ms() (here for a set
  # of one process, which waits for nobody).
  native = Native()
  distributed.create(native, Store(), [[(0, 0), (0, 1)]], 0, _record(), 1000, {0: 0, 1: 1})
  assert native.setup_timeout_ms == agreement.bootstrap_timeout_ms() >= 60_000


def test_f10_a_peer_stuck_in_nccl_set_up_ends_in_the_step_error_in_every_process():
  """Process 1 is inside NCCL's set-up and does not come back in time;
  process 0's native creation gives up on its ncclCommInitRank after the
  bound (the fake raises the native error at once). Process 0 refuses with
  that error without waiting for process 1's post, and process 1, once it
  comes back, follows the same verdict."""
  import time
  step = ("jax_llar: ncclCommInitRank did not complete within 4000 ms for rank 0 of 2 "
          "(CUDA device 0): a process of the group may have died or not reached this step; "
          "this process aborted its communicators of the set")
  entered, release = threading.Event(), threading.Event()
  kv, groups, out = Store(), [[(0, 0), (1, 1)]], {}
  natives = {0: Native(fail=step), 1: Native(entered=entered, release=release)}

  def one(me):
    start = time.monotonic()
    try:
      distributed.create(natives[me], kv, groups, me, _record(), 1000, {me: 0},
                         timeout_ms=4000)
    except agreement.SpanError as e:
      out[me] = (str(e), time.monotonic() - start)

  threads = {p: threading.Thread(target=one, args=(p,)) for p in (0, 1)}
  for t in threads.values():
    t.start()
  try:
    threads[0].join(30)
    assert 0 in out
    text, seconds = out[0]
    assert text == f"creating the communicators failed in process 0: {step}"
    assert seconds < 3  # no wait for process 1's post (the store's bound is 4 s)
    assert entered.wait(30)  # process 1 is inside its creation
  finally:
    release.set()  # process 1 comes back from NCCL: its creation succeeded
  threads[1].join(30)
  assert out[1][0] == text  # the same words in every process
  # Process 1's creation succeeded, but the set is refused: it released it;
  # process 0's native creation had released its own.
  assert natives[1].destroyed == [3] and natives[0].destroyed == []


def test_f10_different_decision_inputs_are_refused_alike_naming_them():
  out, _ = _run([[(0, 0), (1, 1)]], {0: _record(max_bytes=1024), 1: _record()},
                {0: Native(), 1: Native()})
  assert str(out[0]) == str(out[1])
  assert "decision inputs differ (max_bytes" in str(out[0])


def test_f10_a_creation_failure_anywhere_is_refused_everywhere():
  natives = {0: Native(comm_id=5), 1: Native(fail="ncclCommInitRank: unhandled system error")}
  out, _ = _run([[(0, 0), (1, 1)]], {0: _record(), 1: _record()}, natives)
  assert str(out[0]) == str(out[1])
  assert "failed in process 1: ncclCommInitRank" in str(out[0])
  # Process 0 made its set, which nothing will use: it released it (its id
  # never left distributed.create); process 1 has nothing to release.
  assert natives[0].destroyed == [5] and natives[1].destroyed == []


def test_f10_a_set_that_cannot_be_released_is_logged_and_the_refusal_stands(caplog):
  natives = {0: Native(comm_id=5, destroy_fails="jax_llar: communicator set 5 holds ..."),
             1: Native(fail="ncclCommInitRank: unhandled system error")}
  caplog.set_level(logging.WARNING, logger="jax_llar")
  out, _ = _run([[(0, 0), (1, 1)]], {0: _record(), 1: _record()}, natives)
  assert str(out[0]) == str(out[1]) and "failed in process 1" in str(out[0])
  assert natives[0].destroyed == [5]
  (r,) = [r for r in caplog.records if r.name == "jax_llar"]
  assert "communicator set 5 was refused" in r.getMessage()
  assert "RuntimeError: jax_llar: communicator set 5 holds" in r.getMessage()


def _native_module():
  """jax_llar._llar without a GPU (its bindings that make no CUDA call, and
  the refusals before the first one), or a skip."""
  import ctypes  # pylint: disable=g-import-not-at-top
  import importlib  # pylint: disable=g-import-not-at-top
  if not _ext.built():
    pytest.skip("the CUDA extension is not built here")
  path = _ext.nccl_library_path()
  if path is None:
    pytest.skip("no libnccl.so.2 to load the CUDA extension with (the test extra brings "
                "nvidia-nccl-cu13)")
  ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
  return importlib.import_module("jax_llar._llar")


def test_destroy_comm_set_refuses_an_unknown_id():
  """The native binding without a GPU: no set exists, so every id is
  refused, naming it (a set's release on GPUs:
  tests/gpu/test_failures.py::test_f11_a_set_destroyed_before_use_returns_its_memory)."""
  ext = _native_module()
  for comm_id in (0, -1, 1, 7, 255, 256, 1 << 40):
    with pytest.raises(RuntimeError, match=f"^jax_llar: no communicator set {comm_id}$"):
      ext.destroy_comm_set(comm_id)


# --- NCCL_COMM_BLOCKING in NCCL's configuration files (registry/nccl_settings.h: NcclSettingOf) ----


def _conf(tmp_path, name, *lines):
  path = tmp_path / name
  path.write_bytes("".join(lines).encode())
  return str(path)


def test_nccl_setting_reads_the_environment_then_the_files_in_order(tmp_path, monkeypatch):
  """NCCL 2.28's precedence (src/misc/param.cc): a variable set in the
  environment wins, even empty; else the first file that sets it, and in a
  file its first line (NCCL copies the files into the environment without
  overwriting)."""
  ext = _native_module()
  name = "NCCL_COMM_BLOCKING"
  monkeypatch.delenv(name, raising=False)
  user = _conf(tmp_path, "user.conf", "# NCCL_COMM_BLOCKING=7\n", "NCCL_DEBUG=WARN\n",
               "NCCL_COMM_BLOCKING=1\n", "NCCL_COMM_BLOCKING=0\n")
  system = _conf(tmp_path, "system.conf", "NCCL_COMM_BLOCKING=0\n")
  missing = str(tmp_path / "missing.conf")
  assert ext.nccl_setting(name, files=[missing, user, system]) == ("1", user)
  assert ext.nccl_setting(name, files=[system, user]) == ("0", system)
  assert ext.nccl_setting(name, files=[missing]) is None
  assert ext.nccl_setting("NCCL_DEBUG", files=[user]) == ("WARN", user)
  monkeypatch.setenv(name, "0")
  assert ext.nccl_setting(name, files=[user]) == ("0", "the environment")
  monkeypatch.setenv(name, "")  # set but empty: still the environment's (NCCL's default)
  assert ext.nccl_setting(name, files=[user]) == ("", "the environment")


@pytest.mark.parametrize("lines, want", [
    (["NCCL_COMM_BLOCKING=1"], "1"),  # no final newline
    (["NCCL_COMM_BLOCKING=1\r\n"], "1\r"),  # only '\n' is dropped (NCCL 2.28)
    (["NCCL_COMM_BLOCKING= 1\n"], " 1"),  # nothing trimmed
    (["NCCL_COMM_BLOCKING=a=b\n"], "a=b"),  # split at the first '='
    (["NCCL_COMM_BLOCKING=\n", "NCCL_COMM_BLOCKING=1\n"], ""),  # an empty value counts
    ([" NCCL_COMM_BLOCKING=1\n"], None),  # another name: " NCCL_COMM_BLOCKING"
    (["NCCL_COMM_BLOCKING =1\n"], None),
    (["#NCCL_COMM_BLOCKING=1\n"], None),
    (["NCCL_COMM_BLOCKING\n", "\n", "=1\n"], None),
    (["NCCL_COMM_BLOCKING_X=1\n", "NCCL_COMM_BLOCKIN=1\n"], None),
], ids=["no_newline", "crlf", "space_in_value", "equals_in_value", "empty_first",
        "space_before_name", "space_after_name", "comment", "no_equals", "other_names"])
def test_nccl_setting_parses_lines_as_nccl_does(tmp_path, monkeypatch, lines, want):
  ext = _native_module()
  monkeypatch.delenv("NCCL_COMM_BLOCKING", raising=False)
  path = _conf(tmp_path, "nccl.conf", *lines)
  got = ext.nccl_setting("NCCL_COMM_BLOCKING", files=[path])
  assert got == (None if want is None else (want, path))


def test_nccl_conf_files_are_nccls(monkeypatch):
  """$NCCL_CONF_FILE replaces ~/.nccl.conf, whose home is the password
  database's (NCCL 2.28 does not read $HOME); /etc/nccl.conf comes last."""
  import pwd  # pylint: disable=g-import-not-at-top
  ext = _native_module()
  monkeypatch.setenv("NCCL_CONF_FILE", "/tmp/mine.conf")
  assert ext.nccl_conf_files() == ["/tmp/mine.conf", "/etc/nccl.conf"]
  monkeypatch.setenv("NCCL_CONF_FILE", "")  # empty: as unset
  monkeypatch.setenv("HOME", "/nonexistent-home")
  home = pwd.getpwuid(os.getuid()).pw_dir
  assert ext.nccl_conf_files() == [f"{home}/.nccl.conf", "/etc/nccl.conf"]


@pytest.mark.parametrize("value, want", [
    ("1", 1), (" 1", 1), ("+1", 1), ("0x1", 1), ("01", 1), ("1abc", 1), ("1\r", 1),
    ("0", 0), ("", -5), ("abc", 0), ("2", 2), ("99999999999999999999", -5),
])
def test_nccl_int_value_is_strtoll_base_0(value, want):
  assert _native_module().nccl_int_value(value, -5) == want


def test_nccl_comm_blocking_in_a_conf_file_refuses_a_spanning_group(tmp_path, monkeypatch):
  """The refusal reads NCCL's files too, names the file, and lets the
  environment take precedence (it checks before any CUDA device is needed,
  so it runs here without a GPU)."""
  ext = _native_module()
  monkeypatch.delenv("NCCL_COMM_BLOCKING", raising=False)
  conf = _conf(tmp_path, "nccl.conf", "NCCL_COMM_BLOCKING=0x1\n")
  monkeypatch.setenv("NCCL_CONF_FILE", conf)
  spanning = [(2, [0], [0], bytes(128))]
  with pytest.raises(RuntimeError) as e:
    ext.create_comm_set_of_ranks(spanning, 1_000_000, 1000)
  assert str(e.value).startswith(
      f"jax_llar: NCCL_COMM_BLOCKING=0x1 (set in {conf}, one of NCCL's configuration files) "
      "makes NCCL's set-up calls blocking"), str(e.value)
  assert "remove it from that file" in str(e.value)
  monkeypatch.setenv("NCCL_COMM_BLOCKING", "1")
  # In the environment it may be the user's, or a file's value that NCCL
  # copied there: the message says both and how to undo either.
  with pytest.raises(RuntimeError, match=r"NCCL_COMM_BLOCKING=1 \(set in the environment: by the "
                     r"user, or copied there by NCCL from one of its configuration files\)"
                     r".*unset it, or remove it from NCCL's configuration file"):
    ext.create_comm_set_of_ranks(spanning, 1_000_000, 1000)
  monkeypatch.setenv("NCCL_COMM_BLOCKING", "0")  # the environment wins over the file
  with pytest.raises(RuntimeError) as e:
    ext.create_comm_set_of_ranks(spanning, 1_000_000, 1000)
  assert "NCCL_COMM_BLOCKING" not in str(e.value)  # refused later, for want of a device


def test_a_non_utf8_byte_in_an_nccl_conf_file_is_a_runtime_error(tmp_path, monkeypatch):
  """A configuration file's bytes need not be UTF-8 ("NCCL_COMM_BLOCKING=1"
  then byte 0xff): the refusal is a RuntimeError whose text escapes the
  byte, and nccl_setting gives it back as a lone surrogate, never a
  UnicodeDecodeError."""
  ext = _native_module()
  monkeypatch.delenv("NCCL_COMM_BLOCKING", raising=False)
  conf = tmp_path / "bad.conf"
  conf.write_bytes(b"NCCL_COMM_BLOCKING=1\xff\n")
  assert ext.nccl_setting("NCCL_COMM_BLOCKING", files=[str(conf)]) == ("1\udcff", str(conf))
  monkeypatch.setenv("NCCL_CONF_FILE", str(conf))
  with pytest.raises(RuntimeError) as e:
    ext.create_comm_set_of_ranks([(2, [0], [0], bytes(128))], 1_000_000, 1000)
  assert str(e.value).startswith("jax_llar: NCCL_COMM_BLOCKING=1\\xff (set in "), str(e.value)


def test_f10_any_exception_of_the_native_creation_is_posted_as_the_failure():
  """An exception other than RuntimeError in one process's native creation
  (a UnicodeDecodeError before the fix above) is still posted: every
  process refuses with its text, none waits for a post that never comes."""
  bad = UnicodeDecodeError("utf-8", b"\xff", 0, 1, "invalid start byte")

  class Odd(Native):
    def create_comm_set_of_ranks(self, specs, timeout_ns, setup_timeout_ms):
      raise bad

  natives = {0: Native(), 1: Odd()}
  out, kv = _run([[(0, 0), (1, 1)]], {0: _record(), 1: _record()}, natives, timeout_ms=20_000)
  assert all(isinstance(e, agreement.SpanError) for e in out.values()), out
  assert str(out[0]) == str(out[1]) == (
      f"creating the communicators failed in process 1: UnicodeDecodeError: {bad}")
  assert natives[0].destroyed == [3]
  assert kv.values[distributed.set_key([[(0, 0), (1, 1)]]) + "/made/1"].startswith(
      "UnicodeDecodeError")


def test_f10_groups_that_share_some_but_not_all_processes_are_refused_alike():
  """G0 = {P0, P1}, G1 = {P0, P2}: a region's verdict on G0 is read by P1
  and P0 alone, but P0 also acts on G1's, so P1 could publish while P0
  falls back (one member of G0 in jax_llar's kernel, the other in NCCL's
  all-reduce). Every process refuses the set from the groups alone, with
  the same text, before any store traffic."""
  groups = [[(0, 0), (1, 2)], [(0, 1), (2, 3)]]
  natives = {p: Native() for p in range(3)}
  out, kv = _run(groups, {p: _record() for p in range(3)}, natives)
  assert all(isinstance(e, agreement.SpanError) for e in out.values()), out
  assert str(out[0]) == str(out[1]) == str(out[2])
  assert "share process(es) 0 but not all their processes" in str(out[0])
  assert kv.values == {} and all(n.specs is None for n in natives.values())
  # Identical memberships, and disjoint ones, are served.
  assert distributed.mixed_memberships([[(0, 0), (1, 2)], [(0, 1), (1, 3)]]) is None
  assert distributed.mixed_memberships([[(0, 0), (1, 1)], [(2, 2), (3, 3)]]) is None
  assert distributed.mixed_memberships([[(0, 0), (1, 1)], [(1, 2), (0, 3)]]) is None


def test_f10_a_process_that_never_arrives_ends_in_an_error_not_a_hang():
  kv = Store()
  native = Native()
  with pytest.raises(agreement.SpanError, match="process 1 did not post"):
    distributed.create(native, kv, [[(0, 0), (1, 1)]], 0, _record(), 1000, {0: 0},
                       timeout_ms=200)
  assert native.destroyed == []  # refused at the agreement: no set was made


def test_region_agreement_all_or_none():
  kv = Store()
  members, order = [[0, 1]], [0]

  def both(errors, key, stage=distributed.ALLOCATED):
    got = {}

    def one(me):
      agree = distributed.region_agreement(kv, key, 1, members, order, me,
                                           timeout_ms=5000)
      got[me] = agree(0, stage, errors[me])

    threads = [threading.Thread(target=one, args=(p,)) for p in (0, 1)]
    for t in threads:
      t.start()
    for t in threads:
      t.join(60)
    return got

  assert both({0: "", 1: ""}, "a") == {0: True, 1: True}
  assert both({0: "", 1: "cudaMalloc: out of memory"}, "b") == {0: False, 1: False}
  # The two stages of one region have keys of their own.
  assert both({0: "", 1: ""}, "c", distributed.REGISTERED) == {0: True, 1: True}
  assert both({0: "", 1: ""}, "c", distributed.ALLOCATED) == {0: True, 1: True}
  assert kv.values["c/region/1/0/registered/verdict"] == agreement.GO
  assert kv.values["c/region/1/0/registered/1"] == "registered"
  assert kv.values["c/region/1/0/1"] == "ok"
  # A peer that never posts: False after the timeout, never an exception.
  agree = distributed.region_agreement(Store(), "k", 1, members, order, 0, timeout_ms=100)
  assert agree(0, distributed.ALLOCATED, "") is False
  assert agree(0, distributed.REGISTERED, "") is False
  assert agree(0, "published", "") is False  # an unknown stage is refused


class RegionNative:
  """The native EnsureRegion's steps for one process of a spanning group
  (registry.h: EnsureRegion, RegionAgreement), with the agreement of
  jax_llar.distributed: allocate, agree at "allocated", register (after
  `delay` seconds; `register_error` is this process's outcome: an NCCL error,
  or its bound passing while the others' step completes), agree at
  "registered", publish only on True, else give up the set. `stages` records
  what it did."""

  def __init__(self, alloc_error="", register_error="", delay=0.0):
    self.alloc_error, self.register_error, self.delay = alloc_error, register_error, delay
    self.stages = []

  def ensure_region(self, comm_id, algorithm, agree):
    del comm_id, algorithm
    import time  # pylint: disable=g-import-not-at-top
    if not agree(0, distributed.ALLOCATED, self.alloc_error) or self.alloc_error:
      self.stages.append("refused before registering")
      raise RuntimeError("region refused")
    self.stages.append("registering")
    time.sleep(self.delay)
    if agree(0, distributed.REGISTERED, self.register_error) and not self.register_error:
      self.stages.append("published")
      return
    self.stages.append("gave up the set")
    raise RuntimeError("set given up")


def _ensure_in_both(natives, timeout_ms=5000):
  """RegionNative.ensure_region in one thread per process (0 and 1), with
  the agreement of one key-value store; {process: seconds to return}."""
  import time  # pylint: disable=g-import-not-at-top
  kv, seconds = Store(), {}

  def one(me):
    agree = distributed.region_agreement(kv, "k", 1, [[0, 1]], [0], me, timeout_ms=timeout_ms)
    start = time.monotonic()
    try:
      natives[me].ensure_region(3, 1, agree)
    except RuntimeError:
      pass
    seconds[me] = time.monotonic() - start

  threads = [threading.Thread(target=one, args=(p,)) for p in natives]
  for t in threads:
    t.start()
  for t in threads:
    t.join(60)
  return seconds


def test_f10_a_region_every_process_registered_is_published_everywhere():
  natives = {0: RegionNative(), 1: RegionNative(delay=0.2)}
  _ensure_in_both(natives)
  assert natives[0].stages == natives[1].stages == ["registering", "published"]


@pytest.mark.parametrize("failing, late", [(1, 0), (0, 0)],
                         ids=["process_1_fails_first", "process_0_fails_last"])
def test_f10_a_registration_that_fails_in_one_process_is_published_in_none(failing, late):
  """The registration completes in one process (NCCL's closing barrier
  passed) and fails in the other (here: its bound ran out just before it
  saw its own step complete). Neither publishes: both give up the set, in
  either order of arrival, and the failing process does not wait for the
  other's post (it may be gone)."""
  error = ("jax_llar: ncclCommWindowRegister did not complete within 4000 ms for rank 1 of 2 "
           "(CUDA device 0): a process of the group may have died or not reached this step")
  natives = {p: RegionNative(register_error=error if p == failing else "",
                             delay=0.5 if p == late else 0.0) for p in (0, 1)}
  seconds = _ensure_in_both(natives, timeout_ms=4000)
  for p in (0, 1):
    assert natives[p].stages == ["registering", "gave up the set"], (p, natives[p].stages)
  if failing != late:  # the failing process came first: it did not wait for the other
    assert seconds[failing] < 0.4, seconds
  assert max(seconds.values()) < 3, seconds  # nobody waited out the store's bound


def test_f10_a_region_that_one_process_cannot_allocate_is_registered_nowhere():
  natives = {0: RegionNative(), 1: RegionNative(alloc_error="ncclMemAlloc: out of memory")}
  _ensure_in_both(natives)
  assert natives[0].stages == natives[1].stages == ["refused before registering"]


def test_f10_a_region_go_is_followed_by_a_process_whose_reads_timed_out():
  """The region stages act on the verdict alone: process 0 saw every post
  and wrote GO; process 1's reads of the posts time out, and it still
  publishes with process 0 (it does not read the posts again, which could
  fail and leave process 0 alone on the fast path)."""
  kv = Store()
  base = "k/region/1/0/registered"
  kv.key_value_set(f"{base}/0", "registered")
  kv.key_value_set(f"{base}/verdict", agreement.GO)

  class Deaf(Store):
    """Posts go through; every read of a post times out, the verdict's
    read does not."""

    def __init__(self, inner):
      self.inner = inner

    def key_value_set(self, key, value):
      self.inner.key_value_set(key, value)

    def blocking_key_value_get(self, key, timeout_in_ms):
      if not key.endswith("/verdict"):
        raise TimeoutError("DEADLINE_EXCEEDED")
      return self.inner.blocking_key_value_get(key, timeout_in_ms)

  agree = distributed.region_agreement(Deaf(kv), "k", 1, [[0, 1]], [0], 1, timeout_ms=100)
  assert agree(0, distributed.REGISTERED, "") is True


def test_decision_inputs_follow_the_settings(monkeypatch):
  a = inputs.decision_inputs(2, None)
  monkeypatch.setattr(settings, "max_bytes", settings.max_bytes // 2)
  b = inputs.decision_inputs(2, None)
  assert a != b and {k for k in a if a[k] != b[k]} == {"max_bytes"}
  monkeypatch.setenv("XLA_FLAGS", "--xla_gpu_command_buffer_scheduling_mode=CONCURRENT")
  assert inputs.decision_inputs(2, None)["concurrent_flag"] is True
  assert distributed.host_identity().startswith(("boot:", "host:"))


# --- the lowering with jax.distributed -------------------------------------------------


class FakeGpu:
  platform = "gpu"

  def __init__(self, i, process_index):
    self.id = i
    # As jaxlib: another process's device has no ordinal here (process 0 runs).
    self.local_hardware_id = 0 if process_index == 0 else None
    self.process_index = process_index
    self.compute_capability = "9.0"


class FakeExt:
  ALGORITHMS = {"one_shot_ll": 1}

  def __init__(self):
    self.agrees = []

  def comm_key(self, comm_id):
    return 77

  def ensure_region(self, comm_id, algorithm, agree=None):
    self.agrees.append((comm_id, algorithm, agree))

  def regions(self, comm_id):
    return []

  def nccl_runtime_version(self):
    return 22809

  def error_reports(self):
    return []


def test_f10_lowering_spanning_processes_bootstraps_through_the_store(monkeypatch, caplog):
  """With jax.distributed, a psum whose group holds another process's GPU
  takes the fast path through get_or_create_spanning, and its region is
  agreed across the processes."""
  ext = FakeExt()
  monkeypatch.setattr(_ext, "_loaded", True)
  monkeypatch.setattr(_ext, "_module", ext)
  monkeypatch.setattr(_ext, "_reason", None)
  monkeypatch.setattr(comm, "_sets", {})
  monkeypatch.setenv("NCCL_NVLS_ENABLE", "0")
  monkeypatch.setattr(agreement, "store", lambda: Store())
  seen = {}

  def create(mod, kv, groups, me, record, timeout_ns, ordinals, timeout_ms=None):
    seen.update(groups=groups, me=me, record=record, ordinals=ordinals)
    return 9, [0]

  monkeypatch.setattr(distributed, "create", create)
  monkeypatch.setattr(jax, "process_count", lambda: 2)
  devices = np.array([FakeGpu(0, 0), FakeGpu(1, 1)])
  ctx = SPMDAxisContext(Mesh(devices, ("x",)))
  aval = jax.core.ShapedArray((256,), np.float32)
  d = dispatch.decide(ctx, aval, ("x",), platform="cuda")
  assert (d.reason, d.algorithm, d.comm_id, d.comm_key) == ("fast_path", ONE_SHOT_LL, 9, 77)
  assert seen["groups"] == [[(0, 0), (1, 1)]] and seen["me"] == 0
  assert seen["ordinals"] == {0: 0}  # only this process's device has an ordinal
  assert seen["record"]["inputs"]["max_bytes"] == settings.max_bytes
  (cid, alg, agree), = ext.agrees
  assert (cid, alg) == (9, int(ONE_SHOT_LL)) and callable(agree)
  # A setting changed in this process after the agreement: its psums refuse
  # (the others, which agreed on the old inputs, would decide otherwise).
  monkeypatch.setattr(settings, "max_bytes", settings.max_bytes // 2)
  d = dispatch.decide(ctx, aval, ("x",), platform="cuda")
  assert d.reason == "communicator" and "inputs changed" in d.detail and "max_bytes" in d.detail
  # Without jax.distributed: refused, once, saying what to call.
  monkeypatch.setattr(agreement, "store", lambda: None)
  monkeypatch.setattr(comm, "_sets", {})
  caplog.set_level(logging.INFO, logger="jax_llar")
  d = dispatch.decide(ctx, aval, ("x",), platform="cuda")
  assert d.reason == "multiprocess" and "jax.distributed.initialize" in d.detail


def test_f10_two_cpu_processes_bootstrap_through_jax_distributed():
  """The protocol through the real jax.distributed key-value store: two CPU
  processes started by the launcher (tests/distributed_child.py)."""
  import json
  import pathlib
  import subprocess
  import sys
  child = pathlib.Path(__file__).parent / "distributed_child.py"
  r = subprocess.run([sys.executable, "-m", "jax_llar.tools.launch", "--nproc", "2",
                      "--grace_s", "5", "--", str(child)], capture_output=True, text=True,
                     timeout=240)
  assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
  lines = {}
  for line in r.stdout.splitlines():
    tag, _, rest = line.partition(" ")
    if rest.startswith("{"):
      lines[int(tag.strip("[]"))] = json.loads(rest)
  assert sorted(lines) == [0, 1]
  for p, got in lines.items():
    assert (got["me"], got["processes"], got["comm_id"], got["order"]) == (p, 2, 3, [0])
    assert got["spec"] == [2, [p]] and got["agree"] == [True, True]
  assert lines[0]["uid"] == lines[1]["uid"] and len(lines[0]["uid"]) == 256


def test_f10_a_process_that_raises_ends_the_launch_within_the_grace_period():
  """An uncaught exception in one process (tests/launch_failing_child.py)
  ends it at once (launch.initialize's hook), so the launcher kills the other
  after --grace_s instead of waiting for JAX's shutdown, which waits for every
  peer (the other would sleep 120 s)."""
  import pathlib
  import subprocess
  import sys
  import time
  child = pathlib.Path(__file__).parent / "launch_failing_child.py"
  t0 = time.monotonic()
  r = subprocess.run([sys.executable, "-m", "jax_llar.tools.launch", "--nproc", "2",
                      "--grace_s", "2", "--", str(child)], capture_output=True, text=True,
                     timeout=240)
  took = time.monotonic() - t0
  out = r.stdout + r.stderr
  assert r.returncode == 1, out[-3000:]
  assert "process 1 fails on purpose" in out and "started 0" in out, out[-3000:]
  assert "killing process 0" in out, out[-3000:]
  assert took < 90, (took, out[-3000:])


def test_f10_a_late_process_follows_the_early_ones_refusal_and_never_enters_nccl():
  """Process 1 gives up waiting for process 0 (its timeout); process 0
  arrives later and finds every post: it must still refuse, because the
  first verdict written wins, or it would enter ncclCommInitRank alone."""
  kv, groups = Store(), [[(0, 0), (1, 1)]]
  natives = {0: Native(), 1: Native()}
  with pytest.raises(agreement.SpanError, match="process 0 did not post") as early:
    distributed.create(natives[1], kv, groups, 1, _record(), 1000, {1: 0}, timeout_ms=100)
  with pytest.raises(agreement.SpanError) as late:
    distributed.create(natives[0], kv, groups, 0, _record(), 1000, {0: 0}, timeout_ms=2000)
  assert str(late.value) == str(early.value)
  assert natives[0].specs is None and natives[1].specs is None  # no NCCL call anywhere
  assert not any("/uid/" in k for k in kv.values)


def test_f10_a_go_verdict_is_followed_by_a_process_whose_reads_timed_out():
  """The reverse order: process 0 saw every post and wrote GO first; process
  1's reads then time out, and it goes on with the others on the verdict
  alone, without reading the posts again (a refusal here, or a failed
  re-read, would leave process 0 alone in NCCL)."""
  kv = Store()
  base = "k/record"
  kv.key_value_set(f"{base}/0", "a")
  kv.key_value_set(f"{base}/verdict", agreement.GO)

  class Slow(Store):
    def __init__(self, inner):
      self.inner, self.calls = inner, 0

    def key_value_set(self, key, value):
      self.inner.key_value_set(key, value)

    def blocking_key_value_get(self, key, timeout_in_ms):
      self.calls += 1
      if self.calls == 1:
        raise TimeoutError("DEADLINE_EXCEEDED")  # the first read misses
      return self.inner.blocking_key_value_get(key, timeout_in_ms)

  slow = Slow(kv)
  agreement.agreed(slow, base, [0, 1], 1, "b", 100,
                      lambda v: agreement.GO)  # pylint: disable=protected-access
  assert slow.calls == 2  # the missed read, then the verdict; no post read again
  assert kv.values[f"{base}/verdict"] == agreement.GO


def test_f10_a_go_at_made_is_followed_by_a_process_that_cannot_read_the_posts():
  """The set-level stage `made`: process 0 wrote GO; process 1's reads of
  the posts fail (the store answers only the verdict). Process 1 keeps its
  set and goes on with process 0, instead of refusing alone and destroying
  it while process 0 uses it."""
  groups = [[(0, 0), (1, 1)]]
  key = distributed.set_key(groups)
  kv = Store()
  kv.key_value_set(f"{key}/record/0", '{"host": "h", "inputs": {}}')
  kv.key_value_set(f"{key}/record/verdict", agreement.GO)
  kv.key_value_set(f"{key}/uid/0", bytes(128).hex())
  kv.key_value_set(f"{key}/made/0", "ok")
  kv.key_value_set(f"{key}/made/verdict", agreement.GO)

  class Deaf:
    def key_value_set(self, k, value):
      kv.key_value_set(k, value)

    def blocking_key_value_get(self, k, timeout_in_ms):
      if not k.endswith("/verdict") and "/made/" in k:
        raise TimeoutError("DEADLINE_EXCEEDED")
      return kv.blocking_key_value_get(k, timeout_in_ms)

  native = Native(comm_id=4)
  got = distributed.create(native, Deaf(), groups, 1, {"host": "h", "inputs": {}}, 1000,
                           {1: 0}, timeout_ms=200)
  assert got == (4, [0]) and native.destroyed == []
