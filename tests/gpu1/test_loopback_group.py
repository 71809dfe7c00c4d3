"""The XLA path on one GPU: a loopback group behind a real FFI custom call
(jax_llar.tools.loopback.group). Every result is compared bit for bit with
the rank-order sum of the ranks' inputs (jax_llar.testing.rank_order_sum),
and every test ends with no rank's error record set. What this proves and
what it does not: docs/testing.md, "The loopback group"."""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from jax import lax

from jax_llar import testing
from jax_llar.tools import capture, traces
from jax_llar.tools.loopback import fused as loopback_fused
from jax_llar.tools.loopback.group import LoopbackGroup

CHILD = pathlib.Path(__file__).parent / "programs" / "loopback_group_child.py"
# (world, algorithm): the matrix.
CASES = [(2, "one_shot_ll"), (4, "one_shot_ll"), (2, "two_shot_ll"), (4, "two_shot_ll")]
IDS = [f"W{w}-{a}" for w, a in CASES]


def inputs(rng, world, n, dtype=np.float32):
  return np.stack([testing.random_array(rng, (n,), dtype) for _ in range(world)])


def reduced(x, dtype=None):
  """Every row the rank-order sum of x's rows (x: (W, ...))."""
  dtype = dtype or x.dtype
  s = testing.rank_order_sum(list(x), dtype)
  return np.broadcast_to(s, x.shape)


def assert_rows(got, want):
  got = np.asarray(got)
  assert got.shape == want.shape and got.dtype == want.dtype, (got.shape, want.shape)
  for r in range(got.shape[0]):
    assert testing.bitwise_equal(got[r], want[r]), f"rank {r} differs"


def assert_clean(g):
  codes = [r["code"] for r in g.records()]
  assert codes == [0] * g.world, g.records()


@pytest.fixture(name="group", scope="module")
def _group():
  with LoopbackGroup(4, algorithms=("one_shot_ll", "two_shot_ll")) as g4, \
       LoopbackGroup(2, algorithms=("one_shot_ll", "two_shot_ll")) as g2:
    yield {2: g2, 4: g4}


def test_call_inside_a_command_buffer(tmp_path):
  """The graph check's evidence (XLA's dump, and the trace): a jitted chain of
  64 loopback all-reduces runs inside XLA's command buffer."""
  verdict = capture.check(str(tmp_path), impl="loopback", timeout_s=300)
  assert verdict["child_rc"] == 0, verdict["child_stderr"]
  assert verdict["child"]["error_codes"] == [0, 0], verdict["child"]
  assert verdict["in_command_buffer"], json.dumps(
      {k: verdict[k] for k in ("dump", "evidence")}, default=str)[:3000]


@pytest.mark.parametrize("world,algorithm", CASES, ids=IDS)
def test_ten_thousand_replays_with_donated_buffers(group, world, algorithm):
  """One executable (a chain of 5 calls with exact scalings between them, so
  that XLA puts it in a command buffer) replayed 10,000 times, its input
  donated, each call on other values than the call before: a replay that
  paired a call with the previous replay's lines would return stale data."""
  g = group[world]
  n = 1024  # 4 KiB of float32 per rank
  def chain(x):
    for _ in range(5):
      x = g.psum(x, algorithm) * 0.5
    return x
  fn = jax.jit(chain, donate_argnums=0)
  rng = np.random.default_rng(world)
  sets = [inputs(rng, world, n) for _ in range(7)]
  wants = []
  for x in sets:
    for _ in range(5):
      x = reduced(x) * np.float32(0.5)
    wants.append(x)
  device = g.device
  for i in range(10_000):
    y = fn(jax.device_put(sets[i % 7], device))
    if i % 7 == 0 or i > 9_990:
      assert_rows(y, wants[i % 7])
    else:
      y.block_until_ready()
  assert_rows(y, wants[(10_000 - 1) % 7])
  assert_clean(g)


def test_executables_of_different_sizes_and_algorithms_share_a_group(group):
  """Three executables on one group (one-shot at 1 KiB and 16 KiB per rank,
  which share the one-shot's region in turn; two-shot at 64 KiB), called in
  a seeded random order 5,000 times, every result checked."""
  g = group[4]
  programs = [("one_shot_ll", 256), ("one_shot_ll", 4096), ("two_shot_ll", 16384)]
  rng = np.random.default_rng(5)
  fns, pools = [], []
  for algorithm, n in programs:
    fns.append(jax.jit(lambda x, a=algorithm: g.psum(x, a)))
    pool = [inputs(rng, 4, n) for _ in range(3)]
    pools.append([(jax.device_put(x, g.device), reduced(x)) for x in pool])
  order = rng.integers(0, 3, 5_000)
  for i, p in enumerate(order):
    x, want = pools[p][i % 3]
    assert_rows(fns[p](x), want)
  assert_clean(g)


@pytest.mark.parametrize("world,algorithm", CASES, ids=IDS)
def test_strided_transposed_and_sliced_operands(group, world, algorithm):
  """Operands that are not a row-major block of their own inside the jitted
  program (every other column, a transpose, a slice at an odd offset, a
  slice of a reshape), which XLA must hand the call as row-major copies; and
  rows of 3 and 5 elements, whose odd ranks' rows start 12 or 10 bytes into
  the buffer (the kernels' misaligned path); float32 and bfloat16."""
  g = group[world]
  rng = np.random.default_rng(11)
  for dtype in (np.float32, ml_dtypes.bfloat16):
    big = inputs(rng, world, 2 * 1000 + 8, dtype)
    tall = np.ascontiguousarray(inputs(rng, world, 640, dtype).T)  # (640, W)
    cases = [
        (lambda a: g.psum(a[:, ::2], algorithm), big, big[:, ::2]),
        (lambda a: g.psum(a.T, algorithm), tall, tall.T),
        (lambda a: g.psum(a[:, 3:3 + 1000], algorithm), big, big[:, 3:3 + 1000]),
        (lambda a: g.psum(a.reshape(world, 4, -1)[:, 1:3], algorithm), big,
         big.reshape(world, 4, -1)[:, 1:3]),
    ]
    for n in (3, 5):
      small = inputs(rng, world, n, dtype)
      cases.append((lambda a: g.psum(a, algorithm), small, small))
    for fn, arg, operand in cases:
      assert_rows(jax.jit(fn)(arg), reduced(np.ascontiguousarray(operand)))
  assert_clean(g)


@pytest.mark.parametrize("world,algorithm", CASES, ids=IDS)
def test_loop_bodies(group, world, algorithm):
  """The call in the bodies of lax.fori_loop, while_loop and scan (rolled
  loops: one call site run many times)."""
  g = group[world]
  x = inputs(np.random.default_rng(3), world, 2048)
  steps = 9
  want = x
  wants = []
  for _ in range(steps):
    want = reduced(want) * np.float32(0.25)
    wants.append(want)
  fori = jax.jit(lambda v: lax.fori_loop(0, steps, lambda i, v: g.psum(v, algorithm) * 0.25, v))
  assert_rows(fori(x), wants[-1])
  def cond(c):
    return c[0] < steps
  def body(c):
    return c[0] + 1, g.psum(c[1], algorithm) * 0.25
  whl = jax.jit(lambda v: lax.while_loop(cond, body, (jnp.int32(0), v))[1])
  assert_rows(whl(x), wants[-1])
  def step(v, _):
    v = g.psum(v, algorithm) * 0.25
    return v, v
  last, every = jax.jit(lambda v: lax.scan(step, v, None, length=steps))(x)
  assert_rows(last, wants[-1])
  for k in range(steps):
    assert_rows(every[k], wants[k])
  assert_clean(g)


@pytest.fixture(name="two_processes", scope="module")
def _two_processes(tmp_path_factory):
  """The child program run twice in one folder: the first process exports a
  program and compiles it with the persistent cache, the second runs the
  exported program and compiles the same program with that cache."""
  folder = tmp_path_factory.mktemp("loopback_group_child")
  runs = []
  for mode in ("first", "second"):
    p = subprocess.run([sys.executable, str(CHILD), mode, str(folder)], capture_output=True,
                       text=True, timeout=300)
    lines = [l for l in p.stdout.splitlines() if l.startswith("{")]
    assert p.returncode == 0 and lines, (p.stdout + p.stderr)[-3000:]
    runs.append(json.loads(lines[-1]))
  return runs


def test_export_runs_in_a_fresh_process(two_processes):
  """jax.export of a program of two calls (one-shot, two-shot), serialised
  in one process and run in another (each process's first group: id 1)."""
  for r in two_processes:
    assert r["group_id"] == 1 and r["export_correct"] and r["records"] == [0, 0], r


def test_persistent_compilation_cache_across_two_processes(two_processes):
  """The second process hits the first's cache entry and runs it correctly."""
  assert [r["hit"] for r in two_processes] == [False, True], two_processes
  assert all(r["cache_correct"] and r["records"] == [0, 0] for r in two_processes)


def test_fused_op(group):
  """The fused all-reduce + add + RMSNorm behind its loopback target at W=2:
  a program of 3 fused calls, each call's residual the previous call's
  new_residual (a chain XLA puts in a command buffer), replayed 50 times,
  and the same chain as a scan whose carry is the residual: every call's
  new_residual bitwise and normed within loopback_fused.NORMED_MAX_ULP of
  the host emulation of jax_llar.fused.reference (loopback_fused.emulate, as
  the harness checks it), every rank's outputs identical."""
  g = group[2]
  rng = np.random.default_rng(13)
  rows, d, bf16, calls = 4, 2048, np.dtype(ml_dtypes.bfloat16), 3
  xs = [rng.standard_normal((2, rows, d)).astype(np.float32).astype(bf16)
        for _ in range(calls)]
  residual = rng.standard_normal((rows, d)).astype(np.float32).astype(bf16)
  weight = (1 + 0.1 * rng.standard_normal((d,))).astype(np.float32).astype(bf16)
  wants, r = [], residual
  for x in xs:
    normed, r = loopback_fused.emulate(list(x), r, weight, 1e-6, bf16)
    wants.append((normed, r))

  def chain(xs, res, w):
    outs = []
    for x in xs:
      normed, res = g.add_rms_norm(x, res, w, 1e-6)
      outs.append((normed, res))
    return outs

  def scanned(xs, res, w):
    def step(res, x):
      normed, res = g.add_rms_norm(x, res, w, 1e-6)
      return res, (normed, res)
    return lax.scan(step, res, xs)[1]

  both = np.stack([residual, residual])
  fn = jax.jit(chain)
  runs = [fn(xs, both, weight) for _ in range(50)]
  normed_s, res_s = jax.jit(scanned)(np.stack(xs), both, weight)
  runs.append([(normed_s[k], res_s[k]) for k in range(calls)])
  for outs in runs:
    for k, (normed, new_residual) in enumerate(outs):
      normed, new_residual = np.asarray(normed), np.asarray(new_residual)
      want_normed, want_residual = wants[k]
      for rank in range(2):
        assert testing.bitwise_equal(new_residual[rank], want_residual), (k, rank)
        ulp = loopback_fused.ulp_distance(normed[rank], want_normed)
        assert ulp.max() <= loopback_fused.NORMED_MAX_ULP[bf16], (k, rank, ulp.max())
        assert testing.bitwise_equal(normed[rank], normed[0])
  assert_clean(g)


def test_profiler_names_each_call(group, tmp_path):
  """In a jax.profiler trace each call is found by its name,
  jax_llar.loopback.<kernel>.<dtype>.<bytes>B.<W>ranks, and the production
  kernels ran for every simulated rank."""
  g = group[2]
  fn = jax.jit(lambda v: (g.psum(v), g.psum(v, "two_shot_ll"), g.psum(v[:, :256])))
  x = inputs(np.random.default_rng(1), 2, 4096)
  with jax.profiler.trace(str(tmp_path)):
    for _ in range(3):
      jax.block_until_ready(fn(x))
  events = traces.read(str(tmp_path), stats=True)
  names = {v for e in events for _, v in e.stats if "jax_llar.loopback" in v} | {
      e.name for e in events if "jax_llar.loopback" in e.name}
  for want in ("jax_llar.loopback.one_shot_ll.f32.16384B.2ranks",
               "jax_llar.loopback.two_shot_ll.f32.16384B.2ranks",
               "jax_llar.loopback.one_shot_ll.f32.1024B.2ranks"):
    assert any(want in n for n in names), sorted(names)[:40]
  kernels = [e for e in events if traces.ours(e)]
  assert any("OneShotLL" in e.name for e in kernels) and any(
      "TwoShotLL" in e.name for e in kernels), sorted({e.name for e in kernels})[:20]
  assert_clean(g)


def test_refusals_say_why(group):
  """Sizes and shapes the group cannot serve are refused at trace time with
  the reason, before anything runs."""
  g = group[4]
  with pytest.raises(ValueError, match="leading dimension"):
    g.psum(jnp.ones((3, 8), jnp.float32))
  with pytest.raises(ValueError, match="limit"):
    g.psum(jnp.ones((4, 70_000), jnp.float32))  # 280 KB per rank > the one-shot's 256 KiB
  with pytest.raises(ValueError, match="no one_shot_ll128 region"):
    g.psum(jnp.ones((4, 8), jnp.float32), "one_shot_ll128")
  with pytest.raises(ValueError, match="serves"):
    g.psum(jnp.ones((4, 8), jnp.uint8))
  assert_clean(g)
