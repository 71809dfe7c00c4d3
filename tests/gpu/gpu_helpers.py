"""Helpers shared by the GPU test files (not a test file itself).

Every value check compares with a float64 reduction in rank order rounded
once (jax_llar.testing), bitwise, and requires every rank's output to be
bitwise identical; every test that expects the fast path asserts from the
dispatch log that it was taken.
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
from jax_llar import testing

BF16 = np.dtype(ml_dtypes.bfloat16)
F32 = np.dtype(np.float32)
F16 = np.dtype(np.float16)
DTYPES = [F32, BF16, F16]  # the float dtypes
I32 = np.dtype(np.int32)
ALL_DTYPES = DTYPES + [I32]  # every dtype the kernels serve
PROGRAMS = pathlib.Path(__file__).parent / "programs"

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
