"""Swap ``lax.psum`` for ``jax_llar.psum`` in code you do not want to edit.

``swap_psum`` is a context manager and a decorator. Code traced inside it
that calls ``jax.lax.psum`` (looked up as an attribute, as ``jax.lax.psum(...)``
and ``lax.psum(...)`` do) uses ``jax_llar.psum``. Code that imported the
function object itself (``from jax.lax import psum``) before the block is not
affected.

The swap is part of ``jax.jit``'s cache key, as JAX's own configuration
contexts are: a jitted function called inside the block after a call outside
it (or the other way round) is traced again, so the context around a call
decides which psum runs. The key comes from a JAX user context
(``jax.make_user_context``), which is per thread.

The swap is per thread too. While any block is active, in any thread, the
attribute ``jax.lax.psum`` is a dispatcher that calls ``jax_llar.psum`` when
the calling thread is inside a block and JAX's own psum otherwise; outside
every block the attribute is JAX's function object again. So the psum that
a trace takes always agrees with the cache key it is stored under: another
thread that traces while a block is active gets JAX's psum, and its cached
trace stays JAX's. (A reference to the attribute taken inside a block is
the dispatcher, and keeps choosing by the calling thread's context.)
"""

from __future__ import annotations

import contextlib
import functools
import threading
from typing import Callable

import jax
from jax import lax

from jax_llar.psum import psum as _llar_psum

_lock = threading.RLock()
_depth = 0  # active blocks, all threads
_original = lax.psum

# True inside a swap: part of jit's cache key (and of the trace context).
_swapped = jax.make_user_context(default_value=False)
# Per thread: the user-context managers of the active blocks, innermost last.
_local = threading.local()


def _resolve() -> Callable:
  """The psum for the calling thread: jax_llar's inside a block, else JAX's."""
  return _llar_psum if _swapped.value else _original


@functools.wraps(_original)
def _dispatch(*args, **kwargs):
  return _resolve()(*args, **kwargs)


_dispatch.__module__, _dispatch.__qualname__ = __name__, "_dispatch"
_dispatch.__doc__ = (
    "``jax.lax.psum`` while a ``jax_llar.swap_psum`` block is active in some "
    "thread: calls ``jax_llar.psum`` when the calling thread is inside a "
    "block, JAX's ``lax.psum`` otherwise (the same arguments).\n\n"
    + (_original.__doc__ or ""))


def _enter() -> None:
  global _depth
  cm = _swapped(True)
  cm.__enter__()
  stack = getattr(_local, "stack", None)
  if stack is None:
    stack = _local.stack = []
  stack.append(cm)
  with _lock:
    if _depth == 0:
      lax.psum = _dispatch
    _depth += 1


def _exit(*exc) -> None:
  global _depth
  with _lock:
    _depth -= 1
    if _depth == 0:
      lax.psum = _original
  _local.stack.pop().__exit__(*exc)


class swap_psum(contextlib.ContextDecorator):
  """Context manager / decorator: ``jax.lax.psum`` means ``jax_llar.psum``.

  Re-entrant (also the same instance) and usable from several threads; the
  swap holds in the thread that entered the block. While any block (or
  decorated call) is active, ``jax.lax.psum`` is a dispatcher that picks
  ``jax_llar.psum`` in threads inside a block and ``lax.psum`` in the
  others; outside every block it is ``lax.psum`` itself. Inside a block
  jit's cache key differs from outside, so a jitted function traces once for
  each and every call runs the psum of its context.

  Example::

    @jax.jit
    @jax_llar.swap_psum()
    def step(params, x):
      return jax.shard_map(model, mesh=mesh, in_specs=..., out_specs=...)(params, x)

    with jax_llar.swap_psum():
      out = jitted_model(params, x)   # traced (again) with jax_llar.psum
  """

  def __enter__(self):
    _enter()
    return self

  def __exit__(self, *exc):
    _exit(*exc)
    return False
