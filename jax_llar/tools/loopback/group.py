"""A loopback group: W simulated ranks on one GPU behind a real FFI custom call.

The loopback harness (`jax_llar.tools.loopback`) runs W ranks' kernels
against each other outside XLA. A `LoopbackGroup` puts the same production
kernels behind XLA FFI custom calls, so that a jitted JAX program on one GPU
exercises the path users run: the execute handler inside XLA's command
buffer, graph replays, donation, several executables sharing one group,
operand layouts, loops, export, the persistent compilation cache and the
profiler's names. Row r of the operand is rank r's input; row r of the
result is rank r's output, which must equal the rank-order sum of all rows
(`jax_llar.testing.rank_order_sum`) bit for bit.

The group (``ffi/tools/loopback_group.h``) holds, per simulated rank, what
the registry gives a real rank (state words with every algorithm's epoch
counters, an error record, a peer table per algorithm whose peers are the
other simulated ranks' regions on the same device) and a stream of its own.
Each call forks those streams from XLA's stream, launches rank r's kernel on
rank r's stream and joins them back; under XLA's stream capture the W
kernels become parallel nodes of the command buffer.

What it proves and what it does not: docs/testing.md ("The loopback group").
In short: the JAX/XLA integration, the protocol and graph replays on one
GPU; not NVLink (every store is local), not speed, not two processes.

Example (one GPU)::

  import jax, jax.numpy as jnp
  from jax_llar.tools.loopback.group import LoopbackGroup
  with LoopbackGroup(world=4) as g:
    x = jnp.arange(4 * 256, dtype=jnp.float32).reshape(4, 256)
    y = jax.jit(g.psum)(x)   # every row: x.sum(0), added in rank order

Targets (registered for CUDA by `jax_llar.tools._native`):
``jax_llar_loopback_all_reduce`` and ``jax_llar_loopback_add_rms_norm``.
"""

from __future__ import annotations

import functools
from typing import Iterable

import jax
import numpy as np
from jax.extend import core as jex_core
from jax._src.interpreters import mlir
from jax._src import dispatch as jax_dispatch
from jax._src.lib.mlir import ir

from jax_llar import algorithms, inputs, signature
from jax_llar import algorithms as algorithms_lib
from jax_llar.tools import _native

TARGET_ALL_REDUCE = "jax_llar_loopback_all_reduce"
TARGET_ADD_RMS_NORM = "jax_llar_loopback_add_rms_norm"

# The all-reduce algorithms a group can hold: every one whose kernels need no
# NCCL device communicator.
ALGORITHMS = tuple(a for a in algorithms.Algorithm
                   if a is not algorithms.Algorithm.NCCL_LLA2A_ONE_SHOT)

_MAX_RANKS = algorithms.MAX_RANKS
_DTYPE_SHORT = {"bfloat16": "bf16", "float16": "f16", "float32": "f32", "int32": "s32"}
_SERVED = tuple(np.dtype(d) for d in ("float32", "bfloat16", "float16", "int32"))


def _algorithm(a) -> algorithms.Algorithm:
  if isinstance(a, str):
    return algorithms.Algorithm.from_short_name(a)
  return algorithms.Algorithm(int(a))


class LoopbackGroup:
  """W simulated ranks of one process on one CUDA device.

  Args:
    world: number of ranks, 2 to `jax_llar.algorithms.MAX_RANKS`.
    algorithms: the all-reduce algorithms whose regions the group holds
      (names such as ``"one_shot_ll"`` or `jax_llar.algorithms.Algorithm`
      values); the fused op needs ``one_shot_ll``. Default: one-shot LL and
      two-shot LL.
    timeout_ms: the kernels' bounded wait for a peer (milliseconds).
    device: the CUDA device (default: ``jax.devices("cuda")[0]``).

  The W kernels of a call must run at once (each spins until the others
  have stored): CUDA gives that to streams with hardware queues of their own
  and to a graph's parallel branches, without promising it. Set
  ``CUDA_DEVICE_MAX_CONNECTIONS=32`` before CUDA starts (the one-GPU suite
  and ``python -m jax_llar.tools.loopback`` do); kernels that do not run
  together end in the bounded wait's report and a trap, never a hang. Use a
  group from one thread.

  Raises:
    ValueError: a bad argument (world outside 2-MAX_RANKS, an unknown algorithm or
      one that needs NCCL's device communicator, a timeout not above zero
      or above ten minutes).
    RuntimeError: no CUDA device, the native tools module unavailable (the
      message says why), or a CUDA failure while setting up.
  """

  def __init__(self, world: int, algorithms: Iterable = ("one_shot_ll", "two_shot_ll"),
               timeout_ms: float = 2000.0, device=None):
    if not isinstance(world, (int, np.integer)) or not 2 <= world <= _MAX_RANKS:
      raise ValueError(f"world must be an integer 2-{_MAX_RANKS}, not {world!r}")
    if isinstance(algorithms, (str, algorithms_lib.Algorithm)):
      algorithms = (algorithms,)  # one algorithm
    try:
      algs = tuple(dict.fromkeys(_algorithm(a) for a in algorithms))
    except TypeError:
      raise ValueError(f"algorithms must be algorithm names or ids, not {algorithms!r}") from None
    if not isinstance(timeout_ms, (int, float)) or not 0 < timeout_ms <= 600_000:
      raise ValueError(f"timeout_ms must be above 0 and at most ten minutes, not {timeout_ms!r}")
    for a in algs:
      if a not in ALGORITHMS:
        raise ValueError(f"{a.short_name} needs NCCL's device communicator over distinct "
                         "GPUs; a loopback group makes no NCCL call")
    if not algs:
      raise ValueError("name at least one algorithm")
    if device is None:
      try:
        device = jax.devices("cuda")[0]
      except RuntimeError as e:
        raise RuntimeError(f"a loopback group needs a CUDA device: {e}") from None
    if device.platform != "gpu" and getattr(device, "platform", "") != "cuda":
      raise RuntimeError(f"a loopback group needs a CUDA device, not {device}")
    self._mod = _native.require("a loopback group")
    # The CUDA ordinal (as jax_llar.comm finds it), not JAX's device id.
    hw = getattr(device, "local_hardware_id", None)
    self._ordinal = int(device.id if hw is None else hw)
    self.world = int(world)
    self.algorithms = algs
    self.device = device
    self.timeout_ms = float(timeout_ms)
    self.id = int(self._mod.create_loopback_group(
        self.world, [int(a) for a in algs], self.timeout_ms, self._ordinal))
    self._closed = False

  # -- the calls --------------------------------------------------------------
  def psum(self, x, algorithm="one_shot_ll") -> jax.Array:
    """Every simulated rank's all-reduce of one operand.

    Args:
      x: array of shape ``(world, ...)``, float32, bfloat16, float16 or
        int32 (not int32 for ``one_shot_sentinel``); row r is rank r's
        input. Any layout: XLA passes the custom call a row-major copy.
      algorithm: one of the group's algorithms.

    Returns:
      An array of x's shape and dtype whose every row is the rank-order sum
      of x's rows, computed by `algorithm`'s production kernel for each rank.

    Raises:
      ValueError: a shape, dtype or algorithm the group does not serve, a
        payload per rank above the algorithm's limit (bytes), one whose W
        grids cannot be resident on the device at once (with the reason), or
        XLA_FLAGS asking for concurrent command-buffer scheduling.
    """
    a = _algorithm(algorithm)
    if a not in self.algorithms:
      raise ValueError(f"the group holds no {a.short_name} region (it holds "
                       f"{[b.short_name for b in self.algorithms]})")
    self._check_scheduling()
    x = jax.numpy.asarray(x)
    self._check_rows(x.shape)
    dt = np.dtype(x.dtype)
    if dt not in _SERVED:
      raise ValueError(f"the loopback all-reduce serves {[str(d) for d in _SERVED]}, not {dt}")
    refusal = algorithms.dtype_refusal(a, dt)
    if refusal:
      raise ValueError(refusal)
    per_rank = x.size // self.world * dt.itemsize
    if per_rank > algorithms.MAX_BYTES[a]:
      raise ValueError(f"{per_rank} bytes per rank exceed the {a.short_name} limit of "
                       f"{algorithms.MAX_BYTES[a]} bytes")
    if per_rank:
      self._check_plan(a, per_rank, dt)
    return _all_reduce_p.bind(x, group_id=self.id, algorithm=int(a), world=self.world)

  def add_rms_norm(self, x, residual, weight, eps: float = 1e-6):
    """Every simulated rank's fused all-reduce + residual add + RMSNorm.

    Args:
      x: ``(world, ..., d)`` float32, bfloat16 or float16: rank r's partial
        sum in row r.
      residual: x's shape and dtype: rank r's residual in row r (a tensor-
        parallel layer's ranks hold the same one).
      weight: ``(d,)``, x's dtype or float32.
      eps: RMSNorm's epsilon (a Python float).

    Returns:
      ``(normed, new_residual)``, each of x's shape and dtype: per rank,
      ``new_residual = residual + sum of x over ranks`` (rank order) and
      ``normed = rms_norm(new_residual) * weight`` as
      `jax_llar.psum_add_rms_norm` computes them on the fast path.

    Raises:
      ValueError: a group without the one_shot_ll region, shapes or dtypes
        the fused kernel does not serve (`jax_llar.algorithms.
        add_rms_norm_refusal`), or ranks' clusters that cannot be resident
        at once.
    """
    if algorithms.Algorithm.ONE_SHOT_LL not in self.algorithms:
      raise ValueError("the fused op runs on the one_shot_ll region, which this group "
                       "does not hold")
    self._check_scheduling()
    x, residual, weight = (jax.numpy.asarray(v) for v in (x, residual, weight))
    self._check_rows(x.shape)
    if x.ndim < 2 or residual.shape != x.shape or residual.dtype != x.dtype:
      raise ValueError(f"x must be (world, ..., d) and residual of x's shape and dtype; "
                       f"got x {x.shape} {x.dtype}, residual {residual.shape} "
                       f"{residual.dtype}")
    if weight.shape != x.shape[-1:]:
      raise ValueError(f"weight must have shape {x.shape[-1:]}, not {weight.shape}")
    refusal = algorithms.add_rms_norm_refusal(x.shape[1:], x.dtype, weight.dtype)
    if refusal:
      raise ValueError(refusal)
    rows = int(np.prod(x.shape[1:-1], dtype=np.int64))
    if x.size:
      codes = self._mod.DTYPE_CODES
      plan = self._mod.loopback_add_rms_norm_plan(
          self.world, codes[str(np.dtype(x.dtype))], codes[str(np.dtype(weight.dtype))],
          rows, int(x.shape[-1]), self._ordinal)
      if not plan["co_resident"]:
        raise ValueError(
            f"the {self.world} ranks' {plan['clusters']} clusters of "
            f"{plan['cluster_blocks']} blocks of {plan['threads']} threads cannot be "
            f"resident on the device at once (at most {plan['max_active_clusters']}): "
            "the ranks would wait for blocks that cannot start")
    return _add_rms_norm_p.bind(x, residual, weight, group_id=self.id, eps=float(eps),
                                world=self.world)

  # -- inspection and lifetime -------------------------------------------------
  def records(self) -> list[dict]:
    """Each rank's error record (``code`` 0: nothing reported; 1: a bounded
    wait expired; 2: a foreign call signature), readable after a trap."""
    return self._mod.loopback_group_records(self.id)

  def epochs(self, algorithm="one_shot_ll") -> np.ndarray:
    """Each rank's epoch counters of `algorithm`'s set, uint64 of shape
    (world, blocks, warps) (the extension's kMaxBlocks x kMaxWarps), after a
    bounded wait for the group's rank streams (not for XLA's: block on the
    programs' results first): every warp of a call's grid advances its
    counter once per call, the others stay.

    Raises:
      RuntimeError: the group's kernels failed or did not finish in time.
    """
    a = _algorithm(algorithm)
    counters = np.asarray(self._mod.loopback_group_epochs(self.id, int(a)), np.uint64)
    return counters.reshape((self.world,) + tuple(self._mod.EPOCH_SHAPE))

  def close(self) -> None:
    """Withdraws the group, then waits (bounded) for its rank streams (block
    on the programs' results first). Programs
    traced or run eagerly afterwards fail with "no loopback group"; its
    device memory stays for the life of the process, since a command buffer
    that XLA captured earlier holds its addresses. Idempotent.

    Raises:
      RuntimeError: its kernels failed or did not finish in time.
    """
    if not self._closed:
      self._closed = True
      self._mod.destroy_loopback_group(self.id)

  def __enter__(self) -> LoopbackGroup:
    return self

  def __exit__(self, *exc) -> None:
    self.close()

  def __repr__(self) -> str:
    return (f"LoopbackGroup(id={self.id}, world={self.world}, algorithms="
            f"{[a.short_name for a in self.algorithms]}, device={self.device})")

  # -- checks ----------------------------------------------------------------
  @staticmethod
  def _check_scheduling() -> None:
    if inputs.concurrent_scheduling():
      raise ValueError(
          "XLA_FLAGS asks for concurrent command-buffer scheduling, under which two "
          "independent calls of a group could run at once on its shared regions and "
          "epoch counters (jax_llar's fast path refuses it for the same reason)")

  def _check_rows(self, shape) -> None:
    if len(shape) < 1 or shape[0] != self.world:
      raise ValueError(f"the operand's leading dimension must be the group's {self.world} "
                       f"ranks, not shape {tuple(shape)}")

  def _check_plan(self, a: algorithms.Algorithm, per_rank: int, dt: np.dtype) -> None:
    plan = self._mod.loopback_plan(self.world, per_rank, self._mod.DTYPE_CODES[str(dt)],
                                   algorithm=int(a), ordinal=self._ordinal)
    if not plan["co_resident"]:
      raise ValueError(
          f"{a.short_name} at {per_rank} bytes per rank: the {self.world} ranks' grids "
          f"({plan['blocks']} blocks of {plan['threads']} threads each) cannot be "
          f"resident on the device at once ({plan['sms']} multiprocessors x "
          f"{plan['blocks_per_sm']} blocks): the ranks would wait for blocks that "
          "cannot start")


# -- primitives --------------------------------------------------------------
_all_reduce_p = jex_core.Primitive("llar_loopback_all_reduce")
_all_reduce_p.def_abstract_eval(lambda x, **_: x)
_add_rms_norm_p = jex_core.Primitive("llar_loopback_add_rms_norm")
_add_rms_norm_p.multiple_results = True
_add_rms_norm_p.def_abstract_eval(lambda x, residual, weight, **_: (x, x))
for _p in (_all_reduce_p, _add_rms_norm_p):  # eager calls run as one jitted call
  _p.def_impl(functools.partial(jax_dispatch.apply_primitive, _p))


def _op_name(kernel: str, aval, world: int) -> str:
  """``jax_llar.loopback.<kernel>.<dtype>.<bytes per rank>B.<W>ranks``: the
  name the call carries in XLA's metadata and in profiler traces."""
  dt = np.dtype(aval.dtype)
  per_rank = int(np.prod(aval.shape, dtype=np.int64)) // world * dt.itemsize
  return f"jax_llar.loopback.{kernel}.{_DTYPE_SHORT.get(str(dt), str(dt))}.{per_rank}B.{world}ranks"


def _emit(ctx, target: str, kernel: str, world: int, operands, **attributes):
  name = _op_name(kernel, ctx.avals_in[0], world)
  sig = signature.assign(ctx.module_context, name, ctx.traceback)
  loc = mlir.source_info_to_location(
      ctx.module_context, None, ctx.name_stack.extend(name), ctx.traceback)
  with ir.Location.name(f"jax_llar.loopback.{kernel}:", childLoc=loc):
    return jax.ffi.ffi_lowering(target)(ctx, *operands, signature=np.int64(sig), **attributes)


def _all_reduce_lowering(ctx, x, *, group_id, algorithm, world):
  return _emit(ctx, TARGET_ALL_REDUCE, algorithms.Algorithm(algorithm).short_name, world, (x,),
               group_id=np.int64(group_id), algorithm=np.int64(algorithm))


def _add_rms_norm_lowering(ctx, x, residual, weight, *, group_id, eps, world):
  return _emit(ctx, TARGET_ADD_RMS_NORM, "one_shot_ll_add_rms_norm", world,
               (x, residual, weight), group_id=np.int64(group_id), eps=np.float32(eps))


def _not_on_this_platform(ctx, *args, **params):
  raise NotImplementedError(
      "a loopback group's calls run on CUDA only (its ranks are kernels on one GPU); "
      f"this lowering is for {', '.join(ctx.module_context.platforms)}")


# Not cacheable: JAX would otherwise lower equal equations of a module once,
# and every such call would carry the first one's signature (the production
# rule is registered the same way, jax_llar.lowering).
for _p, _rule in ((_all_reduce_p, _all_reduce_lowering),
                  (_add_rms_norm_p, _add_rms_norm_lowering)):
  mlir.register_lowering(_p, _not_on_this_platform, cacheable=False)
  mlir.register_lowering(_p, _rule, platform="cuda", cacheable=False)
