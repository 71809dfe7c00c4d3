"""The decode step's matrix-vector products as a chain of Pallas Mosaic GPU
kernels that may overlap through programmatic dependent launch (PDL): an
experiment of issue 27, measured in benchmarks/NOTES.md entry 77 (not a step
form: `chain_bench.py` runs it against XLA's reduction form).

Chain form: ``matvec_mgpu_chain(xt, w)`` is y^T = xt @ w.T for xt (8, K) and
w (N, K) bfloat16 (w stored contracting-minor, as ``model`` keeps it), giving
(8, N) bfloat16 in xt's layout, so that one call's output is the next call's
input (N_i = K_{i+1}) with no XLA op between two kernels. xt holds up to 8
rows x (the batch) and any rows after them (row m of the output depends only
on row m of xt: zero rows stay zero). Float32 sums of exact bfloat16 products
on the tensor cores, one bfloat16 rounding at the end.

Method: program r of the grid owns R output columns (R = rows_per_block, a
multiple of 8 up to 256) and streams its (R, K) block of w through a ring of
`stages` shared-memory slots with TMA, `tile_k` columns a step; each step is
one ``plgpu.wgmma`` (M = 64, N = R) with A the 64-row window starting at the
slot (the slot's 8 rows of x first: rows 8..63 of A only feed accumulator rows
that are never read, so A needs no zero rows) and B the w tile transposed.
Rows 0..7 of the (64, R) float32 accumulator are written out.

PDL (CUDA's programmatic dependent launch, ``griddepcontrol``; Pallas Mosaic
GPU's ``plgpu.griddepcontrol_wait`` / ``griddepcontrol_launch_dependents``):
w does not depend on the kernel before this one and x does, so with pdl the
program issues its first `stages` w loads, then waits for the previous grid
(``griddepcontrol_wait``), then loads x; ``griddepcontrol_launch_dependents``
comes after the program's last w load (or, with pdl="early", before the wait)
so that the next kernel may start its own weight loads while this one drains.
Mosaic GPU's interpreter has no rule for griddepcontrol: interpret mode runs
without it (``check_chain`` runs the chain on CPU against float64).
"""

from __future__ import annotations

import functools

import jax
from jax import lax
import jax.numpy as jnp
from jax._src import config as _jax_config
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu
import numpy as np

NUM_SMS = 132  # H200
_B = 8  # rows of xt: the batch, padded


def _interpreting() -> bool:
  """True under plgpu.force_gpu_interpret_mode / set_gpu_interpret_mode."""
  return _jax_config.pallas_tpu_interpret_mode_context_manager.value is not None


def _chain_kernel(x_gmem, w_gmem, out_gmem, buf, out_smem, bars, *,
                  rows, tile_k, stages, steps, pdl):
  # buf holds the ring: slot j is rows [j * S, (j + 1) * S), S = 8 + rows,
  # with the (8, tile_k) x tile in its first 8 rows and the (rows, tile_k)
  # w tile after it. wgmma's A operand for slot j is the (64, tile_k) window
  # starting at the slot: its rows 0..7 are the x tile; rows 8..63 are whatever
  # follows (this slot's w tile, the next slot, padding), which only feeds
  # rows 8..63 of the accumulator, never read. So A needs no zero rows and
  # costs no SMEM beyond x's own 8 rows.
  span = _B + rows
  r = lax.axis_index("rows")
  row_sl = pl.ds(r * rows, rows)
  cols = lambda i: pl.ds(i * tile_k, tile_k)
  x_slot = lambda j: buf.at[pl.ds(j * span, _B)]
  w_slot = lambda j: buf.at[pl.ds(j * span + _B, rows)]
  a_slot = lambda j: buf.at[pl.ds(j * span, 64)]

  def load_w(i, j):
    plgpu.copy_gmem_to_smem(w_gmem.at[row_sl, cols(i)], w_slot(j), bars.at[j])

  def load_x(i, j):
    plgpu.copy_gmem_to_smem(x_gmem.at[:, cols(i)], x_slot(j), bars.at[j])

  first = min(stages, steps)
  early = pdl == "early"
  for i in range(first):  # weights first: they do not depend on the last kernel
    load_w(i, i)
  if pdl:
    if steps <= stages or early:
      plgpu.griddepcontrol_launch_dependents()
    plgpu.griddepcontrol_wait()  # x is the previous kernel's output
  for i in range(first):
    load_x(i, i)

  def step(acc, i, j):
    """Step i (traced or static) on static slot j = i % stages."""
    plgpu.barrier_wait(bars.at[j])  # w and x tile of step i landed
    # acc (64, rows) += A (64, tile_k) @ w_tile^T (tile_k, rows).
    plgpu.wgmma(acc, a_slot(j), w_slot(j).transpose((1, 0)))
    plgpu.wgmma_wait(0)  # slot free again

    def refill():
      load_w(i + stages, j)
      if pdl and not early and steps > stages:
        if isinstance(i, int):
          if i + stages == steps - 1:
            plgpu.griddepcontrol_launch_dependents()
        else:
          pl.when(i + stages == steps - 1)(
              plgpu.griddepcontrol_launch_dependents)
      load_x(i + stages, j)

    if isinstance(i, int):
      if i + stages < steps:
        refill()
    else:
      pl.when(i + stages < steps)(refill)

  def body(acc):
    groups = steps // stages
    if groups:
      @pl.loop(0, groups)
      def _group(g):
        for j in range(stages):  # unrolled, so every slot offset is static
          step(acc, g * stages + j, j)
    for j in range(steps % stages):
      step(acc, groups * stages + j, j)
    out_smem[...] = acc[...].astype(out_smem.dtype)

  pl.run_scoped(body, plgpu.ACC((64, rows), jnp.float32))
  plgpu.commit_smem()
  plgpu.copy_smem_to_gmem(out_smem.at[pl.ds(0, _B)],
                          out_gmem.at[:, pl.ds(r * rows, rows)])
  plgpu.wait_smem_to_gmem(0)


def chain_rows(n: int) -> int:
  """Default rows_per_block of matvec_mgpu_chain: the largest multiple of 8
  (<= 256) dividing N that still gives >= NUM_SMS - 8 programs (all SMs
  busy, one program each), else 8 (untuned)."""
  best = 8
  for r in range(8, 257, 8):
    if n % r == 0 and n // r >= NUM_SMS - 8:
      best = r
  return best


def chain_smem_bytes(rows: int, tile_k: int, stages: int) -> int:
  """Shared memory of one matvec_mgpu_chain program, bytes: the ring (each
  slot 8 + rows rows of tile_k bfloat16, at least 64 rows from the last
  slot's start) and the (64, rows) bfloat16 output tile."""
  span = _B + rows
  ring = max(stages * span, (stages - 1) * span + 64) * tile_k * 2
  return ring + 64 * rows * 2


@functools.partial(jax.jit, static_argnames=(
    "rows_per_block", "tile_k", "stages", "pdl"))
def matvec_mgpu_chain(xt, w, *, rows_per_block=None, tile_k=128, stages=4,
                      pdl=True):
  """y^T = xt @ w.T: (8, N) bfloat16 from xt (8, K) and w (N, K) bfloat16.

  The output has xt's layout, so it feeds the next product directly (module
  docstring: method, PDL).

  Args:
    xt: (8, K) bfloat16, rows 0..M-1 the input rows (the rest zero or unused).
    w: (N, K) bfloat16, contracting-minor.
    rows_per_block: R, output columns a program (a multiple of 8, at most 256,
      dividing N); None: `chain_rows(N)`.
    tile_k: columns a pipeline step (a multiple of 64, at most 256, dividing K).
    stages: ring slots, the w and x tiles a program has in flight; shared
      memory a program is `chain_smem_bytes(R, tile_k, stages)` bytes.
    pdl: False, True (w loads before ``griddepcontrol_wait``,
      ``griddepcontrol_launch_dependents`` after the last w load) or "early"
      (launch_dependents before the wait); off in interpret mode.

  Returns:
    (8, N) bfloat16.

  Raises:
    ValueError: operands that are not (8, K) and (N, K) bfloat16, a tile
      that does not divide them, stages below 1 or an unknown pdl.

  Example (two products, the first one's output the second one's input)::

    xt = jnp.zeros((8, k), jnp.bfloat16).at[0].set(x)
    yt = matvec_mgpu_chain(matvec_mgpu_chain(xt, w1), w2)   # w1 (k2, k), w2 (n, k2)
  """
  (b, k), (n, k2) = xt.shape, w.shape
  if (k != k2 or b != _B or xt.dtype != jnp.bfloat16
      or w.dtype != jnp.bfloat16):
    raise ValueError(f"bad operands {xt.shape} {xt.dtype}, {w.shape} {w.dtype}")
  if pdl not in (True, False, "early"):
    raise ValueError(f"pdl={pdl!r}: True, False or 'early'")
  rows = chain_rows(n) if rows_per_block is None else rows_per_block
  if rows < 8 or rows % 8 or rows > 256 or n % rows:
    raise ValueError(f"rows_per_block={rows} must be a multiple of 8, at most 256, "
                     f"dividing {n=}")
  if tile_k < 64 or tile_k % 64 or tile_k > 256 or k % tile_k:
    raise ValueError(f"{tile_k=} must be a multiple of 64, at most 256, dividing {k=}")
  if stages < 1:
    raise ValueError(f"{stages=} must be at least 1")
  steps = k // tile_k
  stages = min(stages, steps)
  span = _B + rows
  ring_rows = max(stages * span, (stages - 1) * span + 64)
  kernel = plgpu.kernel(
      functools.partial(_chain_kernel, rows=rows, tile_k=tile_k,
                        stages=stages, steps=steps,
                        pdl=False if _interpreting() else pdl),
      out_type=jax.ShapeDtypeStruct((_B, n), jnp.bfloat16),
      grid=(n // rows,),
      grid_names=("rows",),
      scratch_types=(
          plgpu.SMEM((ring_rows, tile_k), jnp.bfloat16, transforms=(
              plgpu.TilingTransform((8, 64)), plgpu.SwizzleTransform(128))),
          plgpu.SMEM((64, rows), jnp.bfloat16),
          plgpu.Barrier(num_arrivals=2, num_barriers=stages),
      ),
  )
  return kernel(xt, w)


CHAINS = (((256, 512), (768, 256), (512, 768)),
          ((256, 1280), (1280, 256), (512, 1280)))  # K / 128 = 10: ring remainder


def check_chain(chains=CHAINS, m=1, **kw):
  """Runs each chain of products (N_i, K_i), N_i = K_{i+1}, through
  matvec_mgpu_chain in interpret mode on CPU, output of one call fed straight
  into the next; the reference is numpy float64 with bfloat16 rounding after
  each product. Returns max |error| / max |reference| of the last output per chain
  (rows >= m must stay exactly zero)."""
  rng = np.random.default_rng(0)
  errs = {}
  for dims in chains:
    x = np.zeros((_B, dims[0][1]))
    x[:m] = rng.standard_normal((m, dims[0][1]))
    xt = jnp.asarray(x, jnp.bfloat16)
    ref = np.asarray(xt, np.float64)
    for n, k in dims:
      w = jnp.asarray(rng.standard_normal((n, k)) / np.sqrt(k), jnp.bfloat16)
      with plgpu.force_gpu_interpret_mode(plgpu.InterpretGPUParams()):
        xt = matvec_mgpu_chain(xt, w, **kw)
      ref = np.asarray(jnp.asarray(ref @ np.asarray(w, np.float64).T,
                                   jnp.bfloat16), np.float64)
    y = np.asarray(xt, np.float64)
    assert y.shape == ref.shape, (y.shape, ref.shape)
    assert not np.any(y[m:]), "padding rows must stay zero"
    errs[dims] = float(np.abs(y - ref).max() / np.abs(ref).max())
  return errs


if __name__ == "__main__":
  for m, kw in ((1, {}), (3, dict(rows_per_block=16, stages=3)),
                (8, dict(rows_per_block=8, tile_k=64, stages=3)),
                (2, dict(rows_per_block=64, tile_k=256, stages=2))):
    for dims, err in check_chain(m=m, **kw).items():
      print(f"chain {dims} M={m} {kw}: max rel error {err:.2e}")
      assert err < 2e-2, err
