"""The JAX-level bench on CPU, as a new user runs it: it exits 0 with every
row correct, float32 and bfloat16 (issue 15), and each row says which
reference it matched."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from cpu_helpers import user_env
from jax_llar import testing
from jax_llar.tools import jax_level



def test_cpu_jax_level_bench_exits_0_with_every_row_correct(tmp_path):
  cmd = [sys.executable, "-m", "jax_llar.tools.bench", "--level=jax",
         "--sizes=64,1024", "--dtypes=f32,bf16", "--k_short=2", "--k_long=10",
         "--calls=4", "--rounds=2", f"--out={tmp_path}"]
  p = subprocess.run(cmd, env=user_env(), capture_output=True, text=True, timeout=300)
  assert p.returncode == 0, (p.stdout + p.stderr)[-3000:]
  assert "Traceback" not in p.stderr, p.stderr[-3000:]
  files = list(tmp_path.glob("*-jax.json"))
  assert len(files) == 1, list(tmp_path.iterdir())
  assert str(files[0]) in p.stdout  # it says where the file went
  result = json.loads(files[0].read_text())
  rows = result["rows"]
  assert result["level"] == "jax"
  assert {(r["impl"], r["dtype"], r["bytes_per_rank"]) for r in rows} == {
      (i, d, b) for i in jax_level.IMPLS for d in ("float32", "bfloat16")
      for b in (64, 1024)}
  for r in rows:
    assert r["correct"] is True, r
    assert r["reference"] in r["references_tried"], r
    assert r["world_size"] == 2
  for r in rows:
    if r["impl"].startswith("llar."):
      # On CPU jax_llar falls back: its contract is lax.psum's output.
      assert r["fast_path"] is False and r["reference"] == jax_level.LAX_PSUM, r


@pytest.mark.parametrize("impl", ["lax.psum", "ffi.copy"])
@pytest.mark.parametrize("dtype", ["f32", "bf16", "f16"])
def test_cpu_chain_matches_one_of_its_references(impl, dtype):
  """In process, on the suite's host devices: a 12-step chain's output is
  bitwise one of the references its row may match."""
  import jax
  from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
  dt = jax_level.DTYPES[dtype]
  mesh = Mesh(np.array(jax.devices()[:2]), ("x",))
  rng = np.random.default_rng(3)
  inputs = [testing.random_array(rng, (96,), dt) for _ in range(2)]
  x = jax.device_put(np.concatenate(inputs), NamedSharding(mesh, P("x")))
  out = np.asarray(jax_level.chain(impl, mesh, 12, dt)(x)).reshape(2, 96)
  refs = jax_level.references_for(impl, "cpu", None)
  assert jax_level.check(impl, out, inputs, 12, dt, refs) is not None


def test_excess_model_differs_from_rounded_and_is_none_for_f32():
  dt = jax_level.DTYPES["bf16"]
  rng = np.random.default_rng(0)
  inputs = [testing.random_array(rng, (256,), dt) for _ in range(2)]
  rounded = jax_level.simulate("lax.psum", inputs, 8, dt, jax_level.ROUNDED)
  excess = jax_level.simulate("lax.psum", inputs, 8, dt, jax_level.EXCESS_F32)
  assert not all(testing.bitwise_equal(a, b) for a, b in zip(rounded, excess))
  f32 = jax_level.DTYPES["f32"]
  assert jax_level.simulate("lax.psum", [i.astype(f32) for i in inputs], 8, f32,
                            jax_level.EXCESS_F32) is None


def test_references_per_impl():
  assert jax_level.references_for("llar.one_shot_ll", "gpu", True) == ("rounded",)
  assert jax_level.references_for("llar.one_shot_ll", "cpu", False) == ("lax.psum",)
  assert jax_level.references_for("ffi.copy", "gpu", None) == ("rounded",)
  assert jax_level.references_for("lax.psum", "gpu", None) == ("rounded", "excess_f32")


def test_progress_lines_estimate_the_time_left(capsys):
  """Issue 14, item 4: the long tools print "[done/total] ... elapsed, about
  ... left" (jax_llar.tools.progress), on stdout with their rows."""
  import time
  from jax_llar.tools.progress import Progress, duration
  p = Progress(4, "bench")
  assert "?" in p.line()  # nothing done: no estimate yet
  time.sleep(0.05)
  line = p.step("f32 64 B")
  assert line.startswith("bench [1/4] f32 64 B: 0m00s elapsed, about 0m00s left")
  assert capsys.readouterr().out.strip() == line
  p.step(n=10)  # clipped to the total
  assert p.done == 4 and p.left_s() == 0
  assert (duration(7), duration(185), duration(3725)) == ("0m07s", "3m05s", "1h02m")
