"""The loop-level bench on CPU, as a user runs it: it exits 0, every row is
correct, every structure and impl is present, the file has the shape of
benchmarks/METHOD.md plus ``structure`` and ``xla_flags``; and every XLA flag
set of --loop_flags is one the installed jaxlib accepts."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from cpu_helpers import user_env
from jax_llar import testing
from jax_llar.tools.bench import jax_level as jax_level
from jax_llar.tools.bench import loop_level as loop_level



def test_cpu_loop_level_bench_exits_0_with_every_row_correct(tmp_path):
  cmd = [sys.executable, "-m", "jax_llar.tools.bench", "--level=loop",
         "--sizes=256", "--dtypes=bf16,f32", "--k_short=8", "--k_long=16",
         "--calls=4", "--rounds=2", f"--out={tmp_path}"]
  p = subprocess.run(cmd, env=user_env(), capture_output=True, text=True, timeout=300)
  assert p.returncode == 0, (p.stdout + p.stderr)[-3000:]
  assert "Traceback" not in p.stderr, p.stderr[-3000:]
  files = list(tmp_path.glob("*-loop.json"))
  assert len(files) == 1, list(tmp_path.iterdir())
  assert str(files[0]) in p.stdout
  result = json.loads(files[0].read_text())
  assert result["level"] == "loop"
  assert set(result["env"]) >= {"jax", "jaxlib", "devices", "xla_flags", "git_commit",
                                "date"}
  rows = result["rows"]
  assert {(r["structure"], r["impl"], r["dtype"], r["bytes_per_rank"]) for r in rows} == {
      (s, i, d, 256) for s in loop_level.STRUCTURES for i in loop_level.IMPLS
      for d in ("bfloat16", "float32")}
  for r in rows:
    for key in ("impl", "world_size", "dtype", "bytes_per_rank", "us_per_call",
                "correct", "structure", "xla_flags", "ratio_to_chain", "reference"):
      assert key in r, (key, r)
    assert r["correct"] is True, r
    assert r["reference"] in r["references_tried"], r
    assert r["world_size"] == 2 and r["flag_set"] == "default"
    assert isinstance(r["xla_flags"], str)
    if r["impl"].startswith("llar."):
      assert r["fast_path"] is False and r["reference"] == jax_level.LAX_PSUM, r
    if r["structure"] == "chain" and r["impl"] != "none" and r["us_per_call"] > 0:
      assert r["ratio_to_chain"] == pytest.approx(1.0)
  # The table comes last, one block per dtype and size.
  tail = p.stdout[p.stdout.index("us per step (ratio to chain)"):]
  for s in loop_level.STRUCTURES:
    assert f"\n{s} " in tail
  assert (tmp_path / files[0].name.replace(".json", ".png")).exists() or \
      "matplotlib is not installed" in p.stderr


def test_cpu_loop_level_at_four_ranks_checks_lax_psum_by_its_own_sums(tmp_path):
  """Issue 23: above two ranks lax.psum's rows are checked against JAX's own
  one-step sums (its promise), jax_llar's against the lax.psum program; the
  run exits 0 with every row correct. The bench forces --world CPU devices."""
  cmd = [sys.executable, "-m", "jax_llar.tools.bench", "--level=loop", "--world=4",
         "--sizes=256", "--dtypes=bf16,f32", "--structures=chain,scan_unroll8,jit_step",
         "--impls=lax.psum,llar.auto", "--k_short=8", "--k_long=16", "--calls=2",
         "--rounds=1", f"--out={tmp_path}"]
  p = subprocess.run(cmd, env=user_env(), capture_output=True, text=True, timeout=300)
  assert p.returncode == 0, (p.stdout + p.stderr)[-3000:]
  (path,) = tmp_path.glob("*-loop.json")
  rows = json.loads(path.read_text())["rows"]
  assert len(rows) == 3 * 2 * 2
  for r in rows:
    assert r["world_size"] == 4 and r["correct"] is True, r
    if r["impl"] == "lax.psum":
      assert r["reference"].startswith("psum_"), r
    else:
      assert r["reference"] == jax_level.LAX_PSUM, r


@pytest.mark.parametrize("structure", loop_level.STRUCTURES)
def test_every_structure_does_k_steps(structure):
  """In process: each structure's 16-step program matches the rounded model
  of 16 steps on lax.psum and on the copy (whose state decays, so that 8
  steps would give another result)."""
  import jax
  from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
  dt = jax_level.DTYPES["f32"]
  mesh = Mesh(np.array(jax.devices()[:2]), ("x",))
  rng = np.random.default_rng(5)
  inputs = [testing.random_array(rng, (64,), dt) for _ in range(2)]
  host = np.concatenate(inputs)
  sharding = NamedSharding(mesh, P("x"))
  for impl in ("lax.psum", "ffi.copy"):
    out = np.asarray(loop_level.program(structure, impl, mesh, 16, dt)(
        jax.device_put(host, sharding))).reshape(2, 64)

    def ok(k, impl=impl, out=out):
      e = loop_level.expected(impl, structure, inputs, k, dt, "rounded")
      return all(testing.bitwise_equal(out[r], e[r]) for r in range(2))

    assert ok(16), impl
    if impl == "ffi.copy":
      assert not ok(8)


def test_per_trip_excess_model_rounds_at_trip_boundaries():
  dt = jax_level.DTYPES["bf16"]
  rng = np.random.default_rng(1)
  inputs = [testing.random_array(rng, (256,), dt) for _ in range(2)]
  whole = loop_level.expected("none", "chain", inputs, 16, dt, jax_level.EXCESS_F32)
  per8 = loop_level.expected("none", "fori_k8", inputs, 16, dt, loop_level.EXCESS_PER_TRIP)
  two8 = loop_level.expected("none", "chain", loop_level.expected(
      "none", "chain", inputs, 8, dt, jax_level.EXCESS_F32), 8, dt, jax_level.EXCESS_F32)
  assert all(testing.bitwise_equal(a, b) for a, b in zip(per8, two8))
  assert not all(testing.bitwise_equal(a, b) for a, b in zip(per8, whole))
  assert loop_level.references_for("llar.auto", "fori", "gpu", True) == ("rounded",)
  assert loop_level.references_for("none", "scan", "gpu", None) == (
      "rounded", "excess_f32", loop_level.EXCESS_PER_TRIP)
  assert loop_level.references_for("ffi.copy", "scan", "gpu", None) == ("rounded",)
  assert loop_level.references_for("lax.psum", "scan", "cpu", None) == (
      "psum_rounded", "psum_excess_f32", loop_level.PSUM_EXCESS_PER_TRIP)
  assert loop_level.references_for("lax.psum", "chain", "gpu", None) == (
      "psum_rounded", "psum_excess_f32")


def test_every_flag_set_is_accepted_by_jaxlib():
  """XLA parses XLA_FLAGS when the backend starts and exits on an unknown
  flag or value: each set must start a CPU backend and run a computation."""
  program = "import jax, jax.numpy as jnp; print(float(jax.jit(lambda v: v * 2)(jnp.ones(()))))"
  for name, flags in loop_level.FLAG_SETS:
    env = dict(user_env(), JAX_PLATFORMS="cpu", XLA_FLAGS=flags)
    p = subprocess.run([sys.executable, "-c", program], env=env, capture_output=True,
                       text=True, timeout=120)
    assert p.returncode == 0 and p.stdout.strip() == "2.0", (name, p.stderr[-2000:])
  env = dict(user_env(), JAX_PLATFORMS="cpu",
             XLA_FLAGS="--xla_gpu_enable_command_buffer=+NOT_A_COMMAND")
  p = subprocess.run([sys.executable, "-c", program], env=env, capture_output=True,
                     text=True, timeout=120)
  assert p.returncode != 0  # the check above can fail


def test_loop_help_names_the_level_and_flag_sets():
  p = subprocess.run([sys.executable, "-m", "jax_llar.tools.bench", "--help"],
                     capture_output=True, text=True, timeout=120)
  text = p.stdout + p.stderr
  assert "--level loop" in text and "--[no]loop_flags" in text
  for name, _ in loop_level.FLAG_SETS:
    assert name in text


def test_explain_agrees_with_the_structures():
  """jax_llar.explain flags the structures that keep one all-reduce per trip
  and none of those that do 8 steps per trip or none in a loop."""
  import jax
  import jax_llar
  from jax.sharding import Mesh
  mesh = Mesh(np.array(jax.devices()[:2]), ("x",))
  x = jax.ShapeDtypeStruct((128,), np.float32)
  flagged = {s for s in loop_level.STRUCTURES
             if jax_llar.explain(loop_level.program(s, "llar.auto", mesh, 16, np.float32), x)}
  assert flagged == {"scan", "fori", "while", "while_psum_pred"}
