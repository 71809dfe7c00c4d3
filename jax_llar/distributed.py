"""Replica groups that span processes: one process per GPU under jax.distributed.

Many GPU deployments run one process per GPU (``jax.distributed.initialize``
with one local device each). A psum over a mesh axis then reduces across
processes. jax_llar serves such a group when all of its members are NVLink
peers on one node; groups spanning nodes keep ``lax.psum`` (NCCL is the
distributed engine there). Everything the processes must exchange goes
through the ``jax.distributed`` key-value store (no files, nothing but the
coordinator):

1. **Agreement** (once per communicator set, at the first lowering that
   needs it). Every process of the set posts its *record*: the node it runs
   on (`host_identity`: its boot id) and every input of a lowering decision
   (``jax_llar.inputs.decision_inputs``: the settings, the tuning table in
   use, the XLA flags the lowering reads, the jax_llar and NCCL versions).
   Each process then reads every other process's record. All of them see the same records, so
   all take the same decision: different hosts refuse the set ("spans
   nodes"), different decision inputs refuse it ("inputs differ"), in every
   process alike. Because every later decision of a psum depends only on
   those inputs and on the program (which SPMD processes share), no two
   processes can decide differently for the same psum.
2. **Communicators.** For each group the process holding rank 0 posts a
   fresh NCCL unique id (``ncclGetUniqueId``); each process creates its own
   members with ``ncclCommInitRank`` (native ``create_comm_set_of_ranks``),
   then posts whether it succeeded and reads the others' outcomes: a set
   that failed anywhere is refused everywhere. A process whose creation
   failed proposes its failure as the verdict at once, without waiting for
   the others' posts (the process its NCCL step waited for may be gone). A
   process whose own creation succeeded releases its set when the verdict
   refuses it (native ``destroy_comm_set``: its communicators aborted, which
   waits for no other process), so a refused set holds nothing anywhere.
3. **Regions** (per algorithm, when a lowering first picks it), in two
   agreed stages (`region_agreement`; registry.h: ``RegionAgreement``).
   The registration of symmetric memory is collective, so a process that
   could not allocate must not leave the others waiting inside NCCL: after
   its local allocations each process posts its outcome, and all enter
   ``ncclCommWindowRegister`` only when all allocated (stage `ALLOCATED`).
   The registration can then complete in one process and fail in another
   (an error, or its bound passing just as NCCL's closing barrier
   completes), so before anything is published each process posts
   "registered" or its error (stage `REGISTERED`): the region is published
   only when every process registered; otherwise every process gives up
   the whole set alike (its regions withdrawn; its communicators kept when
   it has published a region before, for the programs compiled with it,
   else aborted; registry.h: ``EnsureRegion``), so no process runs the
   fast path while its peer falls back to NCCL.

Groups that share a process must span the same processes (groups of
disjoint processes are served): the regions' verdicts are per group, and a
process holding devices of several groups acts on all of theirs, so with
different memberships one process of a group could publish while another
falls back (`mixed_memberships`; every process refuses such a set from the
groups alone, before anything is posted).

Each step ends in one **verdict** per key of the store (`verdict`): the
first proposal written wins and every process acts on it, so a process that
saw every post (GO) and one whose reads timed out (its refusal) never act
differently: a late process does not enter a collective call that an early
one gave up on. Every read of the store is bounded (`bootstrap_timeout_ms`),
and so is every collective NCCL call of the set-up, with the same bound:
the native code creates the communicators non-blocking and gives each
collective step (``ncclCommInitRank``, ``ncclDevCommCreate``,
``ncclCommWindowRegister``) at most that long for the other processes,
then gives up: it aborts its communicators (``ncclCommAbort``) and frees
what it made (except after a failed registration in a set that published a
region before: step 3), so a process that died or never arrived turns into
an error naming the step ("ncclCommInitRank did not complete within N ms
..."). A refused set
is a ``CommError`` and a fallback to ``lax.psum`` in every process, and a
lowering whose decision inputs changed after the agreement refuses
(jax_llar.comm.for_groups). After the set-up, the kernels' bounded wait turns a
missing peer into the bounded-wait error (docs/multiprocess.md).

NCCL API: ``ncclGetUniqueId``, ``ncclCommInitRankConfig`` (non-blocking),
``ncclCommGetAsyncError``, ``ncclCommAbort``, ``ncclDevCommCreate``,
``ncclMemAlloc`` + ``ncclCommWindowRegister`` (symmetric memory across
processes of one node).
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
from typing import Any, Callable, Sequence

from jax_llar import log
from jax_llar.agreement import (GO, KeyValueStore, SpanError, agreed, bootstrap_timeout_ms,
                                 post, read_all, verdict)
from jax_llar.inputs import decision_inputs

# Key prefix in the key-value store (bumped when the records change).
KEY_PREFIX = "jax_llar/v1"


def host_identity() -> str:
  """This machine: its Linux boot id, which containers on one node share
  and two nodes never do (hostnames differ between pods of one node); the
  hostname where the kernel gives none. NCCL's check that all ranks form
  one load/store-accessible team stays the last word (ffi/src/registry/)."""
  try:
    with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as f:
      return "boot:" + f.read().strip()
  except OSError:
    return "host:" + socket.gethostname()


def set_key(groups: Sequence[Sequence[tuple[int, int]]]) -> str:
  """The store's key for a set: a hash of its groups, each a list of
  (process index, global device id) in rank order; the same in every
  process (a device of another process has no CUDA ordinal here)."""
  text = json.dumps([[list(m) for m in g] for g in groups])
  return f"{KEY_PREFIX}/set/{hashlib.sha256(text.encode()).hexdigest()[:24]}"


def agree_on_set(kv: KeyValueStore, key: str, processes: Sequence[int], me: int,
                 record: dict[str, Any], timeout_ms: int) -> None:
  """Step 1 of the module docstring: raises SpanError, with the same text
  in every process, when the processes run on different hosts or their
  decision inputs differ."""
  def judge(got: dict[int, str]) -> str:
    records = {p: json.loads(v) for p, v in sorted(got.items())}
    hosts = sorted({r["host"] for r in records.values()})
    if len(hosts) > 1:
      return (f"the group spans {len(hosts)} nodes ({', '.join(hosts)}): "
              "lax.psum (NCCL) serves groups across nodes")
    first = records[min(records)]["inputs"]
    for p, r in records.items():
      differ = sorted(k for k in set(first) | set(r["inputs"])
                      if first.get(k) != r["inputs"].get(k))
      if differ:
        return (f"the processes' decision inputs differ ({', '.join(differ)}: "
                f"process {min(records)} and process {p}); every process must "
                "have the same jax_llar settings and tuning tables")
    return GO

  agreed(kv, f"{key}/record", processes, me, json.dumps(record, sort_keys=True),
          timeout_ms, judge)


def mixed_memberships(groups: Sequence[Sequence[tuple[int, int]]]) -> str | None:
  """Why the set of `groups` must keep ``lax.psum``, or None: two groups
  that share a process must span the same processes (groups of disjoint
  processes are served). A region's verdicts are per group and read only by
  that group's processes, but a process holding devices of several groups
  combines their outcomes (registry.h: EnsureRegion gives up on the first
  group that fails, and gives up the whole set after a failed
  registration); with different memberships (G0 = {P0, P1}, G1 = {P0, P2})
  P1 could publish G0's region while P0 falls back, so one member of G0
  would run jax_llar's kernel and the other XLA's NCCL all-reduce. Computed
  from `groups` alone, so every process gives the same answer without any
  store traffic."""
  members = [frozenset(p for p, _ in g) for g in groups]
  for i, a in enumerate(members):
    for j in range(i):
      b = members[j]
      if a != b and a & b:
        return (f"replica groups {j} and {i} share process(es) "
                f"{', '.join(map(str, sorted(a & b)))} but not all their processes "
                f"({sorted(b)} and {sorted(a)}): jax_llar serves a set spanning processes "
                "only when groups that share a process span the same processes "
                "(docs/multiprocess.md); lax.psum (NCCL) serves this one")
  return None


def local_specs(groups: Sequence[Sequence[tuple[int, int]]], me: int,
                ordinals: dict[int, int]) -> list[tuple[int, int, list[int], list[int]]]:
  """This process's part of each group that holds one of its devices:
  (group index, world, ranks, CUDA ordinals), ranks ascending; `ordinals`
  maps this process's device ids to their CUDA ordinals."""
  out = []
  for gi, g in enumerate(groups):
    ranks = [r for r, (p, _) in enumerate(g) if p == me]
    if ranks:
      out.append((gi, len(g), ranks, [ordinals[g[r][1]] for r in ranks]))
  return out


def create(mod, kv: KeyValueStore, groups: Sequence[Sequence[tuple[int, int]]], me: int,
           record: dict[str, Any], timeout_ns: int, ordinals: dict[int, int],
           timeout_ms: int | None = None) -> tuple[int, list[int]]:
  """Steps 1 and 2 of the module docstring for the set of `groups` (each a
  list of (process index, global device id) in rank order; `ordinals` maps
  this process's device ids to CUDA ordinals): returns (comm id, the global
  index of each local group, in the set's order). `timeout_ns` is the
  kernels' bounded wait; `timeout_ms` (default `bootstrap_timeout_ms`)
  bounds every read of the store and every collective step of the native
  creation (its ``setup_timeout_ms``).

  Raises:
    SpanError: two groups share a process but not all their processes
      (`mixed_memberships`: refused in every process alike, before any
      store traffic), hosts or decision inputs differ, a process did not arrive in
      time, or the creation failed in some process, a collective step that
      did not complete within `timeout_ms` included (the same outcome in
      every process that got that far: "creating the communicators failed
      in process P: ..."). A process whose own creation succeeded has then
      released its set (`_release`): its id was never handed out, so no
      program was lowered with it.
  """
  timeout_ms = bootstrap_timeout_ms() if timeout_ms is None else timeout_ms
  mixed = mixed_memberships(groups)
  if mixed is not None:  # from `groups` alone: every process refuses alike
    raise SpanError(mixed)
  key = set_key(groups)
  processes = sorted({p for g in groups for p, _ in g})
  agree_on_set(kv, key, processes, me, record, timeout_ms)
  specs, order = [], []
  for gi, world, ranks, local in local_specs(groups, me, ordinals):
    members = {p for p, _ in groups[gi]}
    if members == {me}:
      uid = b""  # every rank is ours: ncclCommInitAll
    else:
      owner = groups[gi][0][0]
      ukey = f"{key}/uid/{gi}"
      if owner == me:
        try:
          uid = mod.nccl_unique_id()
          kv.key_value_set(ukey, uid.hex())
        except Exception as e:  # NCCL or the store refused: the others time out
          raise SpanError(f"the NCCL unique id of group {gi}: {type(e).__name__}: {e}"
                          ) from None
      else:
        try:
          uid = bytes.fromhex(kv.blocking_key_value_get(ukey, timeout_ms))
        except Exception as e:
          raise SpanError(f"process {owner} did not post the NCCL unique id of group "
                          f"{gi} within {timeout_ms} ms ({type(e).__name__}: {e})") from None
    specs.append((world, ranks, local, uid))
    order.append(gi)
  comm_id, error = 0, ""
  try:
    comm_id = mod.create_comm_set_of_ranks(specs, timeout_ns, setup_timeout_ms=timeout_ms)
  except Exception as e:  # pylint: disable=broad-except
    # Any exception is this process's failure, posted for the others (one
    # left uncaught would leave them waiting for a post that never comes).
    error = (str(e) if isinstance(e, RuntimeError) else f"{type(e).__name__}: {e}"
             ) or "failed"
  base = f"{key}/made"
  if error:
    # This process failed, so the set is refused whatever the others did:
    # post the outcome for them and propose it at once.
    failure = f"creating the communicators failed in process {me}: {error}"
    try:
      post(kv, base, me, error)
    except SpanError:
      pass  # the others then time out, and every process reads the verdict
    final = verdict(kv, base, failure, timeout_ms)
    raise SpanError(failure if final == GO else final)

  def judge(outcomes: dict[int, str]) -> str:
    failed = {p: v for p, v in sorted(outcomes.items()) if v != "ok"}
    if failed:
      p, why = next(iter(failed.items()))
      return f"creating the communicators failed in process {p}: {why}"
    return GO

  try:
    agreed(kv, base, processes, me, "ok", timeout_ms, judge)
  except BaseException:  # refused (or interrupted): this set will never be used
    _release(mod, comm_id)
    raise
  return comm_id, order


def _release(mod, comm_id: int) -> None:
  """Releases set `comm_id`, which this process made but the processes
  refused: nothing can have used it (its id has not left `create`), so the
  native ``destroy_comm_set`` accepts it. Never raises: a failure to release
  is logged, and the caller's refusal stands."""
  try:
    mod.destroy_comm_set(comm_id)
  except Exception as e:  # pylint: disable=broad-except
    log.logger.warning("jax_llar: communicator set %d was refused by the processes and "
                       "could not be released (%s: %s); it stays allocated", comm_id,
                       type(e).__name__, e)


# The stages of a region's set-up at which the processes of a group agree
# (the ``stage`` argument of `region_agreement`'s callable; registry.h:
# RegionAgreement): after the local allocations, before the collective
# registration; after the registration and the peer tables, before the
# region is published.
ALLOCATED = "allocated"
REGISTERED = "registered"


def region_agreement(kv: KeyValueStore, key: str, algorithm: int,
                     group_processes: Sequence[Sequence[int]], group_index: Sequence[int],
                     me: int, timeout_ms: int | None = None
                     ) -> Callable[[int, str, str], bool]:
  """Step 3 of the module docstring: the ``agree(i, stage, local_error)``
  callable of the native ``ensure_region`` for a set spanning processes.
  For local group `i` (the set's order; `group_index[i]` is its global
  index) and `stage` (`ALLOCATED` or `REGISTERED`) it posts this process's
  outcome (`local_error`, "" for success) and returns True only when every
  process of that group (`group_processes[global index]`) succeeded at that
  stage; every process of the group gets the same answer (one verdict per
  stage). Store keys: ``<set key>/region/<algorithm>/<group>`` and, for
  `REGISTERED`, that key + ``/registered``. Never raises (a store failure,
  or an unknown stage, counts as a failure)."""
  timeout_ms = bootstrap_timeout_ms() if timeout_ms is None else timeout_ms

  def agree(i: int, stage: str, local_error: str) -> bool:
    gi = group_index[i]
    base = f"{key}/region/{algorithm}/{gi}"
    try:
      if stage == ALLOCATED:
        return _region_verdict(kv, base, group_processes[gi], me, "ok", local_error,
                               timeout_ms, "allocating a region")
      if stage == REGISTERED:
        return _region_verdict(kv, f"{base}/registered", group_processes[gi], me,
                               "registered", local_error, timeout_ms, "registering a region")
    except Exception:  # pylint: disable=broad-except
      pass  # the store's own errors: never raise into the native caller
    return False  # an unknown stage, or the store failed: refused

  return agree


def _region_verdict(kv: KeyValueStore, base: str, processes: Sequence[int], me: int,
                    ok: str, local_error: str, timeout_ms: int, what: str) -> bool:
  """One stage of `region_agreement`: posts `ok`, or `local_error` when
  this process failed, under base/<me>; returns whether the stage's verdict
  (`verdict`) is GO, which it is only when every process posted `ok`.

  A process that failed proposes its refusal at once, without reading the
  others' posts (a process that its NCCL step waited for may be gone), and
  returns False. Only the verdict is read after a GO, never the posts again,
  so a process whose reads of the posts timed out follows a GO that the
  others act on. False, too, when the verdict can be neither written nor
  read (the store failed in this process)."""
  if local_error:
    try:
      post(kv, base, me, local_error)
    except SpanError:
      pass  # the others then time out, and every process reads the verdict
    try:
      verdict(kv, base, f"{what} failed in process {me}: {local_error}", timeout_ms)
    except SpanError:
      pass
    return False
  try:
    posts = read_all(kv, base, processes, me, ok, timeout_ms)
    bad = [f"process {p}: {v}" for p, v in sorted(posts.items()) if v != ok]
    proposal = f"{what} failed ({'; '.join(bad)})" if bad else GO
  except SpanError as e:
    proposal = str(e)
  try:
    return verdict(kv, base, proposal, timeout_ms) == GO
  except SpanError:
    return False


def decision_record(world: int, architecture: str | None) -> dict[str, Any]:
  """This process's record for `agree_on_set`."""
  return {"host": host_identity(), "pid": os.getpid(),
          "inputs": decision_inputs(world, architecture)}
