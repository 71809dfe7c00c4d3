"""jax_llar.psum and the swaps behave like lax.psum for JAX's own tools.

The jaxpr keeps JAX's psum primitives, so checkify, the roofline estimate,
jax.export and the persistent compilation cache see what they see for
``lax.psum``. Each test runs the same program with ``lax.psum`` and with
jax_llar and compares.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.experimental import checkify, roofline
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P

import jax_llar

from cpu_helpers import assert_bitwise, user_env

PSUMS = {"lax.psum": lax.psum, "jax_llar.psum": jax_llar.psum}


def _auto_mesh(shape, names):
  return jax.make_mesh(shape, names, axis_types=(AxisType.Auto,) * len(names))


@pytest.mark.parametrize("check_vma", [True, False])
def test_checkify_nan_check_sees_the_psum(check_vma):
  """inf + -inf summed over two ranks is NaN: checkify's nan_checks reports
  it for jax_llar.psum exactly as for lax.psum (JAX checks the psum of
  check_vma=False; the invariant psum of check_vma=True it does not)."""
  mesh = _auto_mesh((2,), ("x",))
  x = jax.device_put(jnp.array([jnp.inf, -jnp.inf], jnp.float32),
                     NamedSharding(mesh, P("x")))
  results = {}
  for name, fn in PSUMS.items():
    g = jax.shard_map(lambda v, fn=fn: fn(v, "x"), mesh=mesh, in_specs=P("x"),
                      out_specs=P(), check_vma=check_vma)
    err, out = checkify.checkify(jax.jit(g), errors=checkify.nan_checks)(x)
    results[name] = (err.get(), np.asarray(out))
  lax_err, lax_out = results["lax.psum"]
  llar_err, llar_out = results["jax_llar.psum"]
  if not check_vma:
    assert lax_err is not None and "nan" in lax_err.lower()
  assert llar_err == lax_err
  assert_bitwise(llar_out, lax_out)


def test_roofline_counts_the_communication_bytes():
  """A matmul then a psum over a 2 x 2 mesh: the roofline's ICI bytes and
  latency are JAX's numbers for both."""
  mesh = _auto_mesh((2, 2), ("x", "y"))
  a = jax.ShapeDtypeStruct((4, 4), jnp.float32,
                           sharding=NamedSharding(mesh, P("x", "y")))
  b = jax.ShapeDtypeStruct((4, 4), jnp.float32,
                           sharding=NamedSharding(mesh, P("y", None)))
  results = {}
  for name, fn in PSUMS.items():
    _, results[name] = roofline.roofline(
        lambda a, b, fn=fn: fn(a @ b, "y"), mesh=mesh,
        in_specs=(P("x", "y"), P("y", None)), out_specs=P("x", None))(a, b)
  assert results["lax.psum"].ici_bytes == {"y": 32}
  assert results["jax_llar.psum"] == results["lax.psum"]


def test_roofline_under_the_swap():
  mesh = _auto_mesh((2, 2), ("x", "y"))
  a = jax.ShapeDtypeStruct((4, 4), jnp.float32,
                           sharding=NamedSharding(mesh, P("x", "y")))
  f = roofline.roofline(lambda a: lax.pmean(a, "y"), mesh=mesh,
                        in_specs=P("x", "y"), out_specs=P("x", None))
  want = f(a)[1]
  with jax_llar.swap_psum():
    got = f(a)[1]
  assert got == want and got.ici_bytes


_EXPORT_RUNNER = textwrap.dedent("""
    import sys
    import jax, numpy as np
    from jax import export
    with open(sys.argv[1], "rb") as f:
      exp = export.deserialize(bytearray(f.read()))
    x = np.load(sys.argv[2])
    mesh = jax.make_mesh((2,), ("x",))
    out = exp.call(jax.device_put(x, jax.sharding.NamedSharding(
        mesh, jax.sharding.PartitionSpec("x"))))
    np.save(sys.argv[3], np.asarray(out))
    print("jax_llar" in sys.modules)
""")


def test_exported_program_runs_in_a_fresh_process(tmp_path):
  """jax.export gets JAX's lowering (reason "export"), so the serialized
  program needs nothing of this process: a fresh process that never imports
  jax_llar runs it and gets lax.psum's answer."""
  mesh = jax.make_mesh((2,), ("x",))
  rng = np.random.default_rng(0)
  x = rng.standard_normal((2, 64)).astype(np.float32)
  xs = jax.device_put(x, NamedSharding(mesh, P("x")))
  f = jax.jit(jax.shard_map(lambda v: jax_llar.psum(v, "x"), mesh=mesh,
                            in_specs=P("x"), out_specs=P()))
  want = np.asarray(jax.jit(jax.shard_map(lambda v: lax.psum(v, "x"), mesh=mesh,
                                          in_specs=P("x"), out_specs=P()))(xs))
  exp = jax.export.export(f, platforms=("cpu", "cuda"))(xs)
  text = exp.mlir_module()
  assert "jax_llar_all_reduce" not in text and "all_reduce" in text
  assert {d.reason for d in jax_llar.dispatch_log()} == {"export"}
  cpu_exp = jax.export.export(f, platforms=("cpu",))(xs)
  (tmp_path / "f.bin").write_bytes(cpu_exp.serialize())
  np.save(tmp_path / "x.npy", x)
  env = dict(user_env(), JAX_PLATFORMS="cpu",
             XLA_FLAGS="--xla_force_host_platform_device_count=2")
  p = subprocess.run([sys.executable, "-c", _EXPORT_RUNNER, str(tmp_path / "f.bin"),
                      str(tmp_path / "x.npy"), str(tmp_path / "out.npy")],
                     env=env, capture_output=True, text=True, cwd=tmp_path)
  assert p.returncode == 0, p.stderr
  assert p.stdout.strip() == "False"  # the runner never imported jax_llar
  assert_bitwise(np.load(tmp_path / "out.npy"), want)


_CACHE_CHILD = textwrap.dedent("""
    import json, logging, sys
    import jax, numpy as np
    jax.config.update("jax_compilation_cache_dir", sys.argv[1])
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    import jax_llar
    from jax._src import compilation_cache as cc
    hits = []
    logging.getLogger("jax._src.compiler").addFilter(
        lambda r: hits.append(r.getMessage()) or True)
    logging.getLogger("jax._src.compiler").setLevel(logging.DEBUG)
    mesh = jax.make_mesh((2,), ("x",))
    x = jax.device_put(np.arange(8, dtype=np.float32),
                       jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("x")))
    with jax_llar.swap_psum():
      f = jax.jit(jax.shard_map(lambda v: jax.lax.psum(v, "x") * 2, mesh=mesh,
                                in_specs=jax.sharding.PartitionSpec("x"),
                                out_specs=jax.sharding.PartitionSpec()))
      out = np.asarray(f(x))
    print(json.dumps({"out": out.tolist(),
                      "hit": any("cache hit" in m.lower() for m in hits),
                      "decisions": [d.reason for d in jax_llar.dispatch_log()]}))
""")


def test_persistent_compilation_cache_across_processes(tmp_path):
  """Two processes compile the same swapped program with a persistent cache:
  the second hits the first's entry, and both give the right answer (on CPU
  the decision is "platform"; tests/gpu has the fast-path version)."""
  import json  # pylint: disable=g-import-not-at-top
  env = dict(user_env(), JAX_PLATFORMS="cpu",
             XLA_FLAGS="--xla_force_host_platform_device_count=2")
  runs = []
  for _ in range(2):
    p = subprocess.run([sys.executable, "-c", _CACHE_CHILD, str(tmp_path / "cache")],
                       env=env, capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    runs.append(json.loads(p.stdout.strip().splitlines()[-1]))
  want = (np.arange(8, dtype=np.float32).reshape(2, 4).sum(0) * 2).tolist()
  assert [r["out"] for r in runs] == [want, want]
  assert [r["hit"] for r in runs] == [False, True]
  assert runs[0]["decisions"] == runs[1]["decisions"] == ["platform"]
  assert os.listdir(tmp_path / "cache")


@pytest.mark.parametrize("which", ["jax_llar.psum", "fused", "install"])
def test_shape_polymorphic_export(which):
  """jax.export with a symbolic dimension: every requested psum (and the
  fused op) lowers as JAX's, reason "symbolic_shape"."""
  mesh = jax.make_mesh((2,), ("x",))
  fns = {
      "jax_llar.psum": lambda v: jax_llar.psum(v, "x"),
      "fused": lambda v: jax_llar.psum_add_rms_norm(v, v, jnp.ones((8,), v.dtype), "x")[0],
      "install": lambda v: lax.psum(v, "x"),
  }
  f = jax.jit(jax.shard_map(fns[which], mesh=mesh, in_specs=P("x"), out_specs=P(None),
                            check_vma=False))
  (b,) = jax.export.symbolic_shape("2*b")
  spec = jax.ShapeDtypeStruct((b, 8), jnp.float32, sharding=NamedSharding(mesh, P("x")))
  if which == "install":
    jax_llar.install()
  try:
    exp = jax.export.export(f, platforms=("cpu", "cuda"))(spec)
  finally:
    jax_llar.uninstall()
  assert "jax_llar_all_reduce" not in exp.mlir_module()
  assert {d.reason for d in jax_llar.dispatch_log()} == {"symbolic_shape"}
