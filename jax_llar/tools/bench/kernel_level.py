"""The kernel level: per-call time of the kernels, without XLA.

Every rank captures ``iters`` back-to-back calls of one kernel into a CUDA
graph; all ranks launch their graphs together. Per-call time = elapsed /
iters from CUDA events on each rank's stream, the maximum over ranks; a row
gives the median, minimum and maximum over ``reps`` replays (microseconds).
The native kernel bench (``jax_llar.tools._llar_tools.kernel_bench``) does
the capture and timing; this module maps impl names to its arguments and
checks every output bitwise against a host reference. The method is
described in benchmarks/METHOD.md in the repository.

Call signatures: every call of an algorithm carries BENCH_SIGNATURE, as a
production call carries its own (``jax_llar.signature``). What signatures
cost is ``llar.one_shot_ll`` against ``diag.one_shot_ll_unsigned`` (the
one-shot compiled without them: the flag rule and the wait from before
signatures) in the same run; ``diag.one_shot_ll_sig0`` runs the production
kernel with signature 0, the same instructions as with any other value.
"""

from __future__ import annotations

import dataclasses
import statistics
from typing import Sequence

import numpy as np

from jax_llar import testing
from jax_llar.algorithms import MAX_BYTES, NON_DETERMINISTIC, Algorithm
from jax_llar.tools import _native
from jax_llar.tools.progress import Progress

# What a kernel's output must equal on each rank.
SUM = "sum"            # the float64 rank-order sum of all inputs, rounded once
OWN_INPUT = "own"      # the rank's own input (a copy)
LOOPBACK = "loopback"  # the rank's own input summed world-size times
NCCL = "nccl"          # NCCL's sum: bitwise for two ranks, else within 1e-2

# The signature every call of an algorithm carries (any nonzero value: the
# kernels run the same instructions for every value).
BENCH_SIGNATURE = 0x5A5A
ATOMIC_SUM = "atomic_sum"  # a non-deterministic algorithm's rule: every rank the
                           # same bits, each element within
                           # testing.atomic_sum_violations's bound (int32 exact)


@dataclasses.dataclass(frozen=True)
class KernelImpl:
  """The native kernel bench's arguments for one impl.

  Attributes:
    kind: an algorithm's short name (``"one_shot_ll"``, ``"two_shot_ll"``,
      ...), ``"copy"`` or ``"nccl"``.
    variant: one_shot_ll only: ``""`` (the all-reduce), ``"loopback"``,
      ``"send_loopback"``, ``"traced"`` or ``"unsigned"`` (compiled without
      call signatures).
    generic: one_shot_ll only: the run-time world-size kernel.
    block_lines: one_shot_ll only: lines per block of the grid rule (0: the
      production rule).
    expect: the reference its outputs must equal (SUM, OWN_INPUT, LOOPBACK,
      NCCL), or the rule they keep (ATOMIC_SUM: the algorithms of
      NON_DETERMINISTIC).
    signature: every call's signature (AllReduceArgs::signature).
  """
  kind: str
  variant: str = ""
  generic: bool = False
  block_lines: int = 0
  expect: str = SUM
  signature: int = BENCH_SIGNATURE


KERNEL_IMPLS = {
    # Every algorithm of the extension, through its production launcher
    # (the one on NCCL's LL all-to-all session under its NCCL name, below).
    **{a.impl: KernelImpl(a.short_name,
                          expect=ATOMIC_SUM if a in NON_DETERMINISTIC else SUM)
       for a in Algorithm if a is not Algorithm.NCCL_LLA2A_ONE_SHOT},
    "kernel.copy": KernelImpl("copy", expect=OWN_INPUT),
    "nccl.allreduce": KernelImpl("nccl", expect=NCCL),
    # The one-shot on NCCL's LL all-to-all device session (ncclLLA2ASession),
    # the reference the paper builds on; bitwise the rank-order sum.
    "nccl.lla2a_one_shot": KernelImpl(Algorithm.NCCL_LLA2A_ONE_SHOT.short_name),
    # Not an all-reduce: one_shot_ll with every peer store looped back into
    # the rank's own scratch (no network).
    "diag.one_shot_ll_loopback": KernelImpl("one_shot_ll", "loopback", expect=LOOPBACK),
    # The loopback kernel that also sends every line to each peer's
    # diagnostic area (never read): what outstanding remote stores cost a
    # kernel that does not wait for a peer.
    "diag.one_shot_ll_send_loopback": KernelImpl("one_shot_ll", "send_loopback",
                                                 expect=LOOPBACK),
    # The call-trace variant of one_shot_ll.
    "diag.one_shot_ll_traced": KernelImpl("one_shot_ll", "traced"),
    # The run-time world-size kernel (groups of other than 2, 4 or 8 ranks).
    "diag.one_shot_ll_generic": KernelImpl("one_shot_ll", generic=True),
    # The grid rule with 128 or 256 lines per block instead of the production rule.
    "diag.one_shot_ll_b128": KernelImpl("one_shot_ll", block_lines=128),
    "diag.one_shot_ll_b256": KernelImpl("one_shot_ll", block_lines=256),
    # The one-shot compiled without call signatures (one_shot_ll_diag.h,
    # kUnsigned): llar.one_shot_ll minus this is what signatures cost.
    "diag.one_shot_ll_unsigned": KernelImpl("one_shot_ll", "unsigned", signature=0),
    # The production one-shot with signature 0 (the foreign check can then
    # never fire): the same instructions as llar.one_shot_ll.
    "diag.one_shot_ll_sig0": KernelImpl("one_shot_ll", signature=0),
}
# Calls per graph for NCCL (its per-call cost is higher; fewer calls suffice).
NCCL_ITERS = 200


@dataclasses.dataclass(frozen=True)
class Settings:
  """What one kernel-level run measures.

  Attributes:
    impls: keys of `KERNEL_IMPLS`.
    sizes: payload bytes per rank (an algorithm's rows above its
      ``MAX_BYTES`` are skipped).
    dtypes: ``"f32"``, ``"bf16"``, ``"f16"`` (or the long names).
    iters: calls captured per graph (NCCL: NCCL_ITERS).
    reps: graph replays.
    world: devices to use (0: all).
    seed: seed of the random inputs.
  """
  impls: tuple[str, ...] = tuple(KERNEL_IMPLS)
  sizes: tuple[int, ...] = (64, 256, 1024, 4096, 16384, 65536, 262144)
  dtypes: tuple[str, ...] = ("f32", "bf16")
  iters: int = 1000
  reps: int = 6
  world: int = 0
  seed: int = 0


def expected(spec: KernelImpl, inputs: Sequence[np.ndarray], dtype) -> list[np.ndarray]:
  """Each rank's reference output for `spec` (see KernelImpl.expect)."""
  if spec.expect == OWN_INPUT:
    return list(inputs)
  if spec.expect == LOOPBACK:
    return [testing.rank_order_sum([x] * len(inputs), dtype) for x in inputs]
  return [testing.rank_order_sum(inputs, dtype)] * len(inputs)


def outputs_correct(spec: KernelImpl, outs: Sequence[np.ndarray],
                    inputs: Sequence[np.ndarray], dtype) -> bool:
  """Whether every rank's output equals its reference bitwise (NCCL beyond
  two ranks: within a relative 1e-2, its ring order not being rank order;
  ATOMIC_SUM: every rank's output rank 0's bits, and no element breaking
  `testing.atomic_sum_violations`'s rule)."""
  if spec.expect == ATOMIC_SUM:
    same = all(np.array_equal(np.ascontiguousarray(o).view(np.uint8),
                              np.ascontiguousarray(outs[0]).view(np.uint8)) for o in outs)
    return same and not any(testing.atomic_sum_violations(o, inputs, dtype).any()
                            for o in outs)
  want = expected(spec, inputs, dtype)
  if spec.expect == NCCL and len(inputs) > 2:
    return all(np.allclose(o.astype(np.float64), w.astype(np.float64), rtol=1e-2)
               for o, w in zip(outs, want))
  return all(testing.bitwise_equal(o, w) for o, w in zip(outs, want))


def bench(mod, comm_id: int, spec: KernelImpl, inputs: Sequence[np.ndarray], iters: int,
          reps: int) -> tuple[list[list[float]], list[np.ndarray]]:
  """One native kernel-bench run of `spec` on the communicator set
  `comm_id`, rank r holding ``inputs[r]`` (all of one dtype and length).

  Returns:
    (microseconds per call as [rep][rank], each rank's output array).

  Raises:
    RuntimeError: from the native bench (unknown set, size above the
      one-shot limit, CUDA or NCCL errors).
  """
  dtype = np.dtype(inputs[0].dtype)
  us, outs = mod.kernel_bench(comm_id, spec.kind, mod.DTYPE_CODES[str(dtype)],
                              [np.ascontiguousarray(x).tobytes() for x in inputs],
                              iters, reps, variant=spec.variant, generic=spec.generic,
                              block_lines=spec.block_lines, signature=spec.signature)
  return [list(r) for r in us], [np.frombuffer(o, dtype) for o in outs]


def run(s: Settings) -> dict:
  """Runs the kernel level; prints one line per row as it goes.

  Returns:
    ``{"env", "level": "kernel", "rows"}``; row keys: impl, world_size,
    dtype, bytes_per_rank, us_per_call (median over replays of the maximum
    over ranks), us_min, us_max, iters, reps, correct.

  Raises:
    RuntimeError: when the native tools module is unavailable (no CUDA
      extension) or there are fewer than two CUDA GPUs.
    ValueError: for sizes, dtypes or a world `jax_level.settings_errors`
      refuses (a world above the GPUs present among them).
  """
  import jax
  from jax_llar import comm
  from jax_llar.tools import report
  from jax_llar.tools.bench import jax_level as jax_level
  mod = _native.require("the kernel level")
  if jax.device_count() < 2:
    raise RuntimeError(f"the kernel level needs 2+ CUDA GPUs; {jax.device_count()} here")
  errors = jax_level.settings_errors(s.sizes, s.dtypes, s.world, jax.device_count())
  if errors:
    raise ValueError("; ".join(errors))
  devices = jax.devices()[: s.world or jax.device_count()]
  cs = comm.get_or_create([[d.local_hardware_id for d in devices]])
  rng = np.random.default_rng(s.seed)
  limits = {a.short_name: MAX_BYTES[a] for a in Algorithm}
  rows = []
  if any(KERNEL_IMPLS[i].variant == "traced" for i in s.impls):
    # The trace variant then stores its timestamps, as it would in use.
    mod.enable_call_trace(cs.comm_id)
  progress = Progress(len(s.dtypes) * len(s.sizes), "kernel level")
  for dt_name in s.dtypes:
    dtype = jax_level.DTYPES[dt_name]
    for nbytes in s.sizes:
      n = max(1, nbytes // dtype.itemsize)
      inputs = [testing.random_array(rng, (n,), dtype) for _ in devices]
      for impl in s.impls:
        spec = KERNEL_IMPLS[impl]
        if n * dtype.itemsize > limits.get(spec.kind, n * dtype.itemsize):
          continue
        iters = NCCL_ITERS if spec.kind == "nccl" else s.iters
        us, outs = bench(mod, cs.comm_id, spec, inputs, iters, s.reps)
        per_rep = [max(r) for r in us]
        row = {"impl": impl, "world_size": len(devices), "dtype": str(dtype),
               "bytes_per_rank": n * dtype.itemsize,
               "us_per_call": statistics.median(per_rep), "us_min": min(per_rep),
               "us_max": max(per_rep), "iters": iters, "reps": s.reps,
               "correct": outputs_correct(spec, outs, inputs, dtype)}
        rows.append(row)
        print(f"{impl:30s} {dt_name:5s} {row['bytes_per_rank']:9d} B "
              f"{row['us_per_call']:8.2f} us/call [min {row['us_min']:.2f}] "
              f"correct={row['correct']}", flush=True)
      progress.step(f"{dt_name} {nbytes} B")
  return {"env": report.environment(), "level": "kernel", "rows": rows}
