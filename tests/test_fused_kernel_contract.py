"""The fused kernel's contract on CPU: its grid rule (the C++ rule of the
built extension against the Python mirror in fused_helpers), and the host
emulation that the one-GPU loopback check compares the kernel with, against
jax_llar.fused.reference run by XLA on CPU devices."""

from __future__ import annotations

import itertools

import jax
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P

from jax_llar import fused

import fused_helpers as fh
from cpu_helpers import mesh_of


def test_grid_rule_cases():
  g = fh.fused_grid
  assert g(1, 4096, 2) == (8, 8, 128, 128)      # decode, bf16 hidden 4096
  assert g(1, 2048, 2) == (8, 8, 64, 64)
  assert g(1, 64, 2) == (1, 1, 16, 32)          # one block, one warp
  assert g(1, 64, 4) == (1, 1, 32, 32)
  assert g(1, 96, 2) == (1, 1, 24, 32)          # 24 lines: fewer than 64, one block
  assert g(1, 640, 2) == (2, 2, 80, 96)         # ceil(160 / 64) = 3 -> 2 blocks
  assert g(8, 4096, 2) == (64, 8, 128, 128)
  assert g(32, 4096, 2) == (64, 2, 512, 512)    # 256 KiB, 64 blocks
  assert g(32, 2048, 4) == (64, 2, 512, 512)
  assert g(1, 16384, 2) == (8, 8, 512, 512)     # the widest row: 32 KiB
  assert g(1, 16388, 2) is None                 # 4097 lines: no whole split <= 512
  assert g(32, 4096, 4) is None                 # 512 KiB: above the one-shot limit
  assert g(65, 64, 2) is None                   # more rows than blocks
  assert g(64, 64, 2) == (64, 1, 16, 32)
  assert g(1, 3, 2) is None                     # a row is not whole lines
  assert g(0, 64, 2) is None
  assert g(1, 64, 8) is None


def test_grid_rule_invariants():
  for rows, d, itemsize in itertools.product(range(1, 70, 3), range(4, 20000, 44), (2, 4)):
    grid = fh.fused_grid(rows, d, itemsize)
    if grid is None:
      continue
    blocks, cb, per_block, threads = grid
    assert cb in (1, 2, 4, 8) and blocks == rows * cb <= 64
    assert per_block * cb * 8 == d * itemsize and per_block <= 512
    assert threads % 32 == 0 and per_block <= threads < per_block + 32
    assert rows * d * itemsize <= fh.FUSED_MAX_BYTES


def test_grid_rule_matches_the_extension():
  import ctypes  # pylint: disable=g-import-not-at-top
  import importlib  # pylint: disable=g-import-not-at-top
  from jax_llar import _ext  # pylint: disable=g-import-not-at-top
  if not _ext.built():
    pytest.skip("the CUDA extension is not built here")
  path = _ext.nccl_library_path()
  if path is None:
    pytest.skip("no libnccl.so.2 to load the CUDA extension with (install the "
                "cuda13 extra)")
  ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
  ext = importlib.import_module("jax_llar._llar")
  assert ext.FUSED_MAX_BYTES == fh.FUSED_MAX_BYTES
  assert ext.FUSED_BLOCK_LINES == fh.FUSED_BLOCK_LINES
  assert ext.FUSED_MAX_CLUSTER_BLOCKS == fh.FUSED_MAX_CLUSTER_BLOCKS
  assert fh.TARGET in ext.registrations()
  cases = itertools.product(list(range(0, 70)) + [100, 1000],
                            [0, 1, 2, 3, 4, 8, 12, 48, 64, 96, 128, 640, 1000, 2048,
                             2880, 3584, 4096, 5120, 7168, 8192, 12288, 16384, 16388,
                             32768, 65536],
                            (1, 2, 4, 8))
  for rows, d, itemsize in cases:
    assert ext.add_rms_norm_grid(rows, d, itemsize) == fh.fused_grid(rows, d, itemsize), (
        rows, d, itemsize)


def test_served():
  assert fh.served((4096,), fh.BF16)
  assert fh.served((2, 3, 512), fh.F16, fh.F32)
  assert not fh.served((4, 4096), fh.BF16, fh.F16)   # weight: x's dtype or float32
  assert not fh.served((4, 4096), np.float64)
  assert not fh.served((), fh.F32)
  assert not fh.served((32, 4096), fh.F32)


def test_ulp_distance():
  one = np.float32(1)
  v = np.array([one, np.nextafter(one, np.float32(2)), -0.0, 0.0, np.nan], np.float32)
  w = np.array([one, one, 0.0, np.float32(1e-45), np.nan], np.float32)
  assert fh.ulp_distance(v, w).tolist() == [0, 1, 0, 1, 0]
  b = np.array([1.0, 1.0078125, -1.0], fh.BF16)   # 1 + 2^-7: one bf16 ulp
  c = np.array([1.0, 1.0, -1.0078125], fh.BF16)
  assert fh.ulp_distance(b, c).tolist() == [0, 1, 1]
  assert fh.ulp_distance(np.array([np.nan], np.float16),
                         np.array([1.0], np.float16))[0] > 1000


def _reference_on_cpu(mesh, x, residual, weight, eps):
  f = jax.jit(jax.shard_map(
      lambda x, r, w: fused.reference(x[0], r, w, "x", eps), mesh=mesh,
      in_specs=(P("x"), P(), P()), out_specs=(P(), P())))
  xs = jax.device_put(x, NamedSharding(mesh, P("x")))
  return [np.asarray(o) for o in f(xs, residual, weight)]


@pytest.mark.parametrize("dtype", fh.DTYPES, ids=str)
@pytest.mark.parametrize("rows,d", [(1, 64), (2, 2048), (3, 4096)])
@pytest.mark.parametrize("weight_f32", [False, True])
def test_emulation_matches_the_reference(dtype, rows, d, weight_f32):
  """Two ranks: XLA's CPU psum of two values is the rank-order sum, so
  new_residual must agree bitwise; normed within the GPU rule's ulps."""
  if weight_f32 and dtype == fh.F32:
    pytest.skip("float32 x has a float32 weight anyway")
  mesh = mesh_of((2,), ("x",))
  rng = np.random.default_rng(rows * d)
  x, residual, weight = fh.random_case(rng, 2, rows, d, dtype,
                                       fh.F32 if weight_f32 else None)
  eps = 1e-6
  want_normed, want_new_residual = _reference_on_cpu(mesh, x, residual, weight, eps)
  normed, new_residual = fh.emulate(list(x), residual, weight, eps, dtype)
  fh.check(normed, new_residual, want_normed, want_new_residual,
           fh.NORMED_MAX_ULP[np.dtype(dtype)], f"{np.dtype(dtype)} {rows}x{d}")


def test_loopback_fused_mode_cases_and_shapes():
  from jax_llar.tools.loopback import fused as lf  # pylint: disable=g-import-not-at-top
  assert lf.parse_shapes(["1x4096", "8X64"]) == ((1, 4096), (8, 64))
  for bad in ("4096", "1x2x3", "0x64", "ax64"):
    with pytest.raises(ValueError, match="ROWSxD|positive"):
      lf.parse_shapes([bad])
  cases = lf.cases([2, 4], ["float32", "bf16"], [(1, 64), (2, 128)], [0, 7])
  # float32 with its own weight; bf16 with a bf16 and a float32 weight.
  assert len(cases) == 2 * (1 + 2) * 2 * 2
  assert {(c.dtype, c.weight) for c in cases} == {("float32", "float32"), ("bf16", "bf16"),
                                                   ("bf16", "float32")}
  assert "serves float32" in lf.skip_reason(lf.Case(2, "int32", "int32", 1, 64))
  assert lf.skip_reason(lf.Case(2, "bfloat16", "bfloat16", 1, 64)) is None


def test_emulation_is_the_reference_formula():
  """emulate's new_residual is the rank-order psum rounded once, plus the
  residual in float32, rounded once; its normed follows the formula."""
  rng = np.random.default_rng(3)
  x, residual, weight = fh.random_case(rng, 3, 2, 256, fh.BF16)
  normed, new_residual = fh.emulate(list(x), residual, weight, 1e-6, fh.BF16)
  s = x.astype(np.float64).sum(axis=0).astype(np.float32).astype(fh.BF16)  # 3 bf16 values:
  # the float64 sum is exact, so rounding it once is the rank-order sum.
  want = (s.astype(np.float32) + residual.astype(np.float32)).astype(fh.BF16)
  assert fh.ulp_distance(new_residual, want).max() == 0
  h = want.astype(np.float64)
  ref = h / np.sqrt((h * h).mean(axis=-1, keepdims=True) + 1e-6) * weight.astype(np.float64)
  assert fh.ulp_distance(normed, ref.astype(np.float32).astype(fh.BF16)).max() <= 1
