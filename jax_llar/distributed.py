"""Replica groups that span processes: one process per GPU under jax.distributed.

Many GPU deployments run one process per GPU (``jax.distributed.initialize``
with one local device each). A psum over a mesh axis then reduces across
processes. jax_llar serves such a group when all of its members are NVLink
peers on one node; groups spanning nodes keep ``lax.psum`` (NCCL is the
distributed engine there). Everything the processes must exchange goes
through the ``jax.distributed`` key-value store (no files, nothing but the
coordinator):

1. **Agreement** (once per communicator set, at the first lowering that
   needs it). Every process of the set posts its *record*: the host it runs
   on (hostname and boot id) and every input of a lowering decision
   (`decision_inputs`: the settings, the tuning table in use, the XLA flags
   the lowering reads, the jax_llar and NCCL versions). Each process then
   reads every other process's record. All of them see the same records, so
   all take the same decision: different hosts refuse the set ("spans
   nodes"), different decision inputs refuse it ("inputs differ"), in every
   process alike. Because every later decision of a psum depends only on
   those inputs and on the program (which SPMD processes share), no two
   processes can decide differently for the same psum.
2. **Communicators.** For each group the process holding rank 0 posts a
   fresh NCCL unique id (``ncclGetUniqueId``); each process creates its own
   members with ``ncclCommInitRank`` (native ``create_comm_set_of_ranks``),
   then posts whether it succeeded and reads the others' outcomes: a set
   that failed anywhere is refused everywhere.
3. **Regions** (per algorithm, when a lowering first picks it). The
   registration of symmetric memory is collective, so a process that could
   not allocate must not leave the others waiting inside NCCL: after its
   local allocations each process posts its outcome, reads the others', and
   all enter ``ncclCommWindowRegister`` only when all allocated
   (`region_agreement`; registry.h: ``RegionAgreement``).

Every read of the store is bounded (`bootstrap_timeout_ms`): a process that
never arrives (dead, or lowering another program) ends the wait in a
``CommError`` and a fallback to ``lax.psum`` there. The fallback is then not
agreed, so the processes may decide differently; the kernels' bounded wait
turns the resulting mispairing into the bounded-wait error, never a hang in
jax_llar (README: one process per GPU).

NCCL API: ``ncclGetUniqueId``, ``ncclCommInitRank``, ``ncclDevCommCreate``,
``ncclMemAlloc`` + ``ncclCommWindowRegister`` (symmetric memory across
processes of one node).
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
from typing import Any, Callable, Protocol, Sequence

from jax_llar.config import settings

# Key prefix in the key-value store (bumped when the records change).
KEY_PREFIX = "jax_llar/v1"


class KeyValueStore(Protocol):
  """What jax_llar uses of jax.distributed's client
  (``jax._src.distributed.global_state.client``)."""

  def key_value_set(self, key: str, value: str) -> None: ...

  def blocking_key_value_get(self, key: str, timeout_in_ms: int) -> str: ...


class SpanError(RuntimeError):
  """The processes of a set cannot share a communicator (the message says
  why, in the same words in every process)."""


def store() -> KeyValueStore | None:
  """The jax.distributed key-value store client; None before
  ``jax.distributed.initialize``."""
  from jax._src import distributed  # pylint: disable=g-import-not-at-top
  return distributed.global_state.client


def bootstrap_timeout_ms() -> int:
  """Bound of every read of the key-value store, milliseconds: the larger
  of 60 s and twice the kernels' bounded wait (JAX_LLAR_TIMEOUT_MS), so that
  processes that compile at different speeds still meet."""
  return max(60_000, 2 * int(settings.timeout_ms))


def host_identity() -> str:
  """This machine: hostname and Linux boot id (two containers on one node
  share the boot id; two nodes never do)."""
  try:
    with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as f:
      boot = f.read().strip()
  except OSError:
    boot = "?"
  return f"{socket.gethostname()}/{boot}"


def decision_inputs(world: int, architecture: str | None) -> dict[str, Any]:
  """Every input of a lowering decision besides the program: the settings,
  the tuning table for (`architecture`, `world`), the XLA flag the lowering
  reads, the versions. Processes whose inputs are equal decide alike."""
  from jax_llar import _ext, lowering, tuning  # pylint: disable=g-import-not-at-top
  found = tuning.lookup(architecture, world)
  table = found.table
  mod = _ext.loaded()
  return {
      "disabled": bool(settings.disabled),
      "max_bytes": int(settings.max_bytes),
      "algorithm": settings.algorithm,
      "signatures": bool(settings.signatures),
      "timeout_ms": int(settings.timeout_ms),
      "table": None if table is None else tuning.dumps(tuning.to_dict(table)),
      "concurrent_flag": bool(lowering._CONCURRENT_FLAG.search(  # pylint: disable=protected-access
          os.environ.get("XLA_FLAGS", ""))),
      "nccl": mod.nccl_runtime_version() if mod is not None else None,
      "extension": _ext.build_info(),
  }


def set_key(groups: Sequence[Sequence[tuple[int, int]]]) -> str:
  """The store's key for a set: a hash of its groups, each a list of
  (process index, CUDA ordinal in that process) in rank order."""
  text = json.dumps([[list(m) for m in g] for g in groups])
  return f"{KEY_PREFIX}/set/{hashlib.sha256(text.encode()).hexdigest()[:24]}"


def _read_all(kv: KeyValueStore, base: str, processes: Sequence[int], me: int,
              mine: str, timeout_ms: int) -> dict[int, str]:
  """Posts `mine` under base/<me> and returns every process's value."""
  kv.key_value_set(f"{base}/{me}", mine)
  out = {}
  for p in processes:
    try:
      out[p] = mine if p == me else kv.blocking_key_value_get(f"{base}/{p}", timeout_ms)
    except Exception as e:  # the client raises its own errors (deadline, shutdown)
      raise SpanError(f"process {p} did not post {base} within {timeout_ms} ms "
                      f"({type(e).__name__}: {e})") from None
  return out


def agree_on_set(kv: KeyValueStore, key: str, processes: Sequence[int], me: int,
                 record: dict[str, Any], timeout_ms: int) -> None:
  """Step 1 of the module docstring: raises SpanError, with the same text
  in every process, when the processes run on different hosts or their
  decision inputs differ."""
  got = _read_all(kv, f"{key}/record", processes, me,
                  json.dumps(record, sort_keys=True), timeout_ms)
  records = {p: json.loads(v) for p, v in sorted(got.items())}
  hosts = sorted({r["host"] for r in records.values()})
  if len(hosts) > 1:
    raise SpanError(f"the group spans {len(hosts)} nodes ({', '.join(hosts)}): "
                    "lax.psum (NCCL) serves groups across nodes")
  first = records[min(records)]["inputs"]
  for p, r in records.items():
    differ = sorted(k for k in set(first) | set(r["inputs"])
                    if first.get(k) != r["inputs"].get(k))
    if differ:
      raise SpanError(f"the processes' decision inputs differ ({', '.join(differ)}: "
                      f"process {min(records)} and process {p}); every process must "
                      "have the same jax_llar settings and tuning tables")


def local_specs(groups: Sequence[Sequence[tuple[int, int]]], me: int
                ) -> list[tuple[int, int, list[int], list[int]]]:
  """This process's part of each group that holds one of its devices:
  (group index, world, ranks, ordinals), ranks ascending."""
  out = []
  for gi, g in enumerate(groups):
    ranks = [r for r, (p, _) in enumerate(g) if p == me]
    if ranks:
      out.append((gi, len(g), ranks, [g[r][1] for r in ranks]))
  return out


def create(mod, kv: KeyValueStore, groups: Sequence[Sequence[tuple[int, int]]], me: int,
           record: dict[str, Any], timeout_ns: int,
           timeout_ms: int | None = None) -> tuple[int, list[int]]:
  """Steps 1 and 2 of the module docstring for the set of `groups` (each a
  list of (process index, local CUDA ordinal) in rank order): returns
  (comm id, the global index of each local group, in the set's order).

  Raises:
    SpanError: hosts or decision inputs differ, a process did not arrive in
      time, or the creation failed in some process (the same outcome in
      every process that got that far).
  """
  timeout_ms = bootstrap_timeout_ms() if timeout_ms is None else timeout_ms
  key = set_key(groups)
  processes = sorted({p for g in groups for p, _ in g})
  agree_on_set(kv, key, processes, me, record, timeout_ms)
  specs, order = [], []
  for gi, world, ranks, ordinals in local_specs(groups, me):
    members = {p for p, _ in groups[gi]}
    if members == {me}:
      uid = b""  # every rank is ours: ncclCommInitAll
    else:
      owner = groups[gi][0][0]
      ukey = f"{key}/uid/{gi}"
      if owner == me:
        uid = mod.nccl_unique_id()
        kv.key_value_set(ukey, uid.hex())
      else:
        try:
          uid = bytes.fromhex(kv.blocking_key_value_get(ukey, timeout_ms))
        except Exception as e:
          raise SpanError(f"process {owner} did not post the NCCL unique id of group "
                          f"{gi} within {timeout_ms} ms ({type(e).__name__}: {e})") from None
    specs.append((world, ranks, ordinals, uid))
    order.append(gi)
  comm_id, error = 0, ""
  try:
    comm_id = mod.create_comm_set_of_ranks(specs, timeout_ns)
  except RuntimeError as e:
    error = str(e) or "failed"
  outcomes = _read_all(kv, f"{key}/made", processes, me, error or "ok", timeout_ms)
  failed = {p: v for p, v in sorted(outcomes.items()) if v != "ok"}
  if failed:
    p, why = next(iter(failed.items()))
    raise SpanError(f"creating the communicators failed in process {p}: {why}")
  return comm_id, order


def region_agreement(kv: KeyValueStore, key: str, algorithm: int,
                     group_processes: Sequence[Sequence[int]], group_index: Sequence[int],
                     me: int, timeout_ms: int | None = None) -> Callable[[int, str], bool]:
  """Step 3 of the module docstring: the ``agree`` callable of the native
  ``ensure_region`` for a set spanning processes. For local group `i` (the
  set's order; `group_index[i]` is its global index) it posts this
  process's allocation outcome and returns True only when every process of
  that group (`group_processes[global index]`) allocated. Never raises (a
  store failure counts as a failed allocation)."""
  timeout_ms = bootstrap_timeout_ms() if timeout_ms is None else timeout_ms

  def agree(i: int, local_error: str) -> bool:
    gi = group_index[i]
    try:
      got = _read_all(kv, f"{key}/region/{algorithm}/{gi}", group_processes[gi], me,
                      local_error or "ok", timeout_ms)
    except SpanError:
      return False
    return all(v == "ok" for v in got.values())

  return agree


def decision_record(world: int, architecture: str | None) -> dict[str, Any]:
  """This process's record for `agree_on_set`."""
  return {"host": host_identity(), "pid": os.getpid(),
          "inputs": decision_inputs(world, architecture)}
