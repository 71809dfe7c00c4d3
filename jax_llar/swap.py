"""Swap ``lax.psum`` for ``jax_llar.psum`` in code you do not want to edit.

``swap_psum`` is a context manager and a decorator. While it is active,
``jax.lax.psum`` (looked up as an attribute, as ``jax.lax.psum(...)`` and
``lax.psum(...)`` do) is ``jax_llar.psum``; the swap is seen by code traced
while it is active, e.g. a model's forward pass inside ``jax.jit``. Code that
imported the function object itself (``from jax.lax import psum``) is not
affected. The swap is process-wide while active: do not trace unrelated code
from other threads at the same time.
"""

from __future__ import annotations

import contextlib
import threading

from jax import lax

from jax_llar.psum import psum as _llar_psum

_lock = threading.RLock()
_depth = 0
_original = lax.psum


def _enter() -> None:
  global _depth
  with _lock:
    if _depth == 0:
      lax.psum = _llar_psum
    _depth += 1


def _exit() -> None:
  global _depth
  with _lock:
    _depth -= 1
    if _depth == 0:
      lax.psum = _original


class swap_psum(contextlib.ContextDecorator):
  """Context manager / decorator: ``jax.lax.psum`` means ``jax_llar.psum``.

  Re-entrant and usable from several threads: the swap stays while any
  ``with`` block (or decorated call) is active.

  Example::

    @jax.jit
    @jax_llar.swap_psum()
    def step(params, x):
      return jax.shard_map(model, mesh=mesh, in_specs=..., out_specs=...)(params, x)
  """

  def __enter__(self):
    _enter()
    return self

  def __exit__(self, *exc):
    _exit()
    return False
