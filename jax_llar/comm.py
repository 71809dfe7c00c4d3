"""Communicators: from a mesh axis to NCCL communicators + symmetric scratch.

For the devices of the replica groups of a psum (the partitions of the mesh
that reduce together, as JAX's own psum lowering forms them), jax_llar creates
one communicator set, once per distinct group layout, at lowering time, and
keeps it for the life of the process. The set holds, per group, NCCL
communicators (``ncclCommInitAll``) and device communicators
(``ncclDevCommCreate``), and, per device, epoch counters in device memory.

Scratch is allocated per algorithm, the first time a lowering picks that
algorithm for the set (`CommSet.ensure`): a region of symmetric memory
(``ncclMemAlloc`` + ``ncclCommWindowRegister``, grouped) with its peer
addresses (``ncclGetLsaPointer``). Region sizes per rank
(``algorithms.region_bytes``): the one-shot LL's is ``2 * 64 * world * 512 *
16`` bytes (1 MiB per rank of the group), the two-shot LL's 32-36 MiB. A
process that only ever runs one-shot calls holds only the one-shot's region.
"""

from __future__ import annotations

import dataclasses
import os
import threading
from typing import Callable, Sequence

import jax

from jax_llar import _ext, agreement, distributed, inputs, tuning
from jax_llar.algorithms import Algorithm
from jax_llar.config import settings


class CommError(RuntimeError):
  """Raised when a communicator set cannot be created (message says why)."""


@dataclasses.dataclass(frozen=True)
class CommSet:
  """A communicator set.

  Attributes:
    comm_id: id passed to the FFI handler (static attribute ``comm_id``).
    key: fingerprint of the groups (static attribute ``comm_key``), checked
      by the handler at instantiation.
    groups: replica groups as tuples of local CUDA ordinals, rank order.
    world_size: ranks per group.
  """
  comm_id: int
  key: int
  groups: tuple[tuple[int, ...], ...]
  world_size: int
  # For a set spanning processes (get_or_create_spanning): algorithm ->
  # the native ensure_region's ``agree(group, stage, local_error)`` callable
  # (jax_llar.distributed.region_agreement); None for one process.
  agreement: Callable[[Algorithm], Callable[[int, str, str], bool]] | None = dataclasses.field(
      default=None, compare=False, repr=False)
  # For a set spanning processes: the decision inputs the processes agreed
  # on (jax_llar.inputs.decision_inputs); a lowering whose inputs have
  # changed since must not decide differently from the other processes.
  agreed_inputs: dict | None = dataclasses.field(default=None, compare=False, repr=False)

  def ensure(self, algorithm: Algorithm) -> None:
    """Allocates `algorithm`'s scratch region on every device of the set,
    once (later calls return at once).

    Raises:
      CommError: CUDA or NCCL refused (out of memory, ...); what was
        allocated is freed, the region stays absent, and the failure is
        remembered: later calls for this set and algorithm raise it again at
        once (every psum lowered afterwards falls back with its reason)
        instead of allocating again. For a set spanning processes, a
        registration that failed in any process gives up the whole set in
        every process (registry.h: EnsureRegion): every algorithm's later
        calls raise.
    """
    mod = _ext.load()
    if mod is None:
      raise CommError(_ext.reason() or "extension unavailable")
    with _lock:
      failed = _region_failures.get((self.comm_id, int(algorithm)))
      if failed is not None:
        raise CommError(failed)
      if int(algorithm) in self._regions():
        return
      try:
        if self.agreement is None:
          mod.ensure_region(self.comm_id, int(algorithm))
        else:  # collective over processes: agree before registering
          mod.ensure_region(self.comm_id, int(algorithm), self.agreement(algorithm))
      except Exception as e:  # RuntimeError, or anything else (remembered alike)
        _region_failures[(self.comm_id, int(algorithm))] = _why(e)
        raise CommError(_why(e)) from None

  def _regions(self) -> tuple[int, ...]:
    mod = _ext.loaded()
    return tuple(int(a) for a in mod.regions(self.comm_id)) if mod else ()

  @property
  def regions(self) -> tuple[Algorithm, ...]:
    """The algorithms whose scratch regions the set holds, in id order."""
    return tuple(Algorithm(a) for a in self._regions())

  @property
  def scratch_bytes(self) -> int:
    """Bytes of symmetric scratch held per device (the sum of its regions,
    those kept by a set that was given up included: never freed)."""
    mod = _ext.loaded()
    return int(mod.scratch_bytes(self.comm_id)) if mod else 0


def _why(e: Exception) -> str:
  """The message of a failed native call: the extension's own text for its
  RuntimeError, else the exception's type and its first line (nanobind's
  TypeError for an argument the C++ parameter cannot hold lists the
  signatures below it)."""
  if type(e) is RuntimeError:  # pylint: disable=unidiomatic-typecheck
    return str(e)
  text = str(e).strip().splitlines()
  return f"{type(e).__name__}: {text[0] if text else '(no message)'}"


_lock = threading.Lock()
_sets: dict[tuple[tuple[int, ...], ...], CommSet | CommError] = {}
# (comm id, FFI id of the algorithm) -> why its region could not be allocated.
_region_failures: dict[tuple[int, int], str] = {}


def get_or_create(groups: Sequence[Sequence[int]]) -> CommSet:
  """Returns the communicator set for `groups` (CUDA ordinals), creating it.

  Raises:
    CommError: the extension is unavailable or NCCL/CUDA refused (the devices
      are not peer accessible, NCCL puts them in different LSA teams, ...).
      A failure is remembered, so the same groups fail fast afterwards.
  """
  key = tuple(tuple(int(d) for d in g) for g in groups)
  with _lock:
    hit = _sets.get(key)
    if isinstance(hit, CommError):
      raise CommError(str(hit))  # a fresh error: no traceback kept from earlier
    if hit is not None:
      return hit
    mod = _ext.load()
    if mod is None:
      raise CommError(_ext.reason() or "extension unavailable")
    # Our communicators never use NVLink SHARP (multicast); keep NCCL from
    # setting it up unless the user asked for it. NCCL reads the variable once
    # per process, so this also applies to XLA's NCCL communicators created
    # later (README: build notes).
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    try:
      comm_id = mod.create_comm_set([list(g) for g in key],
                                    int(settings.timeout_ms) * 1_000_000)
    except Exception as e:  # RuntimeError, or anything else: remembered alike
      err = CommError(_why(e))
      _sets[key] = err
      raise err from None
    cs = CommSet(comm_id=comm_id, key=int(mod.comm_key(comm_id)), groups=key,
                 world_size=len(key[0]))
    _sets[key] = cs
    return cs


def get_or_create_spanning(groups: Sequence[Sequence[tuple[int, int]]],
                           architecture: str | None,
                           ordinals: dict[int, int] | None = None) -> CommSet:
  """`get_or_create` for groups that may span processes (one process per
  GPU, jax.distributed): each group a list of (process index, global device
  id) in rank order, `ordinals` this process's device ids -> CUDA ordinals
  (JAX gives no ordinal for another process's device); every process of the
  groups must call it for the same groups (SPMD lowering does). The method, and what the
  processes agree on through the jax.distributed key-value store:
  `jax_llar.distributed`. The set's `CommSet.groups` are this process's
  ordinals of the groups it belongs to.

  Raises:
    CommError: jax.distributed is not initialised, the processes run on
      different nodes or with different decision inputs, a process did not
      arrive within the bootstrap timeout, or NCCL/CUDA refused in some
      process. Remembered, like `get_or_create`'s.
  """
  import jax  # pylint: disable=g-import-not-at-top
  key = ("spanning",) + tuple(tuple((int(p), int(d)) for p, d in g) for g in groups)
  ordinals = dict(ordinals or {})
  with _lock:
    hit = _sets.get(key)
    if isinstance(hit, CommError):
      raise CommError(str(hit))
    if hit is not None:
      return hit
    mod = _ext.load()
    if mod is None:
      raise CommError(_ext.reason() or "extension unavailable")
    kv = agreement.store()
    if kv is None:
      err = CommError("the replica groups span processes and jax.distributed is not "
                      "initialised (jax.distributed.initialize): its key-value store "
                      "carries the NCCL unique ids")
      _sets[key] = err
      raise err
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")  # as in get_or_create
    me = jax.process_index()
    world = len(groups[0])
    record = distributed.decision_record(world, architecture)
    try:
      comm_id, order = distributed.create(
          mod, kv, groups, me, record, int(settings.timeout_ms) * 1_000_000, ordinals)
    except Exception as e:  # SpanError, or anything else: remembered, never retried
      # (a retry would post the same keys again, which the store refuses).
      err = CommError(str(e) if isinstance(e, agreement.SpanError)
                      else f"{type(e).__name__}: {e}")
      _sets[key] = err
      raise err from None
    skey = distributed.set_key(groups)
    members = [sorted({p for p, _ in g}) for g in groups]

    def region_agreement(algorithm: Algorithm):
      return distributed.region_agreement(kv, skey, int(algorithm), members, order, me)

    local = tuple(tuple(ordinals[d] for p, d in groups[gi] if p == me) for gi in order)
    cs = CommSet(comm_id=comm_id, key=int(mod.comm_key(comm_id)), groups=local,
                 world_size=world, agreement=region_agreement,
                 agreed_inputs=record["inputs"])
    _sets[key] = cs
    return cs


def spans_processes(devices) -> bool:
  """Whether the psum's devices belong to more than one process (or the
  program runs in several): then every process takes part in the set's
  creation (`get_or_create_spanning`)."""
  return jax.process_count() > 1 or any(
      d.process_index != jax.process_index() for d in devices)


def for_groups(groups) -> CommSet:
  """The communicator set of `groups` (lists of jax devices, in rank order),
  made the first time the groups are seen: `get_or_create` for devices of
  this process, `get_or_create_spanning` for groups that span processes
  (keyed by global device id: another process's device has no CUDA ordinal
  here, and the key must be the same in every process).

  Raises:
    CommError: the set cannot be made, or (spanning) this process's
      decision inputs changed since the processes agreed on them.
  """
  devices = [d for g in groups for d in g]
  if spans_processes(devices):
    me = jax.process_index()
    architecture = tuning.architecture_of(devices[0])
    cs = get_or_create_spanning(
        [[(d.process_index, d.id) for d in g] for g in groups], architecture,
        {d.id: d.local_hardware_id for d in devices if d.process_index == me})
    now = inputs.decision_inputs(len(groups[0]), architecture)
    if cs.agreed_inputs is not None and now != cs.agreed_inputs:
      changed = sorted(k for k in now if now.get(k) != cs.agreed_inputs.get(k))
      raise CommError(
          f"this process's decision inputs changed since the processes agreed on them "
          f"({', '.join(changed)}): the others would decide differently; change "
          "settings in every process alike, before the first lowering")
    return cs
  return get_or_create([[d.local_hardware_id for d in g] for g in groups])


def comm_sets() -> list[CommSet]:
  """The communicator sets created so far."""
  with _lock:
    return [v for v in _sets.values() if isinstance(v, CommSet)]
