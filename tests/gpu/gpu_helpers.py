"""Helpers shared by the GPU test files (not a test file itself).

Every value check compares with a float64 reduction in rank order rounded
once (jax_llar.testing), bitwise, and requires every rank's output to be
bitwise identical; every test that expects the fast path asserts from the
dispatch log that it was taken. A non-deterministic algorithm
(jax_llar.algorithms.NON_DETERMINISTIC) is held to its rule instead
(`check_rule`, ATOMIC_SUM).
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import subprocess
import sys

import jax
import ml_dtypes
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P

import jax_llar
from jax_llar import config, testing

BF16 = np.dtype(ml_dtypes.bfloat16)
F32 = np.dtype(np.float32)
F16 = np.dtype(np.float16)
DTYPES = [F32, BF16, F16]  # the float dtypes
I32 = np.dtype(np.int32)
ALL_DTYPES = DTYPES + [I32]  # every dtype the kernels serve
UINT = {2: np.uint16, 4: np.uint32}  # the bits of a dtype of that width
PROGRAMS = pathlib.Path(__file__).parent / "programs"
# The rules an algorithm's output is held to (loopback_harness.check_mode's
# names): bitwise the rank-order reference, or, for a non-deterministic one,
# jax_llar.testing.atomic_sum_violations's bound.
BITWISE, ATOMIC_SUM = "bitwise", "atomic_sum"

_FNS: dict = {}


def _per_rank_fn(mesh, op=None):
  key = (id(mesh), op)
  if key not in _FNS:
    op_ = op or (lambda v: jax_llar.psum(v, "x"))
    _FNS[key] = jax.jit(jax.shard_map(op_, mesh=mesh, in_specs=P("x"),
                                      out_specs=P("x"), check_vma=False))
  return _FNS[key]


def allreduce_per_rank(mesh, inputs, op=None) -> np.ndarray:
  """Runs `op` (default: jax_llar.psum over 'x') with rank r holding
  inputs[r]; returns each rank's output, shape (ranks, ...)."""
  x = jax.device_put(np.stack(inputs), NamedSharding(mesh, P("x")))
  return np.asarray(_per_rank_fn(mesh, op)(x))


_DECISIONS: dict = {}  # (bytes per rank, dtype name) -> fast path taken


def took_fast_path(nbytes: int, dtype) -> bool:
  """Whether the psum of `nbytes` per rank of `dtype` was lowered to the fast
  path (jit caches compiled programs, so the decision is remembered)."""
  for d in jax_llar.dispatch_log():
    _DECISIONS[(d.bytes_per_rank, d.dtype)] = d.fast
  return _DECISIONS.get((int(nbytes), str(np.dtype(dtype))), False)


def check_allreduce(mesh, inputs, dtype) -> bool:
  """Asserts that every rank's jax_llar.psum output equals rank 0's and the
  reference, bitwise, and (on the fast path) that every NaN is the canonical
  one; returns whether the fast path was taken."""
  out = allreduce_per_rank(mesh, inputs)
  expect = testing.rank_order_sum(inputs, dtype)
  fast_path = took_fast_path(inputs[0].nbytes, dtype)
  for r in range(len(inputs)):
    assert testing.bitwise_equal(out[r], out[0]), f"rank {r} differs from rank 0"
    assert testing.bitwise_equal(out[r], expect, canonical_nans=fast_path), (
        f"rank {r}: {np.flatnonzero(out[r].astype(np.float64) != expect.astype(np.float64))[:10]}")
  return fast_path


def force(monkeypatch, algorithm) -> None:
  """Forces `algorithm` (settings.algorithm, as JAX_LLAR_ALGORITHM does) with
  max_bytes raised to the cap, for the test; clears the dispatch log."""
  monkeypatch.setattr(config.settings, "algorithm", algorithm.short_name)
  monkeypatch.setattr(config.settings, "max_bytes", config.MAX_BYTES_CAP)
  jax_llar.clear_dispatch_log()


def took(algorithm, nbytes: int) -> bool:
  """Whether a psum of `nbytes` per rank was lowered to `algorithm`'s fast
  path since the dispatch log was last cleared."""
  return any(d.fast and d.algorithm is algorithm and d.bytes_per_rank == nbytes
             for d in jax_llar.dispatch_log())


def psum_op():
  """A psum over 'x' that is a function of its own: allreduce_per_rank
  compiles a program of its own for it (not the cached default's), lowered
  under the settings of the moment."""
  return lambda v: jax_llar.psum(v, "x")


def same_bits(a, b) -> bool:
  """`a` and `b` hold the same bits, NaN bits included."""
  a, b = np.asarray(a), np.asarray(b)
  if a.shape != b.shape or a.dtype != b.dtype:
    return False
  u = UINT.get(a.dtype.itemsize)
  return bool(np.array_equal(a.view(u), b.view(u)) if u else np.array_equal(a, b))


def nans_canonical(x) -> bool:
  """Every NaN of `x` has the bits of testing.CANONICAL_NAN_BITS (the rule
  of every jax_llar algorithm; ffi/include/llar/reduce.cuh)."""
  x = np.asarray(x)
  bits = testing.CANONICAL_NAN_BITS.get(x.dtype)
  if bits is None:
    return True
  nan = np.isnan(x.astype(np.float64))
  return bool((x.view(UINT[x.dtype.itemsize])[nan] == bits).all())


def check_rule(mesh, inputs, dtype, rule: str = BITWISE, op=None) -> np.ndarray:
  """Runs `op` (default: a psum of its own, `psum_op`) with rank r holding
  inputs[r] and asserts `rule`: every rank the same bits as rank 0, every
  NaN the canonical one, and with BITWISE every rank bitwise the rank-order
  reference; with ATOMIC_SUM every element within
  testing.atomic_sum_violations's bound and int32 bitwise the reference.
  Returns each rank's output."""
  out = allreduce_per_rank(mesh, inputs, op or psum_op())
  for r in range(len(inputs)):
    assert same_bits(out[r], out[0]), f"rank {r} differs from rank 0"
    assert nans_canonical(out[r]), f"rank {r}: a NaN that is not the canonical one"
  if rule == ATOMIC_SUM:
    bad = testing.atomic_sum_violations(out[0], inputs, dtype)
    assert not bad.any(), f"elements off the rule: {np.flatnonzero(bad)[:10]}"
    if np.dtype(dtype) == I32:
      assert testing.bitwise_equal(out[0], testing.rank_order_sum(inputs, dtype))
    return out
  assert rule == BITWISE, rule
  expect = testing.rank_order_sum(inputs, dtype)
  for r in range(len(inputs)):
    assert testing.bitwise_equal(out[r], expect), (
        f"rank {r}: {np.flatnonzero(out[r].astype(np.float64) != expect.astype(np.float64))[:10]}")
  return out


def fast(decisions):
  """The decisions that took the fast path."""
  return [d for d in decisions if d.fast]


@dataclasses.dataclass
class ProgramResult:
  """What a child program returned: its exit status, its JSON object (None
  when it printed none) and the tail of its output for messages."""
  rc: int
  data: dict | None
  tail: str


def run_program(name: str, *args: str, env: dict | None = None,
                timeout: int = 300) -> ProgramResult:
  """Runs ``tests/gpu/programs/<name>.py`` in a fresh Python with `env`
  added to this process's environment; parses the last stdout line that
  holds a JSON object. A child that traps poisons only its own CUDA
  context."""
  e = dict(os.environ)
  e["XLA_PYTHON_CLIENT_PREALLOCATE"] = "false"
  e.update(env or {})
  p = subprocess.run([sys.executable, str(PROGRAMS / f"{name}.py"), *args], env=e,
                     capture_output=True, text=True, timeout=timeout)
  data = None
  for line in reversed(p.stdout.strip().splitlines()):
    if line.startswith("{"):
      try:
        data = json.loads(line)
      except json.JSONDecodeError:
        pass
      break
  stderr = "\n".join(l for l in p.stderr.splitlines()
                     if "allocat" not in l and "Source Location" not in l)
  return ProgramResult(p.returncode, data, (p.stdout + stderr)[-3000:] + f"\nEXIT {p.returncode}")
