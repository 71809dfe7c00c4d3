"""The pure-Python install (``pip install -C cmake.define.LLAR_CUDA=OFF``).

CI (`.ci/run`) installs the package that way into a venv of its own and runs
this file there with ``JAX_LLAR_EXPECT_NO_EXTENSION=1``: nothing native is
built, the package says why, and every psum is ``lax.psum``, bit for bit.
Elsewhere (an install with the extension) the file skips with that reason.
"""

from __future__ import annotations

import functools
import importlib.util
import os

import jax
from jax import lax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_llar
from jax_llar import _ext

pytestmark = pytest.mark.skipif(
    os.environ.get("JAX_LLAR_EXPECT_NO_EXTENSION") != "1",
    reason="checks a pure-Python install: set JAX_LLAR_EXPECT_NO_EXTENSION=1 "
           "after pip install -C cmake.define.LLAR_CUDA=OFF (.ci/run does)")


def test_nothing_native_was_installed():
  for name in ("jax_llar._llar", "jax_llar._build_info",
               "jax_llar.tools._llar_tools"):
    assert importlib.util.find_spec(name) is None, name
  assert not _ext.built() and _ext.build_info() is None


def test_status_says_why_the_fast_path_is_off():
  s = jax_llar.status()
  assert (s["built"], s["active"], s["build"]) == (False, False, None)
  assert "not built" in s["reason"]


def test_psum_is_lax_psum_bit_for_bit():
  mesh = jax.sharding.Mesh(np.array(jax.devices()[:2]), ("tp",))
  spec = jax.sharding.PartitionSpec("tp")

  def run(fn):
    @jax.jit
    @functools.partial(jax.shard_map, mesh=mesh, in_specs=spec, out_specs=spec)
    def step(x):
      return fn(x, "tp")
    return np.asarray(step(x))

  x = jax.random.normal(jax.random.key(0), (2, 1024), jnp.float32)
  np.testing.assert_array_equal(run(jax_llar.psum), run(lax.psum))
  log = jax_llar.dispatch_log()
  assert log and all(e.algorithm is None and e.reason != "fast_path" for e in log)
