"""Processes agreeing through the ``jax.distributed`` key-value store.

The steps of a set-up that spans processes (jax_llar.distributed) exchange
everything through the store of ``jax.distributed``: every process posts its
value under ``<base>/<process>`` and reads the others' within a bound
(`read_all`, `bootstrap_timeout_ms`), and each step ends in one `verdict`
per key: the first proposal written wins and every process acts on it, so a
process that saw every post (`GO`) and one whose reads timed out never act
differently.
"""

from __future__ import annotations

from typing import Callable, Protocol, Sequence

from jax_llar.config import settings

class KeyValueStore(Protocol):
  """What jax_llar uses of jax.distributed's client
  (``jax._src.distributed.global_state.client``)."""

  def key_value_set(self, key: str, value: str) -> None:
    """Stores `value` under `key`; raises when the key exists already (the
    store keeps the first value: `verdict` relies on it)."""

  def blocking_key_value_get(self, key: str, timeout_in_ms: int) -> str:
    """The value of `key`, waiting for it at most `timeout_in_ms` ms; raises
    when it does not appear in time."""


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


def post(kv: KeyValueStore, base: str, me: int, mine: str) -> None:
  """Posts `mine` under base/<me>.

  Raises:
    SpanError: the store refused the post.
  """
  try:
    kv.key_value_set(f"{base}/{me}", mine)
  except Exception as e:  # the client's own errors (ALREADY_EXISTS, shutdown)
    raise SpanError(f"could not post {base}/{me} ({type(e).__name__}: {e})") from None


def read_all(kv: KeyValueStore, base: str, processes: Sequence[int], me: int,
              mine: str, timeout_ms: int) -> dict[int, str]:
  """Posts `mine` under base/<me> and returns every process's value.

  Raises:
    SpanError: a process did not post within `timeout_ms` (its text names
      it); this process's own post could not be made.
  """
  post(kv, base, me, mine)
  out = {}
  for p in processes:
    try:
      out[p] = mine if p == me else kv.blocking_key_value_get(f"{base}/{p}", timeout_ms)
    except Exception as e:  # the client raises its own errors (deadline, shutdown)
      raise SpanError(f"process {p} did not post {base} within {timeout_ms} ms "
                      f"({type(e).__name__}: {e})") from None
  return out


# A verdict's value when every process may go on.
GO = "go"


def verdict(kv: KeyValueStore, base: str, proposal: str, timeout_ms: int) -> str:
  """The one verdict of a step for every process: the first proposal
  written to base/verdict wins (the store refuses a second write of a key),
  and every process acts on the winner. A process that saw every post
  proposes GO; one that timed out, or saw a failure, proposes why not. So a
  late process never enters a collective call that an early one gave up on
  (it reads the early one's refusal), and an early one never gives up on a
  collective that a late one enters.

  Raises:
    SpanError: the verdict could be neither written nor read.
  """
  key = f"{base}/verdict"
  try:
    kv.key_value_set(key, proposal)
    return proposal
  except Exception:  # another process wrote it first: read that one
    pass
  try:
    return kv.blocking_key_value_get(key, timeout_ms)
  except Exception as e:
    raise SpanError(f"no verdict at {key} ({type(e).__name__}: {e})") from None


def agreed(kv: KeyValueStore, base: str, processes: Sequence[int], me: int, mine: str,
            timeout_ms: int, judge: Callable[[dict[int, str]], str]) -> None:
  """`read_all`, then `verdict` on `judge(values)` (GO, or why not; a
  timeout proposes its own text); raises SpanError with the verdict's text
  unless it is GO. Returns on GO without reading the posts again (no caller
  needs them): a process whose reads timed out follows a GO that another
  process wrote (``jax_llar.distributed``'s region verdicts do the same),
  and never refuses alone."""
  try:
    proposal = judge(read_all(kv, base, processes, me, mine, timeout_ms))
  except SpanError as e:
    proposal = str(e)
  final = verdict(kv, base, proposal, timeout_ms)
  if final != GO:
    raise SpanError(final)
