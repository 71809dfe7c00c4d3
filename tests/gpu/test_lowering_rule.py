"""The lowering rule on GPUs (issue 10): psums that only the swap reaches take
the fast path and equal lax.psum bitwise; export, the persistent compilation
cache and the profiler trace."""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.lax import psum as imported_psum  # imported before any swap
from jax.sharding import NamedSharding, PartitionSpec as P

import jax_llar
from jax_llar import testing

from gpu_helpers import F32, run_program

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _equal(a, b, ranks):
  a, b = np.asarray(a), np.asarray(b)
  if ranks == 2:  # two ranks: NCCL's sum is the exact rank-order sum
    assert testing.bitwise_equal(a, b)
  else:
    np.testing.assert_allclose(a, b, rtol=1e-6)


@pytest.mark.parametrize("what", ["pmean", "imported_psum", "grad_transpose",
                                  "grad_transpose_no_vma"])
def test_installed_swap_serves_psums_jax_binds(mesh, what):
  rng = np.random.default_rng(30)
  x = jax.device_put(testing.random_array(rng, (mesh.size * 256,), F32),
                     NamedSharding(mesh, P("x")))
  w = jnp.float32(1.25)

  def program():
    if what == "pmean":
      f = jax.shard_map(lambda v: lax.pmean(v, "x"), mesh=mesh, in_specs=P("x"),
                        out_specs=P())
      return jax.jit(f), (x,)
    if what == "imported_psum":
      f = jax.shard_map(lambda v: imported_psum(v, "x"), mesh=mesh,
                        in_specs=P("x"), out_specs=P())
      return jax.jit(f), (x,)
    check_vma = what == "grad_transpose"

    def loss(w, x):
      y = jax.shard_map(lambda v, w: jnp.sin(v) * w, mesh=mesh,
                        in_specs=(P("x"), P()), out_specs=P("x"),
                        check_vma=check_vma)(x, w)
      return jnp.sum(y)
    return jax.jit(jax.grad(loss)), (w, x)

  f, args = program()
  want = f(*args)
  jax_llar.clear_dispatch_log()
  jax_llar.install()
  try:
    f2, _ = program()
    got = f2(*args)
  finally:
    jax_llar.uninstall()
  decisions = jax_llar.dispatch_log()
  assert decisions and all(d.fast and d.source == "install" for d in decisions), decisions
  _equal(got, want, mesh.size)


def test_exported_program_runs_in_a_fresh_process(mesh, tmp_path):
  pytest.importorskip("flatbuffers")
  rng = np.random.default_rng(31)
  x = testing.random_array(rng, (mesh.size, 512), F32)
  xs = jax.device_put(x, NamedSharding(mesh, P("x")))
  f = jax.jit(jax.shard_map(lambda v: jax_llar.psum(v, "x"), mesh=mesh,
                            in_specs=P("x"), out_specs=P()))
  jax_llar.clear_dispatch_log()
  exp = jax.export.export(f)(xs)
  assert [d.reason for d in jax_llar.dispatch_log()] == ["export"]
  assert "jax_llar_all_reduce" not in exp.mlir_module()
  (tmp_path / "f.bin").write_bytes(exp.serialize())
  np.save(tmp_path / "x.npy", x)
  r = run_program("export_child", str(tmp_path / "f.bin"), str(tmp_path / "x.npy"),
                  str(tmp_path / "out.npy"))
  assert r.rc == 0 and r.data == {"jax_llar_imported": False}, r.tail
  want = np.asarray(jax.jit(jax.shard_map(lambda v: lax.psum(v, "x"), mesh=mesh,
                                          in_specs=P("x"), out_specs=P()))(xs))
  _equal(np.load(tmp_path / "out.npy"), want, mesh.size)


def test_persistent_compilation_cache_with_the_fast_path(tmp_path):
  """The second process hits the first's cache entry and its fast-path call
  finds the communicator its own lowering created."""
  runs = [run_program("cache_child", str(tmp_path / "cache"), str(seed))
          for seed in (1, 2)]
  for r in runs:
    assert r.rc == 0 and r.data is not None, r.tail
  assert [r.data["hit"] for r in runs] == [False, True]
  assert all(r.data["fast"] == [True] and r.data["correct"] for r in runs), runs


def test_profile_trace_names_the_calls(tmp_path):
  out = tmp_path / "found.json"
  p = subprocess.run([sys.executable, str(ROOT / "examples" / "profile_trace.py"),
                      "--out", str(tmp_path / "trace"), "--calls", "3",
                      "--json", str(out)], capture_output=True, text=True, timeout=300)
  assert p.returncode == 0, p.stderr[-3000:]
  found = json.loads(out.read_text())
  n = found["devices"]
  assert all(d["fast"] for d in found["decisions"]), found["decisions"]
  for nbytes in (1024, 16384):
    assert any(f"jax_llar.one_shot_ll.bf16.{nbytes}B.{n}ranks" in name
               for name in found["op_names"]), found["op_names"]
  assert any("OneShotLL" in k and f", {n}," in k for k in found["kernels"]), found["kernels"]
