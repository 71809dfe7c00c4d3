"""The lowering rules of jax_llar.psum: facts, policy, environment, FFI call.

``jax_llar.lowering.decide`` runs on real CPU meshes: the facts it records
(dtype, bytes per rank, number of ranks, replica groups), the order of its
reasons, the candidate it keeps when the environment refuses, and logging
once per reason. The CUDA lowering is checked as text
(``lowering_platforms=("cuda",)``). The branches only a GPU machine reaches
run with the fewest fakes possible: a real ``Mesh`` over fake GPU device
objects (``FakeGpu``), and a fake extension module (``FakeExtension``) put
in ``jax_llar._ext``'s state, so that ``jax_llar.comm`` runs for real.
"""

from __future__ import annotations

import json
import re
import logging

import jax
import ml_dtypes
import numpy as np
import pytest
from jax import lax
from jax._src.sharding_impls import ShardingContext, SPMDAxisContext
from jax.sharding import Mesh, PartitionSpec as P

import jax_llar
from jax_llar import _ext, comm, dispatch, log
from jax_llar.algorithms import MAX_BYTES, Algorithm
from jax_llar.config import settings as llar_settings

from cpu_helpers import (BF16, MESH_CASES, axes_tuple, index_groups, mesh_of,
                         random_input, shard_psum)

ONE_SHOT_LL = Algorithm.ONE_SHOT_LL


def _ctx(shape=(2, 4), names=("a", "b")):
  return SPMDAxisContext(mesh_of(shape, names))


def _aval(shape, dtype=np.float32):
  return jax.core.ShapedArray(shape, np.dtype(dtype))


def _decide(ctx, aval, axes, platform="cuda"):
  return dispatch.decide(ctx, aval, axes, platform=platform)


# --- decisions on CPU: the facts and the candidate (issue 15, item 3) ---------


def test_readme_quickstart_on_cpu_records_what_a_gpu_would_do():
  """The README's quickstart on a 2-device CPU mesh: the decision carries
  the number of ranks, the payload and the algorithm CUDA GPUs would run;
  an int16 psum says "dtype", as it would on GPUs."""
  mesh = Mesh(np.array(jax.devices()[:2]), ("tp",))

  @jax.jit
  def step(x):
    return jax.shard_map(lambda v: jax_llar.psum(v, "tp"), mesh=mesh,
                         in_specs=P("tp"), out_specs=P())(x)

  out = step(jax.numpy.ones((2 * 1024,), jax.numpy.bfloat16))
  np.testing.assert_array_equal(np.asarray(out, np.float32), 2.0)
  d = jax_llar.dispatch_log()[-1]
  assert (d.reason, d.world_size, d.bytes_per_rank, d.dtype, d.axes) == (
      "platform", 2, 2048, "bfloat16", ("tp",))
  assert (d.candidate, d.algorithm, d.fast, d.impl) == (
      ONE_SHOT_LL, None, False, "lax.psum")
  assert "CUDA-only" in d.detail and "one_shot_ll" in d.detail
  step(jax.numpy.ones((2 * 1024,), jax.numpy.int16))
  d = jax_llar.dispatch_log()[-1]
  assert (d.reason, d.world_size, d.bytes_per_rank, d.dtype, d.candidate) == (
      "dtype", 2, 2048, "int16", None)


def test_cpu_lowering_logs_platform_fallback(caplog):
  caplog.set_level(logging.INFO, logger="jax_llar")
  mesh = mesh_of((2, 4), ("a", "b"))
  x = random_input(np.random.default_rng(15), (8, 6), BF16)
  shard_psum(jax_llar.psum, mesh, "b", x)
  shard_psum(jax_llar.psum, mesh, "b", x * 2)  # same program, new lambda
  log_ = jax_llar.dispatch_log()
  assert len(log_) == 2
  for d in log_:
    assert d.impl == "lax.psum" and d.reason == "platform" and not d.fast
    assert d.axes == ("b",) and d.dtype == "bfloat16"
    assert d.bytes_per_rank == 6 * 2 and d.comm_id == 0
    assert d.world_size == 4 and d.candidate is ONE_SHOT_LL
  msgs = [r.getMessage() for r in caplog.records if r.name == "jax_llar"]
  assert len([m for m in msgs if "CUDA-only" in m]) == 1, msgs
  assert "4 ranks" in msgs[0] and "12 bytes per rank" in msgs[0]
  jax_llar.clear_dispatch_log()
  assert jax_llar.dispatch_log() == []
  shard_psum(jax_llar.psum, mesh, "b", x)
  msgs = [r.getMessage() for r in caplog.records if r.name == "jax_llar"]
  assert len([m for m in msgs if "CUDA-only" in m]) == 2, msgs
  assert [d.reason for d in jax_llar.dispatch_log()] == ["platform"]


@pytest.mark.parametrize("platform", ["cpu", "cuda"])
def test_decide_records_the_facts_whatever_the_reason(platform, monkeypatch):
  """Every field is populated for every reason: the facts come from the
  mesh before any check."""
  ctx = _ctx()
  cases = {  # reason: (ctx, aval, axes)
      "dtype": (ctx, _aval((5, 3), np.int16), ("a", "b")),
      "empty": (ctx, _aval((0, 3)), ("b",)),
      "mesh": (None, _aval((5, 3)), ("b",)),
      "world_size": (_ctx((1, 2)), _aval((5, 3)), ("a",)),
      "size": (ctx, _aval((llar_settings.max_bytes // 4 + 1,)), ("a",)),
      "platform": (ctx, _aval((5, 3), BF16), ("a", "b")),
  }
  want = {  # reason: (bytes per rank, number of ranks, candidate)
      "dtype": (30, 8, None), "empty": (0, 4, None), "mesh": (60, 0, None),
      "world_size": (60, 1, None),
      "size": (llar_settings.max_bytes + 4, 2, None),
      "platform": (30, 8, ONE_SHOT_LL),
  }
  for reason, (c, aval, axes) in cases.items():
    d = _decide(c, aval, axes, platform)
    assert d.reason == reason
    assert (d.bytes_per_rank, d.world_size, d.candidate) == want[reason], reason
    assert d.axes == axes and d.dtype == str(aval.dtype)
    assert (d.algorithm, d.comm_id, d.comm_key, d.impl) == (None, 0, 0, "lax.psum")
    assert isinstance(d.detail, str) and d.detail
    assert json.loads(json.dumps(d.to_dict()))["reason"] == reason
  monkeypatch.setattr(llar_settings, "disabled", True)
  d = _decide(ctx, _aval((5, 3)), ("b",), platform)
  assert (d.reason, d.world_size, d.bytes_per_rank, d.candidate) == (
      "disabled", 4, 60, ONE_SHOT_LL)


def test_decision_to_dict_is_json_ready():
  d = log.Decision(reason="fast_path", detail="one_shot_ll over 2 ranks",
                   axes=("x",), dtype="float32", bytes_per_rank=64,
                   world_size=2, algorithm=ONE_SHOT_LL, candidate=ONE_SHOT_LL,
                   comm_id=3, comm_key=99)
  assert d.fast and d.impl == "llar.one_shot_ll"
  assert json.loads(json.dumps(d.to_dict())) == {
      "reason": "fast_path", "detail": "one_shot_ll over 2 ranks",
      "axes": ["x"], "dtype": "float32", "bytes_per_rank": 64,
      "world_size": 2, "algorithm": "one_shot_ll", "candidate": "one_shot_ll",
      "comm_id": 3, "comm_key": 99, "source": "psum", "op": "psum",
      "impl": "llar.one_shot_ll", "fast": True}
  assert repr(d).startswith("Decision(impl='llar.one_shot_ll', reason=")
  with pytest.raises(TypeError):  # facts are keyword-only and required
    log.Decision("fast_path", "", ("x",), "float32", 64, 2)  # pylint: disable=too-many-function-args


def test_decide_reasons_and_order(monkeypatch):
  """Payload reasons (the policy's) come before environment reasons, so a
  decision taken anywhere says what matters for the psum itself."""
  ctx, axes = _ctx(), ("b",)
  # The policy before the environment: disabled, but an unsupported dtype.
  monkeypatch.setattr(llar_settings, "disabled", True)
  d = _decide(ctx, _aval((4,), np.int16), axes)
  assert (d.impl, d.reason) == ("lax.psum", "dtype")
  d = _decide(ctx, _aval((4,)), axes)
  assert (d.impl, d.reason, d.candidate) == ("lax.psum", "disabled", ONE_SHOT_LL)
  monkeypatch.setattr(llar_settings, "disabled", False)
  # dtype before empty; empty before the mesh.
  assert _decide(ctx, _aval((0,), np.int16), axes).reason == "dtype"
  for dt in (np.int16, np.bool_, np.float64, np.int8, np.complex64,
             ml_dtypes.float8_e4m3fn):
    assert _decide(ctx, _aval((4,), dt), axes).reason == "dtype"
  for dt in (np.float32, BF16, np.float16, np.int32):
    assert _decide(None, _aval((3, 0), dt), axes).reason == "empty"
  # no SPMD axis context, or an abstract mesh: "mesh".
  assert _decide(None, _aval((4,)), axes).reason == "mesh"
  assert _decide(ShardingContext(2), _aval((4,)), axes).reason == "mesh"
  abstract = SPMDAxisContext(mesh_of((2, 4), ("a", "b")).abstract_mesh)
  assert _decide(abstract, _aval((4,)), axes).reason == "mesh"
  # a group of one device.
  d = _decide(_ctx((1, 2)), _aval((4,)), ("a",))
  assert (d.reason, d.world_size) == ("world_size", 1)
  # CPU devices: "platform", with the right world size and payload, for
  # the CUDA rule (non-GPU devices) and every other platform's.
  for platform in ("cuda", "cpu"):
    for axes_, world in ((("a",), 2), (("b",), 4), (("a", "b"), 8)):
      d = _decide(ctx, _aval((5, 3), BF16), axes_, platform)
      assert (d.impl, d.reason, d.world_size) == ("lax.psum", "platform", world)
      assert (d.axes, d.dtype, d.bytes_per_rank) == (axes_, "bfloat16", 30)
  assert "non-GPU devices (cpu)" in _decide(ctx, _aval((4,)), axes).detail
  assert "lowering for cpu" in _decide(ctx, _aval((4,)), axes, "cpu").detail
  # The XLA flags come before the platform (test_concurrent_... below).


def test_concurrent_command_buffer_scheduling_falls_back(monkeypatch):
  mesh = Mesh(np.array(jax.devices()[:2]), ("x",))
  aval = jax.core.ShapedArray((16,), np.float32)
  monkeypatch.setenv("XLA_FLAGS", "--xla_gpu_command_buffer_scheduling_mode=CONCURRENT")
  d = _decide(SPMDAxisContext(mesh), aval, ("x",))
  assert (d.impl, d.reason) == ("lax.psum", "xla_flags")
  assert (d.world_size, d.candidate) == (2, ONE_SHOT_LL)
  monkeypatch.setenv("XLA_FLAGS", "--xla_gpu_command_buffer_scheduling_mode=LHS")
  assert _decide(SPMDAxisContext(mesh), aval, ("x",)).reason == "platform"


def test_decide_size_threshold(monkeypatch):
  ctx, axes = _ctx(), ("b",)
  # CPU devices have no architecture, so no tuning table: the default rule
  # (the one-shot up to its limit) under the default cap (4 MiB).
  limit = MAX_BYTES[ONE_SHOT_LL]
  assert limit == 256 * 1024 < llar_settings.max_bytes
  at = _decide(ctx, _aval((limit // 4,)), axes)
  above = _decide(ctx, _aval((limit // 4 + 1,)), axes)
  assert (at.reason, above.reason) == ("platform", "size")
  assert above.bytes_per_rank == limit + 4 and above.world_size == 4
  monkeypatch.setattr(llar_settings, "max_bytes", 1000)
  assert _decide(ctx, _aval((500,), BF16), axes).reason == "platform"
  assert _decide(ctx, _aval((501,), BF16), axes).reason == "size"
  assert _decide(ctx, _aval((251,)), axes).reason == "size"


def test_each_fallback_reason_logged_once(caplog, monkeypatch):
  caplog.set_level(logging.DEBUG, logger="jax_llar")
  ctx, axes = _ctx(), ("b",)
  big = llar_settings.max_bytes // 4 + 1

  def all_reasons():
    monkeypatch.setattr(llar_settings, "disabled", True)
    out = [_decide(ctx, _aval((4,)), axes)]
    monkeypatch.setattr(llar_settings, "disabled", False)
    out += [_decide(ctx, _aval((4,), np.int16), axes),
            _decide(ctx, _aval((0,)), axes),
            _decide(None, _aval((4,)), axes),
            _decide(_ctx((1, 2)), _aval((4,)), ("a",)),
            _decide(ctx, _aval((big,)), axes),
            _decide(ctx, _aval((4,)), axes)]
    return [d.reason for d in out]

  reasons = ["disabled", "dtype", "empty", "mesh", "world_size", "size",
             "platform"]
  for _ in range(3):
    assert all_reasons() == reasons
  records = [r for r in caplog.records if r.name == "jax_llar"]
  assert len(records) == len(reasons), [r.getMessage() for r in records]
  log_ = jax_llar.dispatch_log()
  assert [d.reason for d in log_] == reasons * 3
  for r, d in zip(records, log_):
    assert d.detail in r.getMessage() and str(d.axes) in r.getMessage()
  # What the user asked for, or loses nothing by, is INFO; the rest WARNING.
  assert [r.levelno for r in records] == [
      logging.INFO, logging.WARNING, logging.INFO, logging.WARNING,
      logging.INFO, logging.WARNING, logging.WARNING]
  jax_llar.clear_dispatch_log()
  assert jax_llar.dispatch_log() == []
  assert all_reasons() == reasons
  records = [r for r in caplog.records if r.name == "jax_llar"]
  assert len(records) == 2 * len(reasons)


def test_replica_groups_follow_jax_layout():
  for shape, names, axes in MESH_CASES:
    mesh = mesh_of(shape, names)
    flat = list(mesh.devices.flat)
    groups = dispatch.replica_groups(SPMDAxisContext(mesh), axes_tuple(axes))
    got = sorted(sorted(flat.index(d) for d in g) for g in groups)
    want = sorted(sorted(g) for g in index_groups(shape, names, axes).tolist())
    assert got == want, (shape, axes)
  assert dispatch.replica_groups(None, ("x",)) is None
  assert dispatch.replica_groups(_ctx(), ("nope",)) is None


# --- the GPU-only branches: fake GPU devices, a fake extension ---------------------


class FakeGpu:
  """What decide() reads of a jax.Device."""
  platform = "gpu"

  def __init__(self, i, process_index=0):
    self.id = i
    self.local_hardware_id = i
    self.process_index = process_index

  def __repr__(self):
    return f"FakeGpu({self.id})"


class FakeExtension:
  """What jax_llar._ext and jax_llar.comm call of jax_llar._llar."""
  ALGORITHMS = {"one_shot_ll": 1}
  MAX_BYTES = {"one_shot_ll": MAX_BYTES[ONE_SHOT_LL]}
  MAX_RANKS = 16

  def __init__(self, refuse: str | None = None):
    self.refuse = refuse
    self.refuse_region = None
    self.created = []
    self.held = {}  # comm id -> FFI ids of the regions allocated, in order

  def create_comm_set(self, groups, timeout_ns):
    if self.refuse:
      raise RuntimeError(self.refuse)
    self.created.append((groups, timeout_ns))
    return 5

  def comm_key(self, comm_id):
    del comm_id
    return 1234

  def ensure_region(self, comm_id, algorithm):
    if self.refuse_region:
      raise RuntimeError(self.refuse_region)
    held = self.held.setdefault(comm_id, [])
    if algorithm not in held:
      held.append(algorithm)

  def regions(self, comm_id):
    return sorted(self.held.get(comm_id, []))

  def scratch_bytes(self, comm_id):
    return (1 << 20) * len(self.held.get(comm_id, []))

  def nccl_runtime_version(self):
    return 22809

  def error_reports(self):
    return []


def gpu_ctx(shape=(2, 4), names=("a", "b"), process_index=0):
  n = int(np.prod(shape))
  devices = np.array([FakeGpu(i, process_index) for i in range(n)])
  return SPMDAxisContext(Mesh(devices.reshape(shape), names))


@pytest.fixture
def fake_extension(monkeypatch):
  """jax_llar._ext holds a loaded FakeExtension; jax_llar.comm starts empty."""
  ext = FakeExtension()
  monkeypatch.setattr(_ext, "_loaded", True)
  monkeypatch.setattr(_ext, "_module", ext)
  monkeypatch.setattr(_ext, "_reason", None)
  monkeypatch.setattr(comm, "_sets", {})
  monkeypatch.setenv("NCCL_NVLS_ENABLE", "0")  # comm sets it; restored after
  return ext


def test_decide_gpu_branches(fake_extension):
  ctx, axes = gpu_ctx(), ("b",)
  limit = MAX_BYTES[ONE_SHOT_LL]  # FakeGpu has no architecture: the default rule
  d = _decide(ctx, _aval((limit // 2,), np.float16), axes)
  assert (d.impl, d.reason, d.comm_id, d.comm_key, d.world_size) == (
      "llar.one_shot_ll", "fast_path", 5, 1234, 4)
  assert d.fast and d.algorithm is ONE_SHOT_LL and d.candidate is ONE_SHOT_LL
  assert int(d.algorithm) == 1  # the FFI attribute
  assert fake_extension.created == [
      ([[0, 1, 2, 3], [4, 5, 6, 7]], llar_settings.timeout_ms * 1_000_000)]
  assert comm.comm_sets() == [comm.CommSet(
      comm_id=5, key=1234, groups=((0, 1, 2, 3), (4, 5, 6, 7)), world_size=4)]
  # The decision allocated the one-shot's region, and only it.
  (cs,) = comm.comm_sets()
  assert cs.regions == (ONE_SHOT_LL,) and cs.scratch_bytes == 1 << 20
  # The same groups again: the set is reused, not created again.
  assert _decide(ctx, _aval((8,)), axes).comm_id == 5
  assert len(fake_extension.created) == 1
  assert _decide(ctx, _aval((limit // 2 + 1,), np.float16),
                 axes).reason == "size"
  d = _decide(ctx, _aval((4,), np.int16), axes)
  assert (d.reason, d.algorithm, d.fast) == ("dtype", None, False)
  # more ranks than the kernels serve.
  d = _decide(gpu_ctx((17,), ("x",)), _aval((4,)), ("x",))
  assert (d.reason, d.world_size) == ("world_size", 17)
  # lowering for another platform, on GPUs.
  d = _decide(ctx, _aval((4,)), axes, "rocm")
  assert (d.reason, d.candidate) == ("platform", ONE_SHOT_LL)


def test_decide_gpu_environment_refusals(fake_extension, monkeypatch):
  ctx, axes = gpu_ctx(), ("b",)
  # groups spanning processes: a device of another process, or several.
  d = _decide(gpu_ctx(process_index=1), _aval((4,)), axes)
  assert (d.reason, d.world_size, d.candidate) == (
      "multiprocess", 4, ONE_SHOT_LL)
  monkeypatch.setattr(jax, "process_count", lambda: 2)
  assert _decide(ctx, _aval((4,)), axes).reason == "multiprocess"
  monkeypatch.undo()
  # communicator creation fails (the real jax_llar.comm, a refusing extension).
  monkeypatch.setattr(_ext, "_loaded", True)
  monkeypatch.setattr(_ext, "_module", FakeExtension(refuse="not peers"))
  monkeypatch.setattr(comm, "_sets", {})
  monkeypatch.setenv("NCCL_NVLS_ENABLE", "0")
  d = _decide(ctx, _aval((4,)), axes)
  assert (d.reason, d.candidate, d.comm_id) == ("communicator", ONE_SHOT_LL, 0)
  assert d.detail.startswith("not peers")
  assert "NVLink peers" in d.detail and "one_shot_ll" in d.detail
  # The set exists but its region cannot be allocated (out of memory):
  # refused the same way, and remembered (no allocation per later lowering).
  refusing = FakeExtension()
  refusing.refuse_region = "ncclMemAlloc: out of memory"
  monkeypatch.setattr(_ext, "_module", refusing)
  monkeypatch.setattr(comm, "_sets", {})
  monkeypatch.setattr(comm, "_region_failures", {})
  d = _decide(ctx, _aval((4,)), axes)
  assert (d.reason, d.comm_id) == ("communicator", 0)
  assert d.detail.startswith("ncclMemAlloc: out of memory")
  refusing.refuse_region = None  # would succeed now, but the failure stands
  d = _decide(ctx, _aval((4,)), axes)
  assert (d.reason, d.fast) == ("communicator", False)
  assert comm.comm_sets()[0].regions == ()
  # A new process (here: the memo cleared) allocates it.
  monkeypatch.setattr(comm, "_region_failures", {})
  d = _decide(ctx, _aval((4,)), axes)
  assert (d.reason, d.fast) == ("fast_path", True)
  assert comm.comm_sets()[0].regions == (ONE_SHOT_LL,)
  # The extension is not loaded: the real jax_llar._ext on a CPU machine.
  monkeypatch.undo()
  d = _decide(gpu_ctx(), _aval((4,)), axes)
  assert (d.reason, d.candidate) == ("extension", ONE_SHOT_LL)
  assert d.detail.startswith(_ext.reason())


def test_cached_communicator_failure_is_raised_fresh(monkeypatch):
  key = ((90, 91),)
  monkeypatch.setitem(comm._sets, key, comm.CommError("devices 90 and 91 are not peers"))  # pylint: disable=protected-access
  errors = []
  for _ in range(3):
    with pytest.raises(comm.CommError, match="not peers") as e:
      comm.get_or_create([[90, 91]])
    errors.append(e.value)
  assert len({id(e) for e in errors}) == 3  # no traceback grows across lowerings


# --- CUDA lowering (as text, on CPU) -------------------------------------------------


def _cuda_text(fn, x, mesh, platforms=("cuda",), debug_info=False):
  f = jax.jit(jax.shard_map(lambda v: fn(v, "x"), mesh=mesh, in_specs=P("x"),
                            out_specs=P()))
  return f.trace(x).lower(lowering_platforms=platforms).as_text(
      debug_info=debug_info)


def strip_mark(text: str) -> str:
  """`text` without the frontend attributes of jax_llar's mark."""
  text = re.sub(r' ?\{mhlo\.frontend_attributes = \{jax_llar = "\w+"\}\}', "", text)
  return text.replace('mhlo.frontend_attributes = {jax_llar = "psum"}, ', "")


def test_cuda_lowering_emits_ffi_call(monkeypatch):
  mesh = mesh_of((2,), ("x",))
  x = random_input(np.random.default_rng(16), (2, 8), np.float32)
  seen = []

  def fast_on_cuda(axis_ctx, aval, axes, *, platform, source, **kw):
    seen.append((type(axis_ctx), aval.shape, axes, platform))
    assert source == "psum" and kw == {"axis_index_groups": None,
                                       "for_export": False}
    if platform != "cuda":
      return log.Decision(reason="platform", detail="", axes=tuple(axes),
                          dtype="float32", bytes_per_rank=32, world_size=2,
                          candidate=ONE_SHOT_LL)
    return log.Decision(reason="fast_path", detail="", axes=tuple(axes),
                        dtype="float32", bytes_per_rank=32, world_size=2,
                        algorithm=ONE_SHOT_LL, candidate=ONE_SHOT_LL,
                        comm_id=7, comm_key=4242)

  monkeypatch.setattr(dispatch, "decide", fast_on_cuda)
  text = _cuda_text(jax_llar.psum, x, mesh)
  assert "custom_call @jax_llar_all_reduce" in text
  assert "comm_id = 7" in text and "algorithm = 1" in text
  assert "comm_key = 4242" in text
  assert "all_reduce\"" not in text
  assert seen == [(SPMDAxisContext, (1, 8), ("x",), "cuda")]
  # The op name says jax_llar, the algorithm, dtype, bytes and ranks, under
  # the name stack of the psum (what XLA's metadata and traces show).
  text = _cuda_text(jax_llar.psum, x, mesh, debug_info=True)
  name = re.search(r'(#loc\d+) = loc\("([^"]*)jax_llar\.one_shot_ll\.f32\.32B\.2ranks"', text)
  assert name is not None, text
  assert f'loc("jax_llar.one_shot_ll:"({name.group(1)}))' in text
  del seen[1:]
  # Lowered for CUDA and CPU together: the CPU branch keeps lax.psum, and
  # both rules asked decide().
  text = _cuda_text(jax_llar.psum, x, mesh, ("cuda", "cpu"))
  assert "custom_call @jax_llar_all_reduce" in text
  assert "stablehlo.all_reduce" in text
  assert sorted(s[3] for s in seen[1:]) == ["cpu", "cuda"]


def test_cuda_lowering_on_cpu_devices_falls_back():
  mesh = mesh_of((2,), ("x",))
  x = random_input(np.random.default_rng(17), (2, 8), np.float32)
  text = _cuda_text(jax_llar.psum, x, mesh)
  assert "jax_llar_all_reduce" not in text
  assert "stablehlo.all_reduce" in text
  # The fallback lowers exactly like lax.psum, the mark aside.
  assert 'mhlo.frontend_attributes = {jax_llar = "psum"}' in text
  assert strip_mark(text) == _cuda_text(lax.psum, x, mesh)
  log_ = jax_llar.dispatch_log()
  assert [(d.impl, d.reason, d.world_size, d.candidate) for d in log_] == [
      ("lax.psum", "platform", 2, ONE_SHOT_LL)]
  text = _cuda_text(jax_llar.psum, x.astype(np.int16), mesh)
  assert "jax_llar_all_reduce" not in text and "stablehlo.all_reduce" in text
  assert jax_llar.dispatch_log()[-1].reason == "dtype"


def test_multi_platform_lowering_decides_per_platform():
  """Lowered for CUDA and CPU on CPU devices: one decision per rule, both
  with the facts; neither emits the FFI call."""
  mesh = mesh_of((4,), ("x",))
  x = random_input(np.random.default_rng(18), (4, 8), np.float32)
  text = _cuda_text(jax_llar.psum, x, mesh, ("cuda", "cpu"))
  assert "jax_llar_all_reduce" not in text
  details = sorted(d.detail for d in jax_llar.dispatch_log())
  assert len(details) == 2
  assert "lowering for cpu" in details[0]
  assert "non-GPU devices" in details[1]
  assert {(d.reason, d.world_size, d.bytes_per_rank, d.candidate)
          for d in jax_llar.dispatch_log()} == {("platform", 4, 32, ONE_SHOT_LL)}


def test_psum_of_several_operands_splits_fast_and_fallback(monkeypatch):
  """A psum of a pytree binds one equation with several operands; operands the
  policy serves become FFI calls and the rest one all-reduce of JAX's rule."""
  mesh = mesh_of((2,), ("x",))
  rng = np.random.default_rng(20)
  a = random_input(rng, (2, 8), np.float32)
  b = random_input(rng, (2, 4), np.float32)

  def fast_for_8(axis_ctx, aval, axes, *, platform, source, **kw):
    del axis_ctx, source, kw
    n = int(np.prod(aval.shape)) * 4
    if platform == "cuda" and aval.shape[-1] == 8:
      return log.Decision(reason="fast_path", detail="", axes=tuple(axes),
                          dtype="float32", bytes_per_rank=n, world_size=2,
                          algorithm=ONE_SHOT_LL, candidate=ONE_SHOT_LL, comm_id=3,
                          comm_key=9)
    return log.Decision(reason="size", detail="", axes=tuple(axes), dtype="float32",
                        bytes_per_rank=n, world_size=2)

  monkeypatch.setattr(dispatch, "decide", fast_for_8)
  f = jax.jit(jax.shard_map(lambda u, v: jax_llar.psum((u, v), "x"), mesh=mesh,
                            in_specs=(P("x"), P("x")), out_specs=(P(), P())))
  text = f.trace(a, b).lower(lowering_platforms=("cuda",)).as_text()
  assert text.count("custom_call @jax_llar_all_reduce") == 1
  assert text.count("stablehlo.all_reduce") == 1
  assert re.search(r"jax_llar_all_reduce\(%\w+\).*tensor<1x8xf32>", text)
  assert re.search(r"all_reduce\"\(%\w+\).*\n(.*\n){0,6}.*tensor<1x4xf32>", text)


def test_partially_manual_shard_map_keeps_lax_psum():
  """shard_map(axis_names={"x"}) on a 2 x 2 mesh leaves "y" automatic: XLA
  would gather the custom call's operand over "y", so the psum stays JAX's."""
  mesh = jax.make_mesh((2, 2), ("x", "y"),
                       axis_types=(jax.sharding.AxisType.Auto,) * 2)
  x = jax.device_put(np.ones((4, 8), np.float32),
                     jax.sharding.NamedSharding(mesh, P("x", "y")))
  f = jax.jit(jax.shard_map(lambda v: jax_llar.psum(v, "x") * 2, mesh=mesh,
                            in_specs=P("x"), out_specs=P(), axis_names={"x"}))
  f.trace(x).lower(lowering_platforms=("cuda",))
  (d,) = jax_llar.dispatch_log()
  assert d.reason == "partial_manual" and "y" in d.detail


def test_a_warning_follows_an_info_line_of_the_same_refusal(caplog):
  caplog.set_level(logging.INFO, logger="jax_llar")
  mesh = mesh_of((2,), ("x",))
  x = np.ones(4, np.int16)
  run = lambda fn: jax.jit(jax.shard_map(lambda v: fn(v, "x"), mesh=mesh,  # noqa: E731
                                         in_specs=P("x"), out_specs=P())).lower(x)
  with jax_llar.swap_psum():
    run(lax.psum)
  run(jax_llar.psum)
  levels = [r.levelname for r in caplog.records if "dtype" in r.getMessage()]
  assert levels == ["INFO", "WARNING"], levels


def test_expected_fallbacks_are_info_and_a_broken_environment_a_warning(caplog, monkeypatch):
  """No GPU (a lowering for CPU) and one device are what a user expects on a
  machine without GPUs: INFO once per reason, also for an explicit
  jax_llar.psum; a psum that CUDA GPUs would serve but this machine cannot
  (no extension: the environment) stays a WARNING; a line whose number of
  ranks is not known says so instead of "0 ranks"."""
  caplog.set_level(logging.INFO, logger="jax_llar")
  mesh = mesh_of((2,), ("x",))
  x = random_input(np.random.default_rng(31), (2, 8), np.float32)
  shard_psum(jax_llar.psum, mesh, "x", x)
  one = mesh_of((1,), ("x",))
  jax.jit(jax.shard_map(lambda v: jax_llar.psum(v, "x"), mesh=one, in_specs=P("x"),
                        out_specs=P()))(x[:1])
  levels = {r.getMessage().split(": ")[-1][:30]: r.levelname for r in caplog.records
            if r.name == "jax_llar"}
  assert set(levels.values()) == {"INFO"}, levels
  caplog.clear()
  jax.jit(lambda v: jax_llar.psum(v, 0))(x)  # positional: the ranks are not known
  (line,) = [r.getMessage() for r in caplog.records if r.name == "jax_llar"]
  assert "ranks not known" in line and "0 ranks" not in line, line
  caplog.clear()
  monkeypatch.setattr(_ext, "load", lambda **kw: None)
  monkeypatch.setattr(_ext, "reason", lambda: "no extension here")
  d = dispatch.decide(gpu_ctx((2,), ("x",)), _aval((8,)), ("x",), platform="cuda")
  assert d.reason == "extension"
  assert [r.levelname for r in caplog.records if r.name == "jax_llar"] == ["WARNING"]


def test_the_fast_path_call_carries_the_extension_build_and_so_the_cache_key(monkeypatch):
  """Every fast-path call names the extension's build in a frontend
  attribute (beside the mark), so JAX's persistent compilation cache, whose
  key is the program, gives an executable of one build to no other build:
  two builds, two keys; the same build, one key."""
  from jax._src import cache_key  # pylint: disable=g-import-not-at-top
  from jax._src.lib import xla_client  # pylint: disable=g-import-not-at-top
  mesh = mesh_of((2,), ("x",))
  x = random_input(np.random.default_rng(32), (2, 8), np.float32)

  def fast(axis_ctx, aval, axes, *, platform, source, **kw):
    del axis_ctx, source, kw
    return log.Decision(reason="fast_path", detail="", axes=tuple(axes), dtype="float32",
                        bytes_per_rank=int(np.prod(aval.shape)) * 4, world_size=2,
                        algorithm=ONE_SHOT_LL, candidate=ONE_SHOT_LL, comm_id=7,
                        comm_key=4242)

  monkeypatch.setattr(dispatch, "decide", fast)

  def lowered(identity):
    monkeypatch.setattr(_ext, "build_identity", lambda: identity)
    f = jax.jit(jax.shard_map(lambda v: jax_llar.psum(v, "x"), mesh=mesh, in_specs=P("x"),
                              out_specs=P()))
    low = f.trace(x).lower(lowering_platforms=("cuda",))
    module = low.compiler_ir("stablehlo")
    key = cache_key.get(module, np.array(mesh.devices.flat), xla_client.CompileOptions(),
                        jax.devices()[0].client)
    return low.as_text(), key

  text_a, key_a = lowered("aaaaaaaaaaaaaaaa")
  (call,) = [ln for ln in text_a.splitlines() if "custom_call @jax_llar_all_reduce" in ln]
  assert 'jax_llar_build = "aaaaaaaaaaaaaaaa"' in call and 'jax_llar = "psum"' in call, call
  text_b, key_b = lowered("bbbbbbbbbbbbbbbb")
  assert 'jax_llar_build = "bbbbbbbbbbbbbbbb"' in text_b
  assert key_a != key_b
  assert lowered("aaaaaaaaaaaaaaaa")[1] == key_a


def test_build_identity_is_none_without_the_extension_and_stable_with_one(monkeypatch,
                                                                          tmp_path):
  monkeypatch.setattr(_ext, "_module", None)
  assert _ext.build_identity() is None
  lib = tmp_path / "_llar.so"
  lib.write_bytes(b"one build")

  class Mod:
    __file__ = str(lib)
    ALGORITHMS = {"one_shot_ll": 1}

  monkeypatch.setattr(_ext, "_module", Mod)
  monkeypatch.setattr(_ext, "_identity", None)
  first = _ext.build_identity()
  assert first is not None and len(first) == 16 and _ext.build_identity() == first
  lib.write_bytes(b"another build")  # a rebuild in another process
  monkeypatch.setattr(_ext, "_identity", None)
  assert _ext.build_identity() != first
