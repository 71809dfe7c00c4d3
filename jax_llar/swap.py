"""Which psums jax_llar serves: a region, the whole process, or one call.

jax_llar provides the lowering of JAX's own psum primitives (``psum_p`` and
``psum_invariant_p``, which ``lax.psum``, ``lax.pmean`` and the transposes of
``pvary`` and of ``psum`` bind); see ``jax_llar.lowering``. The jaxpr keeps
JAX's primitives. A psum is *requested* for the fast path, and then goes
through the dispatch policy, in three ways:

  ``jax_llar.psum(x, axis)``   that one psum (and its transposes);
  ``swap_psum()``              every psum traced inside the block or
                               decorated function, including ``pmean``, a
                               ``psum`` imported before, library code and the
                               psums that differentiation adds there;
  ``install()`` /              every psum of the process, traced or lowered
  ``JAX_LLAR_SWAP=1``          after the call (or import).

Any other psum lowers exactly as JAX lowers it, and is not recorded.

The first two mark the psum's equation through JAX's XLA metadata
(``jax.experimental.xla_metadata.set_xla_metadata``): the key ``jax_llar``
goes into the equation's context, where transformations keep it (the
transpose of a marked equation is marked), and into the lowered program as
an ``mhlo.frontend_attributes`` entry. The mark is part of jit's tracing,
lowering and compilation cache keys (JAX keys those caches on the metadata
context), so a program traced inside a block and the same program traced
outside it never share an executable. ``install()`` sets a JAX user context
globally (``jax.make_user_context``), which is part of the same keys.

``swap_psum(False)`` marks a region whose psums stay JAX's even when the
swap is installed; an explicit ``jax_llar.psum`` inside it still asks for
the fast path (the innermost mark wins).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from typing import Any

import jax
from jax.experimental.xla_metadata import set_xla_metadata

from jax_llar.config import env_bool

# The XLA metadata key of the mark, and its values.
MARK_KEY = "jax_llar"
MARK_PSUM = "psum"  # jax_llar.psum
MARK_SWAP = "swap"  # inside swap_psum()
MARK_OFF = "off"  # inside swap_psum(False)

# Process-wide swap: part of jit's cache keys.
_installed = jax.make_user_context(default_value=False)


def install() -> None:
  """Swaps every psum of this process for jax_llar's dispatch.

  Every ``psum_p`` / ``psum_invariant_p`` lowered afterwards (``lax.psum``,
  ``lax.pmean``, ``from jax.lax import psum``, gradients, library code) goes
  through jax_llar's policy; psums it does not serve lower as JAX lowers
  them, logged at INFO. Regions marked ``swap_psum(False)`` are left alone.
  Setting ``JAX_LLAR_SWAP=1`` before importing jax_llar does the same.

  The state is part of jit's cache keys, so programs traced before the call
  are traced, lowered and compiled again on their next call. Idempotent.

  Example::

    import jax_llar
    jax_llar.install()
    step = jax.jit(model_step)   # every small psum of the model is fast
  """
  _installed.set_global(True)


def uninstall() -> None:
  """Undoes ``install()`` (and ``JAX_LLAR_SWAP=1``). Idempotent."""
  _installed.set_global(False)


def installed() -> bool:
  """True when the process-wide swap is on (``install()`` or
  ``JAX_LLAR_SWAP=1``)."""
  return bool(_installed.value)


def requested(eqn_ctx: Any) -> str | None:
  """Who asked for the fast path for a psum equation, or None.

  Args:
    eqn_ctx: the equation's ``JaxprEqnContext`` (the lowering rule's
      ``ctx.jaxpr_eqn_ctx``), or None.

  Returns:
    ``"psum"`` (``jax_llar.psum``), ``"swap"`` (``swap_psum()``),
    ``"install"`` (the process-wide swap), or None: a psum jax_llar leaves to
    JAX, unrecorded.
  """
  metadata = getattr(eqn_ctx, "xla_metadata", None) or {}
  mark = metadata.get(MARK_KEY)
  if mark in (MARK_PSUM, MARK_SWAP):
    return mark
  if mark == MARK_OFF:
    return None
  return "install" if _installed.value else None


def mark(value: str) -> contextlib.AbstractContextManager:
  """The context manager that marks equations traced inside it."""
  return set_xla_metadata(**{MARK_KEY: value})


class swap_psum(contextlib.ContextDecorator):
  """Context manager / decorator: psums traced inside use jax_llar.

  Every ``psum_p`` / ``psum_invariant_p`` bound while the block is active in
  the calling thread (``lax.psum``, ``lax.pmean``, a ``psum`` imported
  before, psums inside library code and inside nested ``jax.jit``
  functions, and the psums that ``jax.grad`` adds for them) is marked for
  the fast path; jax_llar's policy then decides per psum, at lowering. A
  call of an already jitted function inside the block traces it again
  (the mark is part of jit's cache key), so the context around a call
  decides which psum runs. Re-entrant and thread-safe (the mark is JAX's
  thread-local metadata context).

  The region belongs to a thread, not to an asyncio task: while a block is
  open across an ``await``, psums that other tasks of the same thread trace
  are marked too. Keep awaits out of the block (trace, then await). A block
  must end in the thread and task that entered it; ending it elsewhere
  raises RuntimeError (after ending the mark).

  Args:
    enabled: True (default) marks the psums for jax_llar; False marks them
      to stay JAX's, also when ``install()`` is active.

  Raises:
    TypeError: `enabled` is not a bool.
    RuntimeError: the block ends in another thread or asyncio task than the
      one that entered it.

  Example::

    @jax.jit
    @jax_llar.swap_psum()
    def step(params, x):
      return jax.shard_map(model, mesh=mesh, in_specs=..., out_specs=...)(params, x)

    with jax_llar.swap_psum():
      out = jitted_model(params, x)   # traced (again) with the mark
  """

  def __init__(self, enabled: bool = True):
    """`enabled` False keeps the region JAX's (inside an install() or an
    enclosing swap). Raises TypeError for a non-bool."""
    if not isinstance(enabled, bool):
      raise TypeError(f"swap_psum(enabled): a bool, got {enabled!r}")
    self._value = MARK_SWAP if enabled else MARK_OFF
    self._local = threading.local()  # per thread: the entered marks, innermost last

  def _recreate_cm(self):
    # A fresh instance per decorated call keeps nested and concurrent calls
    # of one decorated function independent.
    return swap_psum(self._value == MARK_SWAP)

  def __enter__(self):
    """Marks the psums traced from here on (this thread), until the exit."""
    cm = mark(self._value)
    cm.__enter__()
    stack = getattr(self._local, "stack", None)
    if stack is None:
      stack = self._local.stack = []
    stack.append((cm, _current_task()))
    return self

  def __exit__(self, *exc):
    """Ends this block's mark; exceptions pass through. RuntimeError when
    the block was entered in another thread or asyncio task."""
    stack = getattr(self._local, "stack", None)
    if not stack:
      raise RuntimeError("swap_psum: this block was entered in another thread; a block "
                         "must end in the thread that entered it")
    cm, task = stack.pop()
    cm.__exit__(*exc)
    if task is not _current_task():
      raise RuntimeError(
          "swap_psum: this block was entered in asyncio task "
          f"{_task_name(task)} and ended in {_task_name(_current_task())}; while it "
          "was open across an await, psums other tasks of this thread traced were "
          "marked too. Keep awaits out of the block.")
    return False


def _current_task():
  """The running asyncio task, or None outside one."""
  try:
    return asyncio.current_task()
  except RuntimeError:  # no running event loop
    return None


def _task_name(task) -> str:
  return "(none)" if task is None else repr(task.get_name())


def _install_from_environment() -> None:
  if env_bool("JAX_LLAR_SWAP"):
    install()


_install_from_environment()
