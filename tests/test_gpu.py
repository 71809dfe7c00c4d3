"""GPU suite: needs at least 2 CUDA GPUs that are NVLink (load/store) peers.

Run with ``JAX_LLAR_TEST_GPU=1 python -m pytest tests/test_gpu.py`` (the
conftest forces CPU devices otherwise). Every value check compares with a
float64 reduction in rank order rounded once (jax_llar.testing), bitwise, and
requires every rank's output to be bitwise identical; every test that expects
the fast path asserts from the dispatch log that it was taken.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import jax
import jax.numpy as jnp
import ml_dtypes
from jax import lax
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

import jax_llar
from jax_llar import testing

# The children of the subprocess tests need device memory too.
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")


def _gpu_skip_reason() -> str | None:
  if os.environ.get("JAX_LLAR_TEST_GPU") != "1":
    return "GPU suite runs only with JAX_LLAR_TEST_GPU=1 (CPU devices are forced otherwise)"
  try:
    n = len(jax.devices("cuda"))
  except RuntimeError as e:
    return f"needs 2 CUDA GPUs; JAX has no CUDA backend ({e})"
  if n < 2:
    return f"needs 2 CUDA GPUs; found {n}"
  st = jax_llar.status()
  if not st["active"]:
    return f"jax_llar fast path inactive: {st['reason']}"
  return None


_SKIP = _gpu_skip_reason()
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(_SKIP is not None, reason=str(_SKIP))]

BF16 = np.dtype(ml_dtypes.bfloat16)
F32 = np.dtype(np.float32)
F16 = np.dtype(np.float16)
DTYPES = [F32, BF16, F16]


@pytest.fixture(scope="module")
def mesh():
  return Mesh(np.array(jax.devices()), ("x",))


_FNS = {}


def _per_rank_fn(mesh, op=None):
  key = (id(mesh), op)
  if key not in _FNS:
    op_ = op or (lambda v: jax_llar.psum(v, "x"))
    _FNS[key] = jax.jit(jax.shard_map(op_, mesh=mesh, in_specs=P("x"),
                                      out_specs=P("x"), check_vma=False))
  return _FNS[key]


def allreduce_per_rank(mesh, inputs, op=None):
  """Runs op over 'x' with rank r holding inputs[r]; returns each rank's output."""
  x = jax.device_put(np.stack(inputs), NamedSharding(mesh, P("x")))
  return np.asarray(_per_rank_fn(mesh, op)(x))


_DECISIONS: dict = {}  # (bytes per rank, dtype name) -> fast path taken


def _note_decisions():
  for d in jax_llar.dispatch_log():
    _DECISIONS[(d.bytes_per_rank, d.dtype)] = d.fast


def took_fast_path(nbytes: int, dtype) -> bool:
  """Whether the psum of `nbytes` per rank of `dtype` was lowered to the fast
  path (jit caches compiled programs, so the decision is remembered)."""
  _note_decisions()
  return _DECISIONS.get((int(nbytes), str(np.dtype(dtype))), False)


def check_allreduce(mesh, inputs, dtype):
  out = allreduce_per_rank(mesh, inputs)
  expect = testing.rank_order_sum(inputs, dtype)
  for r in range(len(inputs)):
    assert testing.bitwise_equal(out[r], out[0]), f"rank {r} differs from rank 0"
    assert testing.bitwise_equal(out[r], expect), (
        f"rank {r}: {np.flatnonzero(out[r].astype(np.float64) != expect.astype(np.float64))[:10]}")
  return took_fast_path(inputs[0].nbytes, dtype)


def _fast(decisions):
  return [d for d in decisions if d.fast]


# Element counts: odd sizes (F2), every warp and block-count boundary of the
# grid rule (64 lines per block up to 64 blocks, then up to 512), and the
# one-shot limit.
def _counts(dtype):
  per_line = 8 // dtype.itemsize
  lines = [1, 2, 3, 7, 17, 31, 32, 33, 63, 64, 65, 127, 128, 129, 255, 256, 257,
           511, 512, 513, 1023, 4095, 4096, 4097,
           16384 - 1, 16384, 16384 + 1, 32768]
  counts = {1, 2, 3, 7, 17, 1023, 4097}
  for ln in lines:
    for d in (-1, 0, 1):
      c = ln * per_line + d
      if 0 < c * dtype.itemsize <= 256 * 1024:
        counts.add(c)
  return sorted(counts)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_random_values_all_sizes(mesh, dtype):
  rng = np.random.default_rng(1)
  for n in _counts(dtype):
    inputs = [testing.random_array(rng, (n,), dtype) for _ in range(mesh.size)]
    assert check_allreduce(mesh, inputs, dtype), f"n={n}: fast path not taken"


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_above_limit_falls_back(mesh, dtype):
  n = 256 * 1024 // dtype.itemsize + 8 // dtype.itemsize
  rng = np.random.default_rng(2)
  inputs = [testing.random_array(rng, (n,), dtype) for _ in range(mesh.size)]
  jax_llar.clear_dispatch_log()
  out = allreduce_per_rank(mesh, inputs)
  d = jax_llar.dispatch_log()
  assert d and all(x.reason == "size" for x in d), d
  assert not took_fast_path(inputs[0].nbytes, dtype)
  np.testing.assert_allclose(out[0].astype(np.float64),
                             testing.rank_order_sum(inputs, dtype).astype(np.float64),
                             rtol=1e-2 if dtype != F32 else 1e-6)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_special_values(mesh, dtype):
  """F1: -0.0, +0.0, subnormals, NaN payloads, +-inf: the LL flag never collides."""
  finfo = ml_dtypes.finfo(dtype)
  sub = float(finfo.smallest_subnormal)
  specials = np.array([-0.0, 0.0, sub, -sub, 3 * sub, np.inf, -np.inf, np.nan,
                       float(finfo.max), -float(finfo.max), 1.0, -1.0], np.float64)
  n = 4096 // dtype.itemsize
  rng = np.random.default_rng(3)
  inputs = []
  for r in range(mesh.size):
    v = specials[rng.integers(0, len(specials), n)].astype(dtype)
    if dtype == F32:  # distinct NaN payloads
      bits = v.view(np.uint32)
      nan = np.isnan(v)
      bits[nan] = 0x7FC00000 | rng.integers(1, 1 << 22, nan.sum()).astype(np.uint32)
    inputs.append(v)
  inputs[0][:8] = np.array([-0.0] * 8).astype(dtype)  # -0 + -0 = -0
  for r in range(1, mesh.size):
    inputs[r][:8] = np.array([-0.0] * 8).astype(dtype)
  assert check_allreduce(mesh, inputs, dtype)
  zeros = [np.zeros(n, dtype) for _ in range(mesh.size)]
  check_allreduce(mesh, zeros, dtype)


def test_ten_thousand_calls_in_one_program(mesh):
  """10,000 consecutive psums in one jitted program (lax.fori_loop), exact."""
  n = 1024
  steps = 10_000
  rng = np.random.default_rng(4)
  inputs = [testing.random_array(rng, (n,), F32) for _ in range(mesh.size)]

  def body(v):
    delta = (lax.axis_index("x") + 1).astype(jnp.float32) * jnp.float32(2.0 ** -10)
    return lax.fori_loop(0, steps, lambda i, v: jax_llar.psum(v, "x") * 0.5 + delta, v)

  jax_llar.clear_dispatch_log()
  out = allreduce_per_rank(mesh, inputs, op=body)
  assert _fast(jax_llar.dispatch_log())
  xs = [x.copy() for x in inputs]
  deltas = [np.float32((r + 1) * 2.0 ** -10) for r in range(mesh.size)]
  for _ in range(steps):
    s = testing.rank_order_sum(xs, F32)
    xs = [s * np.float32(0.5) + deltas[r] for r in range(mesh.size)]
  for r in range(mesh.size):
    assert testing.bitwise_equal(out[r], xs[r]), f"rank {r}"


def test_many_independent_psums_in_one_jit(mesh):
  """F4: 500 independent psums in one program (one epoch each, many grids)."""
  rng = np.random.default_rng(5)
  sizes = [int(s) for s in rng.integers(1, 3000, 500)]
  inputs = [[testing.random_array(rng, (s,), F32) for s in sizes] for _ in range(mesh.size)]

  def body(*vs):
    return tuple(jax_llar.psum(v, "x") for v in vs)

  xs = [jax.device_put(np.stack([inputs[r][i] for r in range(mesh.size)]),
                       NamedSharding(mesh, P("x"))) for i in range(len(sizes))]
  f = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=P("x"), out_specs=P("x"),
                            check_vma=False))
  outs = f(*xs)
  for i, o in enumerate(outs):
    o = np.asarray(o)
    expect = testing.rank_order_sum([inputs[r][i] for r in range(mesh.size)], F32)
    for r in range(mesh.size):
      assert testing.bitwise_equal(o[r], expect), f"psum {i} rank {r}"


def test_typing_grad_vmap_scan_on_gpu(mesh):
  """F8 on the fast path: check_vma typing, out_specs=P(), grad, vmap, scan carry."""
  rng = np.random.default_rng(6)
  x = jax.device_put(testing.random_array(rng, (mesh.size * 64,), F32),
                     NamedSharding(mesh, P("x")))
  def run(op):
    f = jax.jit(jax.shard_map(lambda v: op(v, "x"), mesh=mesh, in_specs=P("x"),
                              out_specs=P()))
    g = jax.jit(jax.grad(lambda v: jnp.sum(f(v) ** 2)))
    scan = jax.jit(jax.shard_map(
        lambda v: lax.scan(
            lambda c, _: (lax.pcast(op(c, "x") * 0.5, "x", to="varying"), None),
            v, None, length=5)[0],
        mesh=mesh, in_specs=P("x"), out_specs=P("x")))
    vm = jax.jit(jax.vmap(f))
    xb = jnp.stack([x, x * 2])
    return [np.asarray(f(x)), np.asarray(g(x)), np.asarray(scan(x)), np.asarray(vm(xb))]
  jax_llar.clear_dispatch_log()
  mine = run(jax_llar.psum)
  assert _fast(jax_llar.dispatch_log())
  ref = run(lax.psum)
  for a, b in zip(mine, ref):  # two ranks: NCCL's sum is the exact rank-order sum
    if mesh.size == 2:
      assert testing.bitwise_equal(a, b)
    else:
      np.testing.assert_allclose(a, b, rtol=1e-6)


def test_inside_control_flow(mesh):
  """F7: psum inside lax.cond (same branch on all ranks), while_loop, scan."""
  rng = np.random.default_rng(7)
  inputs = [testing.random_array(rng, (300,), F32) for _ in range(mesh.size)]

  def body(v):
    v = lax.cond(jnp.sum(jax_llar.psum(v, "x")) > -1e30,
                 lambda u: jax_llar.psum(u, "x"), lambda u: u * 0, v)
    v = lax.while_loop(lambda c: c[0] < 3, lambda c: (c[0] + 1, jax_llar.psum(c[1], "x") * 0.5),
                       (0, v))[1]
    return v

  out = allreduce_per_rank(mesh, inputs, op=body)
  s = testing.rank_order_sum(inputs, F32)
  for _ in range(3):
    s = testing.rank_order_sum([s] * mesh.size, F32) * np.float32(0.5)
  for r in range(mesh.size):
    assert testing.bitwise_equal(out[r], s)


def test_mixed_with_nccl_collectives(mesh):
  """F6: small jax_llar psums alternate with large lax.psum and all_gather."""
  rng = np.random.default_rng(8)
  small = [testing.random_array(rng, (256,), F32) for _ in range(mesh.size)]
  big = [testing.random_array(rng, (1 << 20,), F32) for _ in range(mesh.size)]

  def body(s, b):
    for _ in range(4):
      s = jax_llar.psum(s, "x") * 0.5
      b = lax.psum(b, "x") * 0.5
      g = lax.all_gather(s, "x", tiled=True)
      s = s + g[: s.shape[0]] * 0
    return s, b

  f = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=(P("x"), P("x")),
                            out_specs=(P("x"), P("x")), check_vma=False))
  for _ in range(3):  # first execution and re-executions
    s_out, b_out = f(jax.device_put(np.stack(small), NamedSharding(mesh, P("x"))),
                     jax.device_put(np.stack(big), NamedSharding(mesh, P("x"))))
  s = list(small)
  for _ in range(4):
    t = testing.rank_order_sum(s, F32) * np.float32(0.5)
    s = [t] * mesh.size
  s_out = np.asarray(s_out)
  for r in range(mesh.size):
    assert testing.bitwise_equal(s_out[r], s[r])
  b_ref = np.sum(np.stack(big).astype(np.float64), 0)
  for _ in range(3):
    b_ref = b_ref * 0.5 * mesh.size
  np.testing.assert_allclose(np.asarray(b_out)[0], b_ref * 0.5, rtol=1e-4)


def test_determinism_across_sizes(mesh):
  """F9: identical rows in tensors of different sizes give identical results."""
  rng = np.random.default_rng(9)
  row = [testing.random_array(rng, (128,), BF16) for _ in range(mesh.size)]
  results = []
  for reps in (1, 3, 64, 600, 1024):  # 256 B .. 256 KiB per rank
    inputs = [np.tile(r, reps) for r in row]
    out = allreduce_per_rank(mesh, inputs)
    results.append(out[:, :128])
    for k in range(reps):
      assert testing.bitwise_equal(out[0, k * 128:(k + 1) * 128], results[0][0])
  for res in results:
    assert testing.bitwise_equal(res, results[0])


def _run_child(code: str, env_extra: dict, timeout=300):
  """Runs `code` in a fresh Python; its output (stdout + stderr, minus XLA's
  allocator retries) and exit status come back for the assertions."""
  env = dict(os.environ)
  env["XLA_PYTHON_CLIENT_PREALLOCATE"] = "false"
  env.update(env_extra)
  p = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env,
                     capture_output=True, text=True, timeout=timeout)
  p.stderr = "\n".join(l for l in p.stderr.splitlines()
                       if "allocat" not in l and "Source Location" not in l)
  p.stdout += f"\nEXIT {p.returncode}\n"
  return p


_CHILD_PRELUDE = """
import numpy as np, jax, jax.numpy as jnp
from jax import lax
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
import jax_llar
mesh = Mesh(np.array(jax.devices()), ("x",))
x = jax.device_put(np.arange(mesh.size * 1000, dtype=np.float32), NamedSharding(mesh, P("x")))
"""


def test_two_threads_dispatching():
  """F5: two Python threads dispatch jitted programs on the same devices.

  Runs in a child process: a mispaired call would trap and poison the CUDA
  context of the process that ran it.
  """
  code = _CHILD_PRELUDE + """
import threading
from jax_llar import testing
rng = np.random.default_rng(10)
f = jax.jit(jax.shard_map(lambda v: jax_llar.psum(v, "x"), mesh=mesh, in_specs=P("x"),
                          out_specs=P("x"), check_vma=False))
data = [[testing.random_array(rng, (512,), np.float32) for _ in range(mesh.size)] for _ in range(2)]
expect = [testing.rank_order_sum(d, np.float32) for d in data]
xs = [jax.device_put(np.stack(d), NamedSharding(mesh, P("x"))) for d in data]
f(xs[0]).block_until_ready()
errors = []
def worker(i):
  try:
    for _ in range(200):
      out = np.asarray(f(xs[i]))
      for r in range(mesh.size):
        if not testing.bitwise_equal(out[r], expect[i]):
          errors.append(f"thread {i} rank {r}: wrong result")
          return
  except Exception as e:
    errors.append(f"thread {i}: {type(e).__name__}: {e}")
ts = [threading.Thread(target=worker, args=(i,)) for i in range(2)]
[t.start() for t in ts]
[t.join(timeout=240) for t in ts]
print("HUNG", any(t.is_alive() for t in ts), "ERRORS", errors[:3])
"""
  p = _run_child(code, {"JAX_LLAR_TIMEOUT_MS": "3000"})
  assert "HUNG False ERRORS []" in p.stdout, (p.stdout + p.stderr)[-3000:]


def test_epoch_wraparound():
  """F4: epoch counters seeded just below 2^30, 2^31 and 2^32 (test hook);
  crossing them re-zeroes scratch halves and wraps the 32-bit flags."""
  code = _CHILD_PRELUDE + """
from jax_llar import comm, _ext, testing
rng = np.random.default_rng(11)
f = jax.jit(jax.shard_map(lambda v: jax_llar.psum(v, "x"), mesh=mesh, in_specs=P("x"),
                          out_specs=P("x"), check_vma=False))
def check(n):
  ins = [testing.random_array(rng, (n,), np.float32) for _ in range(mesh.size)]
  out = np.asarray(f(jax.device_put(np.stack(ins), NamedSharding(mesh, P("x")))))
  ref = testing.rank_order_sum(ins, np.float32)
  return all(testing.bitwise_equal(out[r], ref) for r in range(mesh.size))
ok = check(4096)
mod = _ext.load()
for seed in (2 ** 30 - 3, 2 ** 31 - 3, 2 ** 32 - 3):
  for cs in comm.comm_sets():
    mod.set_epoch_for_testing(cs.comm_id, seed)
  for i in range(8):
    ok &= check(1 + int(rng.integers(1, 60000)))
print("FAST", any(d.fast for d in jax_llar.dispatch_log()), "OK", ok)
"""
  p = _run_child(code, {"JAX_LLAR_TIMEOUT_MS": "3000"})
  assert "FAST True OK True" in p.stdout, (p.stdout + p.stderr)[-3000:]


def test_rank_divergence_times_out():
  """F12: a rank-dependent number of calls fails with a report, not a hang."""
  code = _CHILD_PRELUDE + """
def body(v):
  return lax.cond(lax.axis_index("x") == 0, lambda u: jax_llar.psum(u, "x"), lambda u: u * 2, v)
f = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=P("x"), out_specs=P("x"), check_vma=False))
try:
  f(x).block_until_ready()
  print("RESULT no error")
except Exception as e:
  print("RESULT error", type(e).__name__, str(e)[:300])
print("REPORTS", jax_llar.error_reports())
"""
  p = _run_child(code, {"JAX_LLAR_TIMEOUT_MS": "1500"})
  out = p.stdout + p.stderr
  assert "RESULT error" in out, out[-3000:]
  # Rank 0 (the only caller) waited for rank 1 and reported it.
  assert "'rank': 0" in out and "'peer': 1" in out and "'epoch'" in out, p.stdout[-3000:]


def test_dropped_peer_write_times_out():
  """F13: a dropped peer write (test hook) fails the call with rank/slot/epoch."""
  code = _CHILD_PRELUDE + """
from jax_llar import comm, _ext
f = jax.jit(jax.shard_map(lambda v: jax_llar.psum(v, "x"), mesh=mesh, in_specs=P("x"),
                          out_specs=P("x"), check_vma=False))
f(x).block_until_ready()
cs = comm.comm_sets()[0]
_ext.load().set_drop_peer_writes_for_testing(cs.comm_id, cs.groups[0][1], True)
g = jax.jit(jax.shard_map(lambda v: jax_llar.psum(v, "x") + 1, mesh=mesh, in_specs=P("x"),
                          out_specs=P("x"), check_vma=False))
try:
  g(x).block_until_ready()
  print("RESULT no error")
except Exception as e:
  print("RESULT error", type(e).__name__)
print("REPORTS", jax_llar.error_reports())
"""
  p = _run_child(code, {"JAX_LLAR_TIMEOUT_MS": "1500"})
  out = p.stdout + p.stderr
  assert "RESULT error" in out, out[-3000:]
  assert "'rank': 0" in out and "'peer': 1" in out, out[-3000:]


@pytest.mark.parametrize("flags", ["--xla_gpu_enable_command_buffer=",
                                   "--xla_gpu_enable_command_buffer=FUSION,CUBLAS,CUBLASLT,CUSTOM_CALL,CUDNN,COLLECTIVES"],
                         ids=["no_command_buffers", "with_collectives"])
def test_xla_flag_variants(flags):
  """F7: command buffers disabled, and +COLLECTIVES, still exact."""
  code = _CHILD_PRELUDE + """
from jax_llar import testing
f = jax.jit(jax.shard_map(lambda v: jax_llar.psum(v, "x") * 0.5, mesh=mesh, in_specs=P("x"),
                          out_specs=P("x"), check_vma=False))
rng = np.random.default_rng(0)
ok = True
for n in (1, 333, 4096, 65536):
  ins = [testing.random_array(rng, (n,), np.float32) for _ in range(mesh.size)]
  out = np.asarray(f(jax.device_put(np.stack(ins), NamedSharding(mesh, P("x")))))
  ref = testing.rank_order_sum(ins, np.float32) * np.float32(0.5)
  ok &= all(testing.bitwise_equal(out[r], ref) for r in range(mesh.size))
print("FAST", any(d.fast for d in jax_llar.dispatch_log()), "OK", ok)
"""
  p = _run_child(code, {"XLA_FLAGS": flags})
  assert "FAST True OK True" in p.stdout, (p.stdout + p.stderr)[-3000:]


def test_custom_call_inside_command_buffer(tmp_path):
  """With default XLA flags the custom call is captured into a command buffer."""
  from jax_llar import graphcheck
  verdict = graphcheck.check(str(tmp_path))
  assert verdict["child_rc"] == 0, verdict["child_stderr"]
  assert verdict["in_command_buffer"], verdict


def test_call_trace_records_every_call(mesh):
  """The kernels' call trace (args.h) holds one send/end pair per call, in
  order, with positive durations; results stay exact while it is on; after
  disable_call_trace the same program records nothing more."""
  from jax_llar import _ext, comm
  mod = _ext.load()
  cs = comm.get_or_create([[d.local_hardware_id for d in mesh.devices.flat]])
  mod.enable_call_trace(cs.comm_id)
  try:
    before = {d: mod.read_call_trace(cs.comm_id, d)[0] for d in cs.groups[0]}
    rng = np.random.default_rng(7)
    # A program compiled (and so captured) after the trace was enabled.
    traced = jax.jit(jax.shard_map(lambda v: jax_llar.psum(v, "x"), mesh=mesh,
                                   in_specs=P("x"), out_specs=P("x"), check_vma=False))

    def run_checked():
      inputs = [testing.random_array(rng, (300,), F32) for _ in range(mesh.size)]
      x = jax.device_put(np.stack(inputs), NamedSharding(mesh, P("x")))
      out = np.asarray(traced(x))
      expect = testing.rank_order_sum(inputs, F32)
      assert all(testing.bitwise_equal(o, expect) for o in out)

    for _ in range(20):
      run_checked()
    slots = mod.TRACE_SLOTS
    for d in cs.groups[0]:
      calls, words = mod.read_call_trace(cs.comm_id, d)
      assert calls == before[d] + 20
      idx = [e % slots for e in range(calls - 20, calls)]
      starts = [words[2 * i] for i in idx]
      ends = [words[2 * i + 1] for i in idx]
      assert all(s > 0 for s in starts)
      assert all(e > s for s, e in zip(starts, ends))
      assert all(b > a for a, b in zip(ends, starts[1:]))
  finally:
    mod.disable_call_trace(cs.comm_id)
  # Off again: the captured trace variant keeps computing and stores nothing.
  run_checked()
  for d in cs.groups[0]:
    calls, words = mod.read_call_trace(cs.comm_id, d)
    assert words[2 * ((calls - 1) % slots)] == 0


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_kernel_variants_on_random_data(dtype):
  """The run-time world-size kernel (used for groups of other than 2, 4 or 8
  ranks), the other grid rules and the send-and-loopback diagnostic, run
  through the kernel bench on this machine: bitwise against the reference."""
  from jax_llar import _ext, comm
  mod = _ext.load()
  devices = jax.devices()
  cs = comm.get_or_create([[d.local_hardware_id for d in devices]])
  code = {F32: 0, BF16: 1, F16: 2}[dtype]
  rng = np.random.default_rng(7)
  for n in (1, 3, 255, 1025, 4096 // dtype.itemsize + 1, 32768 + 3):
    inputs = [testing.random_array(rng, (n,), dtype) for _ in devices]
    expect = testing.rank_order_sum(inputs, dtype)
    for impl in ("one_shot_ll", "one_shot_ll_generic", "one_shot_ll_b256",
                 "one_shot_ll_generic_b128", "one_shot_ll_send_loopback"):
      _, outs = mod.kernel_bench(cs.comm_id, impl, code, [x.tobytes() for x in inputs], 50, 1)
      for r, o in enumerate(outs):
        o = np.frombuffer(o, dtype)
        want = (testing.rank_order_sum([inputs[r]] * len(devices), dtype)
                if impl.endswith("loopback") else expect)
        assert testing.bitwise_equal(o, want), f"{impl}, n={n}, rank {r}"
