"""One named CPU test (or more) per failure class F1-F13 (issue 12, item 3).

The classes are ../shared/cases/FAILURE_CLASSES.md's. On CPU the psums run
on the 8 forced host devices (tests/conftest.py), where jax_llar.psum lowers
as lax.psum with the decision a GPU would get; the GPU-only branches of the
lowering rule run with tests/test_lowering.py's fake GPU devices
(``gpu_ctx``) and fake extension (``FakeExtension``), so that jax_llar.comm
and jax_llar.status run for real. The device side of each class (kernels,
flags, memory, waits) is the GPU suite's.

| class | other CPU tests | GPU tests (tests/gpu, tests/gpu1) | here |
| --- | --- | --- | --- |
| F1 | test_psum::test_special_values, test_sentinel_host (NaN patterns) | test_values::test_f1_special_values, test_sentinel_loopback | test_f1_* |
| F2 | test_policy::test_every_row_boundary, test_row_boundaries_written_out, test_default_rule_without_a_table; test_lowering::test_decide_size_threshold; test_psum::test_shapes_scalars_and_empty | test_values::test_f2_* | test_f2_* |
| F3 | test_psum::test_other_dtypes_fall_back_like_lax, test_policy::test_dtype | test_sentinel_loopback (int32 refusal) | test_f3_* |
| F4 | test_psum::test_500_independent_psums_in_one_jit, test_signature::test_signature_of_is_in_range_nonzero_and_input_sensitive | test_values::test_f4_*, test_failures::test_f4_epoch_wraparound | test_f4_* |
| F5 | test_swap::test_swap_is_per_thread, test_tools_gpu_checks::test_f5_requires_the_fast_path | test_failures::test_f5_two_threads_dispatching | test_f5_* |
| F6 | - | test_xla::test_f6_mixed_with_nccl_collectives | test_f6_* |
| F7 | test_psum::test_control_flow | test_xla::test_f7_*, test_transforms::test_f7_inside_control_flow | test_f7_* |
| F8 | test_psum (vma, out_specs, grad, vmap, outside shard_map), test_fused | test_transforms::test_f8_typing_grad_vmap_scan | test_f8_* |
| F9 | - | test_values::test_f9_determinism_across_sizes | test_f9_* |
| F10 | test_lowering::test_decide_gpu_environment_refusals | (multi-process issue) | test_f10_* |
| F11 | test_lowering::test_decide_gpu_branches, test_decide_gpu_environment_refusals; test_distributed (a refused set is released) | test_failures::test_f11_memory_returns_to_its_baseline, test_f11_a_set_destroyed_before_use_returns_its_memory | test_f11_* |
| F12 | test_signature::test_ll128_and_timeout_reports_are_decoded | test_failures::test_f12_*, test_loopback (rank left out) | test_f12_* |
| F13 | test_signature::test_foreign_signature_report_is_decoded | test_failures::test_f13_*, test_signature_loopback | test_f13_* |
"""

from __future__ import annotations

import logging
import re
import threading

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from jax import lax
from jax.sharding import PartitionSpec as P

import jax_llar
from jax_llar import _ext, comm, dispatch, signature
from jax_llar.algorithms import MAX_BYTES, Algorithm

from cpu_helpers import (BF16, assert_bitwise, check_against_reference,
                         index_groups, mesh_of, random_input, shard_psum)
from test_lowering import FakeExtension, gpu_ctx

ONE_SHOT_LL = Algorithm.ONE_SHOT_LL
LIMIT = MAX_BYTES[ONE_SHOT_LL]  # the default rule's limit (no tuning table)


def _aval(shape, dtype=np.float32):
  return jax.core.ShapedArray(shape, np.dtype(dtype))


class CountingExtension(FakeExtension):
  """FakeExtension that counts the allocations asked of it."""

  def __init__(self, refuse=None):
    super().__init__(refuse)
    self.region_calls = 0

  def ensure_region(self, comm_id, algorithm):
    self.region_calls += 1
    super().ensure_region(comm_id, algorithm)


@pytest.fixture
def fake_ext(monkeypatch):
  """jax_llar._ext holds a loaded CountingExtension; jax_llar.comm starts empty."""
  ext = CountingExtension()
  monkeypatch.setattr(_ext, "_loaded", True)
  monkeypatch.setattr(_ext, "_module", ext)
  monkeypatch.setattr(_ext, "_reason", None)
  monkeypatch.setattr(comm, "_sets", {})
  monkeypatch.setattr(comm, "_region_failures", {})
  monkeypatch.setenv("NCCL_NVLS_ENABLE", "0")
  return ext


def _fast(axis_ctx, aval, axes, *, platform, op="psum", **kw):
  """decide() giving every psum the one-shot fast path (CUDA text on CPU)."""
  del axis_ctx, platform, kw
  nbytes = int(np.prod(aval.shape)) * np.dtype(aval.dtype).itemsize
  return jax_llar.Decision(
      reason="fast_path", detail="", axes=tuple(axes), dtype=str(aval.dtype),
      bytes_per_rank=nbytes, world_size=2, algorithm=ONE_SHOT_LL,
      candidate=ONE_SHOT_LL, comm_id=7, comm_key=4242, op=op)


def _cuda_text(body, x, mesh):
  f = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=P("x"), out_specs=P("x"),
                            check_vma=False))
  return f.trace(x).lower(lowering_platforms=("cuda",)).as_text()


# --- F1: special values ---------------------------------------------------------------


@pytest.mark.parametrize("world", [2, 8])
def test_f1_special_values_equal_lax_psum_bitwise(world):
  """-0.0, +0.0, subnormals, NaN payloads, +-inf over 2 and 8 ranks: bitwise
  lax.psum's (NaN payloads included); NaN/inf positions and finite values
  those of the float64 rank-order reference. (4 ranks, three dtypes:
  test_psum::test_special_values.)"""
  dtype = np.dtype(np.float32)
  tiny = float(ml_dtypes.finfo(dtype).smallest_subnormal)
  rng = np.random.default_rng(101)
  cols = [[-0.0] * world, [0.0] * world, [tiny] * world, [-tiny] * world,
          [np.nan] + [1.0] * (world - 1), [np.inf] + [2.0] * (world - 1),
          [-np.inf] + [2.0] * (world - 1), [np.inf, -np.inf] + [0.0] * (world - 2),
          list(rng.standard_normal(world))]
  x = np.array(cols, np.float64).T.astype(dtype)
  x.view(np.uint32)[0, 4] = 0xFFC00123  # a negative NaN with a payload
  x.view(np.uint32)[world - 1, 1] = 0x7FC00042  # a second payload elsewhere
  mesh = mesh_of((world,), ("x",))
  got = shard_psum(jax_llar.psum, mesh, "x", x)
  assert_bitwise(got, shard_psum(lax.psum, mesh, "x", x))
  ref = jax_llar.testing.rank_order_sum(list(x), dtype).astype(np.float64)
  for row in got.astype(np.float64):
    np.testing.assert_array_equal(np.isnan(row), np.isnan(ref))
    np.testing.assert_array_equal(row[np.isinf(ref)], ref[np.isinf(ref)])
    fin = np.isfinite(ref)
    # subnormal sums: lax.psum on CPU may flush them to zero (FTZ).
    bound = np.where(np.abs(ref[fin]) <= world * tiny, world * tiny,
                     1e-6 * np.abs(ref[fin]))
    assert np.all(np.abs(row[fin] - ref[fin]) <= bound)
  assert np.isnan(ref[[1, 4, 7]]).all() and np.isinf(ref[[5, 6]]).all()


# --- F2: odd sizes and thresholds ------------------------------------------------------

ODD_SIZES = [0, 1, 2, 3, 7, 17, 1023, 4097]


@pytest.mark.parametrize("dtype", [np.float32, BF16, np.int32], ids=str)
def test_f2_odd_sizes_on_cpu_equal_lax_and_the_reference(dtype):
  """Each odd element count: bitwise lax.psum, the reference, and a decision
  with the right payload ("empty" for 0, else what a GPU would run)."""
  dtype = np.dtype(dtype)
  mesh = mesh_of((4,), ("x",))
  rng = np.random.default_rng(102)
  for n in ODD_SIZES:
    jax_llar.clear_dispatch_log()
    x = random_input(rng, (4, n), dtype)
    got = shard_psum(jax_llar.psum, mesh, "x", x)
    assert_bitwise(got, shard_psum(lax.psum, mesh, "x", x))
    check_against_reference(got, x, index_groups((4,), ("x",), "x"))
    (d,) = jax_llar.dispatch_log()
    assert d.bytes_per_rank == n * dtype.itemsize and d.world_size == 4
    assert (d.reason, d.candidate) == (("empty", None) if n == 0
                                       else ("platform", ONE_SHOT_LL)), n


@pytest.mark.parametrize("dtype", [np.float32, BF16, np.float16, np.int32], ids=str)
def test_f2_odd_sizes_and_threshold_through_the_gpu_lowering(fake_ext, dtype):
  """The GPU branch of decide() (fake GPUs and extension, the default rule):
  every odd size takes the fast path (0: "empty"); one 16-byte vector below
  and at the one-shot's limit too, one element and one vector above give
  "size". Table boundaries: test_policy::test_every_row_boundary."""
  del fake_ext
  itemsize = np.dtype(dtype).itemsize
  ctx = gpu_ctx((2,), ("x",))
  for n in ODD_SIZES:
    d = dispatch.decide(ctx, _aval((n,), dtype), ("x",), platform="cuda")
    assert (d.reason, d.bytes_per_rank) == (
        "empty" if n == 0 else "fast_path", n * itemsize), n
  vec = 16 // itemsize
  for n, want in ((LIMIT // itemsize - vec, "fast_path"),
                  (LIMIT // itemsize, "fast_path"),
                  (LIMIT // itemsize + 1, "size"),
                  (LIMIT // itemsize + vec, "size")):
    d = dispatch.decide(ctx, _aval((n,), dtype), ("x",), platform="cuda")
    assert d.reason == want, (n, d.reason, d.detail)
    assert d.algorithm is (ONE_SHOT_LL if want == "fast_path" else None)


# --- F3: dtypes ----------------------------------------------------------------------


@pytest.mark.parametrize("name", ["float64", "int64", "bool", "float8_e4m3fn",
                                  "float8_e5m2", "int16", "complex64"])
def test_f3_other_dtypes_fall_back_with_reason_dtype(name, caplog):
  """Never a crash: bitwise lax.psum, and a decision "dtype" logged once as a
  WARNING (bool: JAX sums it as int32, which the fast path serves)."""
  caplog.set_level(logging.INFO, logger="jax_llar")
  dtype = np.dtype(getattr(ml_dtypes, name, None) or name)
  mesh = mesh_of((2,), ("x",))
  rng = np.random.default_rng(103)
  with jax.enable_x64(dtype.itemsize == 8 and dtype.kind != "c"):
    if dtype.kind == "c":
      x = (rng.standard_normal((2, 9)) + 1j * rng.standard_normal((2, 9))).astype(dtype)
    else:
      x = random_input(rng, (2, 9), dtype)
    got = shard_psum(jax_llar.psum, mesh, "x", x)
    want = shard_psum(lax.psum, mesh, "x", x)
    shard_psum(jax_llar.psum, mesh, "x", x[:, :5])  # a second psum of the dtype
  assert got.dtype == want.dtype
  assert np.array_equal(got.view(np.uint8), want.view(np.uint8))
  if dtype.kind in "biuc":
    np.testing.assert_allclose(got[0], x.sum(0), rtol=1e-6)
  reasons = {d.reason for d in jax_llar.dispatch_log()}
  if dtype == np.bool_:
    assert reasons == {"platform"}
    assert {d.dtype for d in jax_llar.dispatch_log()} == {"int32"}
  else:
    assert reasons == {"dtype"}
    warned = [r for r in caplog.records
              if r.levelno == logging.WARNING and "dtype" in r.getMessage()]
    assert len(warned) == 1, [r.getMessage() for r in warned]


# --- F4: many calls ---------------------------------------------------------------------


def test_f4_500_distinct_psums_get_500_decisions_and_equal_results():
  """500 psums of 500 different sizes in one jit: 500 decisions (JAX cannot
  share their lowering), bitwise lax.psum's results. (500 equal-shaped
  psums: test_psum::test_500_independent_psums_in_one_jit.)"""
  mesh = mesh_of((2,), ("x",))
  x = random_input(np.random.default_rng(104), (2, 500 * 501 // 2), np.float32)
  starts = np.cumsum([0] + list(range(1, 500)))

  def make(fn):
    def body(v):
      return jnp.concatenate([fn(v[0, s:s + n + 1], "x")
                              for n, s in enumerate(starts)])[None]
    return jax.jit(jax.shard_map(body, mesh=mesh, in_specs=P("x"), out_specs=P("x")))

  got = np.asarray(make(jax_llar.psum)(x))
  assert_bitwise(got, np.asarray(make(lax.psum)(x)))
  log_ = jax_llar.dispatch_log()
  assert len(log_) == 500
  assert sorted(d.bytes_per_rank for d in log_) == [4 * n for n in range(1, 501)]
  assert {d.reason for d in log_} == {"platform"}


def test_f4_500_fast_path_calls_carry_500_distinct_signatures(monkeypatch):
  """Lowered for CUDA with the fast path: 500 FFI calls, 500 distinct
  nonzero 16-bit signatures in one module (the collision salt,
  jax_llar.signature.assign), the same when lowered again."""
  monkeypatch.setattr(dispatch, "decide", _fast)
  signature.clear()
  mesh = mesh_of((2,), ("x",))
  x = random_input(np.random.default_rng(105), (2, 500, 4), np.float32)

  def body(v):
    return jnp.stack([jax_llar.psum(v[0, i], "x") for i in range(500)])[None]

  try:
    text = _cuda_text(body, x, mesh)
    sigs = [int(s) for s in re.findall(r"signature = (\d+) : i64", text)]
    assert text.count("custom_call @jax_llar_all_reduce") == 500
    assert len(sigs) == 500 and len(set(sigs)) == 500
    assert min(sigs) >= 1 and max(sigs) <= signature.MAX_SIGNATURE
    again = [int(s) for s in re.findall(r"signature = (\d+) : i64",
                                        _cuda_text(body, x, mesh))]
    assert again == sigs
  finally:
    signature.clear()


# --- F5: concurrency --------------------------------------------------------------------


def test_f5_two_threads_lowering_and_running_at_once():
  """Two threads, each compiling and running its own psum programs on the
  same devices (one under swap_psum, one with jax_llar.psum): no exception,
  bitwise lax.psum's results, and every decision recorded with its source."""
  mesh = mesh_of((4,), ("x",))
  errors, done = [], []
  barrier = threading.Barrier(2)

  def worker(tid):
    try:
      rng = np.random.default_rng(106 + tid)
      barrier.wait()
      for i in range(12):
        x = random_input(rng, (4, 3 + 5 * i + tid), np.float32)
        want = shard_psum(lax.psum, mesh, "x", x)
        if tid == 0:
          got = shard_psum(jax_llar.psum, mesh, "x", x)
        else:
          with jax_llar.swap_psum():
            got = shard_psum(lax.psum, mesh, "x", x)
        assert_bitwise(got, want)
      done.append(tid)
    except Exception as e:  # pylint: disable=broad-except
      errors.append(e)

  threads = [threading.Thread(target=worker, args=(t,)) for t in range(2)]
  for t in threads:
    t.start()
  for t in threads:
    t.join(timeout=240)
  assert not errors, errors
  assert sorted(done) == [0, 1]
  log_ = jax_llar.dispatch_log()
  by_source = {s: sorted(d.bytes_per_rank for d in log_ if d.source == s)
               for s in ("psum", "swap")}
  assert by_source["psum"] == [4 * (3 + 5 * i) for i in range(12)]
  assert by_source["swap"] == [4 * (4 + 5 * i) for i in range(12)]
  assert {d.reason for d in log_} == {"platform"}


def test_f5_two_threads_deciding_share_one_communicator(fake_ext):
  """decide() from two threads at once on the GPU branch: every decision is
  the fast path with the same set, created once, its region allocated once."""
  ctx = gpu_ctx((2,), ("x",))
  results, errors = [], []
  barrier = threading.Barrier(2)

  def worker():
    try:
      barrier.wait()
      for n in range(1, 200):
        results.append(dispatch.decide(ctx, _aval((n,)), ("x",), platform="cuda"))
    except Exception as e:  # pylint: disable=broad-except
      errors.append(e)

  threads = [threading.Thread(target=worker) for _ in range(2)]
  for t in threads:
    t.start()
  for t in threads:
    t.join(timeout=120)
  assert not errors, errors
  assert len(results) == 2 * 199
  assert {(d.reason, d.comm_id, d.algorithm) for d in results} == {
      ("fast_path", 5, ONE_SHOT_LL)}
  assert len(fake_ext.created) == 1 and fake_ext.held == {5: [int(ONE_SHOT_LL)]}


# --- F6: mixed with XLA's collectives ---------------------------------------------------


def test_f6_mixed_with_lax_psum_and_all_gather():
  """Small jax_llar psums alternating with large lax.psum and all_gather in
  one program, run twice (first execution and again): exact results."""
  mesh = mesh_of((4,), ("x",))
  rng = np.random.default_rng(107)
  small = random_input(rng, (4, 8), np.int32)
  big = random_input(rng, (4, 4096), np.int32)

  def body(s, b):
    s, b = s[0], b[0]
    outs = []
    for _ in range(3):
      s = jax_llar.psum(s, "x") % 1000
      b = lax.psum(b, "x") % 1000
      outs.append(lax.all_gather(s, "x").sum(0) + b[:8])
    return jnp.stack(outs)[None], b[None]

  f = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=(P("x"), P("x")),
                            out_specs=(P("x"), P("x"))))
  s, b = small.astype(np.int64), big.astype(np.int64)
  want = []
  for _ in range(3):
    s = np.broadcast_to(s.sum(0) % 1000, s.shape)
    b = np.broadcast_to(b.sum(0) % 1000, b.shape)
    want.append(s.sum(0) + b[0, :8])
  for _ in range(2):
    got, gb = (np.asarray(o) for o in f(small, big))
    for r in range(4):
      np.testing.assert_array_equal(got[r], np.stack(want))
      np.testing.assert_array_equal(gb[r], b[0])
  log_ = jax_llar.dispatch_log()
  assert log_ and {(d.reason, d.bytes_per_rank) for d in log_} == {("platform", 32)}


# --- F7: control flow ----------------------------------------------------------------


def _loops(fn):
  def body(v):
    v = v[0]
    a = lax.while_loop(lambda s: s[0] < 3,
                       lambda s: (s[0] + 1, fn(s[1], "x") * 0.5),
                       (0, fn(v, "x")))[1]
    b = lax.cond(a[0] > -1e30, lambda u: fn(u, "x"), lambda u: u * 2.0, a)
    c = lax.scan(lambda c, _: (fn(c, "x") * 0.25, None), b, None, length=4)[0]
    return c[None]
  return body


def test_f7_psums_in_while_cond_scan_bodies():
  """A psum in a while_loop, a cond branch and a scan body: each body's
  psum is decided (lowered for CUDA: four FFI calls, the while's initial
  value's included, and no all-reduce left), and on CPU the result is bitwise lax.psum's. (Loops with
  check_vma both ways: test_psum::test_control_flow.)"""
  mesh = mesh_of((2,), ("x",))
  x = random_input(np.random.default_rng(108), (2, 16), np.float32)
  run = lambda fn: np.asarray(jax.jit(jax.shard_map(  # noqa: E731
      _loops(fn), mesh=mesh, in_specs=P("x"), out_specs=P("x")))(x))
  assert_bitwise(run(jax_llar.psum), run(lax.psum))
  assert len(jax_llar.dispatch_log()) >= 3
  assert {d.reason for d in jax_llar.dispatch_log()} == {"platform"}
  with pytest.MonkeyPatch.context() as mp:
    mp.setattr(dispatch, "decide", _fast)
    text = _cuda_text(_loops(jax_llar.psum), x, mesh)
  signature.clear()
  assert text.count("custom_call @jax_llar_all_reduce") == 4
  assert "stablehlo.all_reduce" not in text
  for region in ("stablehlo.while", "stablehlo.case"):
    assert region in text
  # the scan lowers to a while too: two while loops, each holding a call.
  assert text.count("stablehlo.while") == 2


# --- F8: typing and transforms ---------------------------------------------------------


def test_f8_check_vma_out_specs_grad_vmap_and_fused():
  """check_vma=True with out_specs=P(), jax.grad and jax.vmap through
  jax_llar.psum and psum_add_rms_norm: bitwise the lax code's. Outside
  shard_map: lax.psum's NameError. (Exhaustively: test_psum's typing and
  transform tests, test_fused.)"""
  mesh = mesh_of((4,), ("x",))
  rng = np.random.default_rng(109)
  x = random_input(rng, (4, 2, 16), np.float32)
  r = random_input(rng, (2, 16), np.float32)
  w = random_input(rng, (16,), np.float32)

  def run(psum, fused):
    def loss(x, r, w):
      n, nr = fused(psum(x[0], "x"), r, w)
      return jnp.sum(n * n) + jnp.sum(nr)

    def body(x, r, w):
      val, g = jax.value_and_grad(loss)(x, r, w)
      batched = jax.vmap(lambda row: psum(row, "x"))(x[0])
      return val, g, batched

    f = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=(P("x"), P(), P()),
                              out_specs=(P(), P("x"), P()), check_vma=True))
    return jax.tree.map(np.asarray, f(x, r, w))

  def unfused(x, r, w):
    nr = lax.psum(x, "x") + r
    n = nr * lax.rsqrt(jnp.mean(nr * nr, axis=-1, keepdims=True) + 1e-6) * w
    return n, nr

  fused = lambda x, r, w: jax_llar.psum_add_rms_norm(x, r, w, "x")  # noqa: E731
  got = run(jax_llar.psum, fused)
  want = run(lax.psum, unfused)
  for g, w_ in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
    assert_bitwise(g, w_)
  # Under differentiation the fused op is its reference, whose all-reduce
  # is a jax_llar.psum (jax_llar.fused): every decision is a psum's.
  assert {d.op for d in jax_llar.dispatch_log()} == {"psum"}
  jax_llar.clear_dispatch_log()
  jax.jit(jax.shard_map(lambda x, r, w: fused(x[0], r, w), mesh=mesh,
                        in_specs=(P("x"), P(), P()), out_specs=(P(), P())))(x, r, w)
  assert {d.op for d in jax_llar.dispatch_log()} == {"psum_add_rms_norm"}
  for call in (lambda: jax_llar.psum(x, "x"),
               lambda: jax.jit(lambda y: jax_llar.psum(y, "x"))(x)):
    with pytest.raises(NameError, match="unbound axis name: x"):
      call()


# --- F9: determinism -------------------------------------------------------------------


def test_f9_identical_rows_in_tensors_on_both_sides_of_the_threshold():
  """The same 64-element rows inside a tensor below the one-shot's limit and
  one above it (decisions "platform" and "size"): identical result rows on
  every rank."""
  mesh = mesh_of((2,), ("x",))
  row = random_input(np.random.default_rng(110), (2, 1, 64), np.float32)
  small_rows, big_rows = 4, LIMIT // (64 * 4) + 1
  outs = []
  for rows in (small_rows, big_rows):
    jax_llar.clear_dispatch_log()
    out = shard_psum(jax_llar.psum, mesh, "x", np.repeat(row, rows, axis=1))
    outs.append(out)
    (d,) = jax_llar.dispatch_log()
    assert d.reason == ("platform" if rows == small_rows else "size")
  for out in outs:
    for r in range(2):
      for i in range(out.shape[1]):
        assert_bitwise(out[r, i], outs[0][0, 0])


# --- F10: process modes ----------------------------------------------------------------


def test_f10_groups_spanning_processes_without_jax_distributed_refused_once(
    fake_ext, monkeypatch, caplog):
  """A group holding another process's devices, or several processes, and
  no jax.distributed key-value store: reason "multiprocess", one WARNING
  for many lowerings, no communicator. (With jax.distributed:
  tests/test_distributed.py.)"""
  caplog.set_level(logging.INFO, logger="jax_llar")
  for _ in range(5):
    d = dispatch.decide(gpu_ctx((2,), ("x",), process_index=1), _aval((8,)),
                        ("x",), platform="cuda")
    assert (d.reason, d.candidate, d.comm_id) == ("multiprocess", ONE_SHOT_LL, 0)
  monkeypatch.setattr(jax, "process_count", lambda: 2)
  for _ in range(5):
    d = dispatch.decide(gpu_ctx((2,), ("x",)), _aval((8,)), ("x",), platform="cuda")
    assert d.reason == "multiprocess"
  warned = [r for r in caplog.records if "jax.distributed is not initialised" in r.getMessage()]
  assert len(warned) == 1 and warned[0].levelno == logging.WARNING
  assert fake_ext.created == [] and fake_ext.region_calls == 0


def test_f10_devices_not_peers_refused_as_communicator_once(monkeypatch, caplog):
  """CUDA_VISIBLE_DEVICES-narrowed, or GPUs without NVLink between them: the
  communicator cannot be created; reason "communicator", one WARNING, and the
  creation is not tried again for the same groups."""
  caplog.set_level(logging.INFO, logger="jax_llar")
  ext = CountingExtension(refuse="devices 0 and 1 are not peers")
  calls = []
  orig = ext.create_comm_set
  ext.create_comm_set = lambda *a: calls.append(a) or orig(*a)
  monkeypatch.setattr(_ext, "_loaded", True)
  monkeypatch.setattr(_ext, "_module", ext)
  monkeypatch.setattr(_ext, "_reason", None)
  monkeypatch.setattr(comm, "_sets", {})
  monkeypatch.setenv("NCCL_NVLS_ENABLE", "0")
  for n in (4, 8, 16, 4):
    d = dispatch.decide(gpu_ctx((2,), ("x",)), _aval((n,)), ("x",), platform="cuda")
    assert (d.reason, d.comm_id, d.fast) == ("communicator", 0, False)
    assert "not peers" in d.detail
  assert len(calls) == 1
  warned = [r for r in caplog.records if "not peers" in r.getMessage()]
  assert len(warned) == 1 and warned[0].levelno == logging.WARNING


# --- F11: memory (host side) -------------------------------------------------------------


def test_f11_sets_and_regions_created_once_across_programs_and_clear_caches(fake_ext):
  """Many lowerings of many shapes, jax.clear_caches() between rounds: one
  set per group layout, one region per algorithm, the scratch reported."""
  mesh = mesh_of((2,), ("x",))
  ctx24, ctx2 = gpu_ctx(), gpu_ctx((2,), ("x",))
  for round_ in range(4):
    for n in range(1, 40):
      assert dispatch.decide(ctx24, _aval((n,)), ("b",), platform="cuda").fast
      assert dispatch.decide(ctx2, _aval((n, 3), BF16), ("x",), platform="cuda").fast
    # a real program compiled and dropped between rounds
    shard_psum(jax_llar.psum, mesh, "x", np.ones((2, round_ + 1), np.float32))
    jax.clear_caches()
  assert [g for g, _ in fake_ext.created] == [[[0, 1, 2, 3], [4, 5, 6, 7]], [[0, 1]]]
  assert fake_ext.region_calls == 1  # both layouts map to comm id 5 here
  sets = comm.comm_sets()
  assert len(sets) == 2
  assert all(cs.regions == (ONE_SHOT_LL,) and cs.scratch_bytes == 1 << 20
             for cs in sets)


def test_f11_a_failed_region_is_not_allocated_again(fake_ext):
  """Out of memory for a region: remembered (comm._region_failures), so 50
  later lowerings ask the extension nothing and fall back "communicator"."""
  fake_ext.refuse_region = "ncclMemAlloc: out of memory"
  ctx = gpu_ctx((2,), ("x",))
  for n in range(1, 51):
    d = dispatch.decide(ctx, _aval((n,)), ("x",), platform="cuda")
    assert (d.reason, d.fast) == ("communicator", False)
    assert d.detail.startswith("ncclMemAlloc: out of memory")
  assert fake_ext.region_calls == 1
  assert comm._region_failures == {(5, int(ONE_SHOT_LL)): "ncclMemAlloc: out of memory"}  # pylint: disable=protected-access


# --- F12, F13: the reports of failed waits ----------------------------------------------


def _report(**kw):
  r = {"comm_id": 5, "device": 1, "code": 1, "rank": 1, "peer": 0, "block": 3,
       "line": 17, "epoch": 70001, "flag_expected": 0, "flag_seen": (0, 0),
       "waited_ns": 0, "signature_expected": 0, "signature_seen": 0,
       "flag_epoch_bits": 16}
  r.update(kw)
  return r


def _with_reports(monkeypatch, reports):
  ext = FakeExtension()
  ext.error_reports = lambda: reports
  monkeypatch.setattr(_ext, "_loaded", True)
  monkeypatch.setattr(_ext, "_module", ext)


def test_f12_timeout_report_names_rank_peer_block_line_epoch(monkeypatch):
  """A rank-divergent call times out on the GPU (tests/gpu test_f12_*); what
  jax_llar.error_reports() makes of the extension's record (code 1)."""
  _with_reports(monkeypatch, [_report(code=1, waited_ns=3_000_000_000,
                                      flag_expected=0x11171, flag_seen=(0, 0))])
  (r,) = jax_llar.error_reports()
  assert r["what"] == "timeout" and r["epoch_bits_expected"] == 0x1171
  m = r["message"]
  assert "timed out after 3000 ms" in m and "rank 0's line never arrived" in m
  assert "rank 1, block 3, line 17, epoch 70001" in m
  assert "restart the process" in m


def test_f13_foreign_signature_report_names_both_signatures(monkeypatch):
  """A mispaired call (code 2): both signatures, mapped back to the op names
  lowered in this process, rank, block, line and epoch in the message."""
  monkeypatch.setattr(dispatch, "decide", _fast)
  signature.clear()
  try:
    mesh = mesh_of((2,), ("x",))
    x = random_input(np.random.default_rng(111), (2, 64), np.float32)
    text = _cuda_text(lambda v: jax_llar.psum(jax_llar.psum(v, "x") * 2, "x"), x, mesh)
    mine, theirs = (int(s) for s in re.findall(r"signature = (\d+) : i64", text))
    flag = lambda sig: (sig << 16) | (70001 & 0xFFFF) | 1  # noqa: E731
    _with_reports(monkeypatch, [_report(
        code=2, flag_expected=flag(mine), flag_seen=(flag(theirs), flag(theirs)),
        signature_expected=mine, signature_seen=theirs)])
    (r,) = jax_llar.error_reports()
  finally:
    signature.clear()
  assert r["what"] == "foreign signature" and mine != theirs
  assert r["calls_expected"] == r["calls_seen"] == ["jax_llar.one_shot_ll.f32.256B.2ranks"]
  m = r["message"]
  assert f"signature {mine}" in m and f"signature {theirs}" in m
  assert "rank 1, block 3, line 17, epoch 70001" in m and "rank 0's line" in m
  assert "restart the process" in m
