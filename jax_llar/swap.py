"""Swap ``lax.psum`` for ``jax_llar.psum`` in code you do not want to edit.

``swap_psum`` is a context manager and a decorator. While it is active,
``jax.lax.psum`` (looked up as an attribute, as ``jax.lax.psum(...)`` and
``lax.psum(...)`` do) is ``jax_llar.psum``, and code traced inside it uses
jax_llar. Code that imported the function object itself
(``from jax.lax import psum``) is not affected.

The swap is part of ``jax.jit``'s cache key, as JAX's own configuration
contexts are: a jitted function called inside the block after a call outside
it (or the other way round) is traced again, so the context around a call
decides which psum runs. The key comes from a JAX user context
(``jax.make_user_context``), entered together with the attribute swap.

The attribute is process-wide while any block is active, whereas the cache
key is per thread: do not trace unrelated code from other threads while a
swap is active.
"""

from __future__ import annotations

import contextlib
import threading

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
      lax.psum = _llar_psum
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

  Re-entrant (also the same instance) and usable from several threads: the
  attribute stays swapped while any block (or decorated call) is active.
  Inside a block jit's cache key differs from outside, so a jitted function
  traces once for each and every call runs the psum of its context.

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
