"""The decode step's MLP (gate and up, SiLU, down) as one Pallas kernel of two
product phases: an experiment of issue 27 (benchmarks/NOTES.md entries 78,
81-84), and the step form ``model.Step(mlp="phases")``.

Every product kernel of the step pays a fixed cost over its bytes at the read
floor: its first weight bytes arrive a memory latency after it starts, and its
last programs run alone at its end (entries 76-78). Here the down product
joins the gate/up product's kernel as a second phase of programs, so that the
down product's programs start while the gate/up phase drains:

- One grid of M (n1 + n2) programs for M input rows, the M n1 phase-1
  programs first (a program's index is its
  place in the launch order; the GPU hands out a one-dimensional grid's
  programs in that order, which is what makes the wait below safe: every
  phase-1 program holds or has held a multiprocessor before any phase-2
  program waits, the assumption of decoupled look-back scans).
- Phase-1 program (i, j) forms rows [j r1, (j + 1) r1) of m = silu(gate
  x') * up x' for input row i as ``matvec.matvec(glu=True, round_first=True)``
  does (residual add, RMSNorm's factor), stores them to m (an output of the
  kernel), then, after a barrier of its threads, adds 1 to the call's
  counter (an atomic at GPU scope, acquire-release: the program's stores
  of m are released by it).
- FLAGS flags, each in a 128-byte line of its own (not the counter's),
  say that the count is complete. Without `relay`, the program whose atomic returns the last count
  sets them all (release atomics); with `relay`, no phase-1 program uses
  its atomic's result (so none waits for the round trip), and the first
  FLAGS phase-2 programs each poll the counter until it is complete, then
  set their flag.
- Phase-2 program q (input row q // (D / r2)) loads `pre_chunks` chunks of its (r2, F) block of
  W_down (registers, issued before it waits), polls flag q % FLAGS
  (volatile loads, then one acquiring atomic read), bounded by `spin_limit`
  polls, and forms its rows of y = W_down m.

The counter and flags live in `sync` (``sync_buffer``), a float32 array the
caller zeroes (one slot a call: `slot`) and threads through the program; the
kernel returns it. A wait that reaches its bound raises its slot's counter to
at least TIMEOUT_BIT (an atomic max) and goes on with whatever m holds, so
the output is wrong and the slot says so: `timeouts` counts such slots, and a
caller must check it. A slot that is not zero when the call starts is bad
input: without `relay` it is marked the same way (a count that passes its
total, or a flag already set); with `relay`, a flag already set is marked,
but a count that starts between zero and its total with no flag set is not
(the relays cannot tell it from progress).

The arithmetic is matvec.py's (float32 sums of bfloat16 products, m rounded
to bfloat16 between the phases), so y equals ``matvec.matvec(m, wd)`` with
the same tile to float32 summation order. On GPUs Pallas's Triton backend
compiles it; elsewhere Pallas's interpreter runs it (the programs one after
another in grid order, so a wait never waits there).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

import matvec  # this folder's: the gate/up rows as its glu kernel forms them

# A wait that reaches its bound marks its slot's counter with this bit.
TIMEOUT_BIT = 1 << 30
# Polls before a wait gives up: each poll is a load from L2 (a microsecond
# or less), so the bound is at most about 0.3 s, far above any phase's time.
SPIN_LIMIT = 1 << 18
# A slot of sync: FLAGS + 1 lines of 32 words (128 bytes). Word 0 is the
# counter; word 0 of line k + 1 is flag k, which the last phase-1 program (or
# relay k) sets; phase-2 program q polls flag q % FLAGS, so that the polls
# of a few hundred waiting programs spread over FLAGS lines (L2 slices)
# instead of one.
FLAGS = 32
LINE = 32
SLOT_WORDS = (FLAGS + 1) * LINE


def sync_buffer(slots: int) -> jax.Array:
  """A zeroed sync array of `slots` slots (float32, slots x SLOT_WORDS).

  float32, not int32: JAX 0.11.2's Triton lowering makes an atomic on a
  vector of int32 a float atomic (it tests the value's type for an integer,
  and a vector's type is a tensor's), and the last phase-1 program sets its
  flags with one vector atomic. Counts are exact in float32 up to 2^24."""
  return jnp.zeros((slots * SLOT_WORDS,), jnp.float32)


def tile(d: int, f: int) -> dict:
  """mlp_phases' tile keywords for an MLP of width F on D: 2 gate/up rows of
  2048 columns a program, 2 down rows of 512 columns, 4 warps, nothing held
  before the wait, the last program's signal (benchmarks/NOTES.md entries
  83-84: the fastest synchronised tile alone, within 0.6 us of the same tile
  with relays; entry 84's step measurement used relays), with chunks lowered
  to powers of two that divide D and F."""
  def fit(n, top):
    c = top
    while n % c:
      c //= 2
    return c
  return dict(r1=fit(f, 2), chunk1=fit(d, 2048), r2=fit(d, 2), chunk2=fit(f, 512), warps=4,
              pre_chunks=0, relay=False)


def parse_tile(spec: str) -> dict:
  """mlp_phases' keywords from "r1 x chunk1 x r2 x chunk2 x warps x held x
  sleep_ns [x relay | x nosync]" (held: a count or "all"), as chain_bench.py's
  --phase_tiles and ptx_regs.py's --phases write them.

  Raises:
    ValueError: a spec of another form.
  """
  fields = spec.split("x")
  mode = fields.pop() if fields and fields[-1] in ("relay", "nosync") else ""
  try:
    if len(fields) != 7:
      raise ValueError("seven fields")
    r1, c1, r2, c2, warps, sleep_ns = (int(v) for v in fields[:5] + fields[6:])
    held = None if fields[5] == "all" else int(fields[5])
  except ValueError as e:
    raise ValueError(f"phase tile {spec!r}: r1 x chunk1 x r2 x chunk2 x warps x held x "
                     f"sleep_ns [x relay | x nosync] ({e})") from None
  return dict(r1=r1, chunk1=c1, r2=r2, chunk2=c2, warps=warps, pre_chunks=held,
              sleep_ns=sleep_ns, relay=mode == "relay", unsynchronized=mode == "nosync")


def timeouts(sync: jax.Array) -> jax.Array:
  """The number of slots of `sync` whose wait reached its bound (int32)."""
  return jnp.sum(sync[::SLOT_WORDS] >= TIMEOUT_BIT, dtype=jnp.int32)


def _kernel(*refs, m_rows: int, d: int, f: int, r1: int, chunk1: int, r2: int,
            chunk2: int, pre_chunks: int, slot: int, residual: bool, norm: bool,
            eps: float, spin_limit: int, sleep_ns: int, unsynchronized: bool,
            relay: bool, interpret: bool):
  """refs: x (M, D), [residual (M, D)], wgu (2F, D), wd (D, F), sync (S,)
  (aliased to the sync output), y (M, D), m (M, F), sync out, [x + residual
  (M, D)]."""
  it = iter(refs)
  x_ref = next(it)
  r_ref = next(it) if residual else None
  wgu_ref, wd_ref = next(it), next(it)
  next(it)  # the sync input: used through its aliased output
  y_ref, m_ref, s_ref = next(it), next(it), next(it)
  xs_ref = next(it) if residual else None
  f32 = jnp.float32
  n1 = f // r1
  base = slot * SLOT_WORDS
  flags = base + LINE * (jnp.arange(FLAGS, dtype=jnp.int32) + 1)
  p = pl.program_id(0)
  phase1 = p < n1 * m_rows
  target = n1 * m_rows

  @pl.when(phase1)
  def _():
    i, j = p // n1, p % n1
    rows_g = pl.ds(pl.multiple_of(j * r1, r1), r1)
    rows_u = pl.ds(pl.multiple_of(f + j * r1, r1), r1)

    def store_xs(cols, xb):
      @pl.when(j == 0)
      def _():
        xs_ref[i, cols] = xb

    m = matvec.glu_rows(lambda cols: x_ref[i, cols],
                        (lambda cols: r_ref[i, cols]) if residual else None, store_xs,
                        lambda cols: wgu_ref[rows_g, cols], lambda cols: wgu_ref[rows_u, cols],
                        k=d, chunk=chunk1, rows=r1, norm=norm, eps=eps,
                        xs_dtype=xs_ref.dtype if residual else None)
    m_ref[i, rows_g] = m.astype(m_ref.dtype)
    if unsynchronized:
      return
    if not interpret:
      plgpu.debug_barrier()  # every thread's stores of m before the release
    if relay:
      # The count's result unused: the program does not wait for the
      # atomic's round trip (the relays below read the count instead).
      plgpu.atomic_add(s_ref, jnp.int32(base), jnp.float32(1))
      return
    before = plgpu.atomic_add(s_ref, jnp.int32(base), jnp.float32(1))

    @pl.when(before >= target)
    def _():
      _mark(s_ref, base)  # a count past its total: the slot was not zero

    @pl.when(before == target - 1)
    def _():
      # The last phase-1 program: it acquired every other one's release, so
      # its own releases (one a flag) publish all of m.
      old = plgpu.atomic_add(s_ref, flags, jnp.ones((FLAGS,), jnp.float32))

      @pl.when(jnp.max(old) != 0)
      def _():
        _mark(s_ref, base)  # a flag already set: the slot was not zero

  @pl.when(jnp.logical_not(phase1))
  def _():
    q = p - target
    i, j = q // (d // r2), q % (d // r2)
    rows = pl.ds(pl.multiple_of(j * r2, r2), r2)
    chunks = f // chunk2
    # The weights this program reads before it may have to wait.
    held = [wd_ref[rows, pl.ds(c * chunk2, chunk2)] for c in range(min(pre_chunks, chunks))]

    flag = base + LINE * (q % FLAGS + 1)
    if not unsynchronized and relay:
      # Relays: the first FLAGS phase-2 programs wait for the count, then
      # each sets its flag (its acquire of the count, then its release).
      @pl.when(q < FLAGS)
      def _():
        _wait(s_ref, base, jnp.int32(base), target, spin_limit, sleep_ns, interpret)
        old = plgpu.atomic_add(s_ref, flag, jnp.float32(1))

        @pl.when(old != 0)
        def _():
          _mark(s_ref, base)  # its flag already set: the slot was not zero
    if not unsynchronized:
      _wait(s_ref, base, flag, 1, spin_limit, sleep_ns, interpret)
    acc = jnp.zeros((r2, chunk2), f32)
    for c in range(chunks):
      cols = pl.ds(c * chunk2, chunk2)
      w = held[c] if c < len(held) else wd_ref[rows, cols]
      # Plain loads: every line of m this multiprocessor caches is read
      # after the acquire in _wait (the kernel's programs read m only there).
      mc = m_ref[i, cols]
      acc += w.astype(f32) * mc.astype(f32)[None, :]
    y_ref[i, rows] = jnp.sum(acc, 1).astype(y_ref.dtype)


def _wait(s_ref, base, flag, need: int, spin_limit: int, sleep_ns: int, interpret: bool):
  """Polls sync word `flag` until it reaches `need`, at most spin_limit
  times, then acquires it; a wait that reached its bound raises the counter
  at `base` to TIMEOUT_BIT."""

  def polling(carry):
    n, seen = carry
    return (seen < need) & (n < spin_limit)

  def poll(carry):
    n, _ = carry
    seen = jnp.min(plgpu.load(s_ref.at[pl.ds(flag, 1)], volatile=True))
    if sleep_ns and not interpret:
      # Back off between polls (PTX nanosleep; the count is its operand,
      # so that the compiler cannot hoist the pure asm out of the loop).
      # (A vector of one: Triton's inline asm takes tensors.)
      [slept] = plgpu.elementwise_inline_asm(
          f"nanosleep.u32 {sleep_ns};\n\tadd.s32 $0, $1, 1;",
          args=[jnp.full((1,), n, jnp.int32)], constraints="=r,r", pack=1,
          result_shape_dtypes=[jax.ShapeDtypeStruct((1,), jnp.int32)])
      return jnp.min(slept), seen
    return n + 1, seen

  _, seen = jax.lax.while_loop(polling, poll, (jnp.int32(0), jnp.float32(0)))
  # One acquiring read of the flag: m as the last phase-1 program
  # published it is visible after it (the loop's result is used here too,
  # so that tracing keeps the loop).
  seen = jnp.minimum(seen, plgpu.atomic_add(s_ref, flag, jnp.float32(0)))

  @pl.when(seen < need)
  def _():
    _mark(s_ref, base)


def _mark(s_ref, base):
  """Raises the slot's counter at `base` to at least TIMEOUT_BIT."""
  plgpu.atomic_max(s_ref, jnp.int32(base), jnp.float32(TIMEOUT_BIT))


def mlp_phases(x: jax.Array, wgu: jax.Array, wd: jax.Array, sync: jax.Array, slot: int, *,
               residual: jax.Array | None = None, norm_eps: float | None = None,
               r1: int = 2, chunk1: int = 2048, r2: int = 4, chunk2: int = 512,
               pre_chunks: int | None = None, warps: int = 8,
               spin_limit: int = SPIN_LIMIT, sleep_ns: int = 0, unsynchronized: bool = False,
               relay: bool = False, interpret: bool = False):
  """down(silu(gate x') * up x') for each row of x, in one kernel of two phases.

  Args:
    x: (M, D) bfloat16 input rows.
    wgu: (2F, D) bfloat16, [gate; up], contracting-minor (``model``'s layout).
    wd: (D, F) bfloat16, W_down, contracting-minor.
    sync: (S x SLOT_WORDS,) float32 (``sync_buffer(S)``), zero in `slot` (the
      caller zeroes it once and gives each call in the program a slot of
      its own).
    slot: this call's slot of sync (a Python int below S).
    residual: None or (M, D) bfloat16: x' = x + residual rounded to
      bfloat16, returned as well (the residual add after an all-reduce).
    norm_eps: None, or RMSNorm's epsilon: the gate and up products are
      rounded to bfloat16 and scaled by x''s rsqrt(mean(x'^2) + eps).
    r1, chunk1: a phase-1 program's rows of m (a power of two dividing F)
      and columns a step (a power of two dividing D).
    r2, chunk2: a phase-2 program's rows of y (a power of two dividing D) and
      columns a step (a power of two dividing F).
    pre_chunks: chunks of its W_down block a phase-2 program loads before it
      waits (None: all of them).
    warps: warps a program (both phases).
    spin_limit: polls before a wait gives up and marks its slot.
    sleep_ns: nanoseconds a waiting program sleeps between polls (0: none).
    relay: the gate/up programs' atomics do not return (no program waits
      for its round trip); the first FLAGS down programs wait for the count
      and each sets its flag (False: the last gate/up program, which learns
      it is last from its atomic's result, sets all FLAGS flags).
    unsynchronized: for timing only: no signal and no wait, so phase-2
      programs may read m before it is written and y is wrong (what the
      merged kernel costs without its synchronisation; chain_bench.py).
    interpret: run in Pallas's interpreter (no GPU).

  Returns:
    (y (M, D) bfloat16, sync), with residual (y, x + residual, sync). Check
    ``timeouts(sync)`` is 0 before trusting y.

  Raises:
    ValueError: shapes or dtypes that do not match, tiles that do not divide
      them, a slot outside sync.

  Example (the MLP of one row after the attention's all-reduce)::

    sync = sync_buffer(4)
    y, x, sync = mlp_phases(x, wgu, wd, sync, 0, residual=attn_out, norm_eps=1e-5)
    assert int(timeouts(sync)) == 0
  """
  if x.ndim != 2 or wgu.ndim != 2 or wd.ndim != 2:
    raise ValueError(f"mlp_phases: x {x.shape}, wgu {wgu.shape} and wd {wd.shape} must be "
                     "matrices (M, D), (2F, D) and (D, F)")
  m_rows, d = x.shape
  f2, d2 = wgu.shape
  f = f2 // 2
  pow2 = lambda v: v >= 1 and v & (v - 1) == 0
  if (wgu.dtype != jnp.bfloat16 or wd.dtype != jnp.bfloat16 or x.dtype != jnp.bfloat16
      or (residual is not None and residual.dtype != jnp.bfloat16)
      or sync.dtype != jnp.float32 or sync.ndim != 1
      or not 0 <= slot < sync.shape[0] // SLOT_WORDS):
    raise ValueError(f"mlp_phases: x {x.dtype}, wgu {wgu.dtype}, wd {wd.dtype} and the "
                     "residual must be bfloat16, sync "
                     f"{sync.dtype} {sync.shape} float32 (S x SLOT_WORDS,) with slot {slot} in it")
  if m_rows < 1 or not 1 <= spin_limit < 2 ** 31 or not 0 <= sleep_ns <= 10 ** 6:
    raise ValueError(f"mlp_phases: M {m_rows} must be at least 1, spin_limit {spin_limit} in "
                     f"[1, 2^31), sleep_ns {sleep_ns} in [0, 10^6]")
  if (d2 != d or f2 % 2 or wd.shape != (d, f)
      or (residual is not None and residual.shape != x.shape)
      or not all(map(pow2, (r1, chunk1, r2, chunk2)))
      or f % r1 or d % chunk1 or d % r2 or f % chunk2):
    raise ValueError(f"mlp_phases: x {x.shape}, wgu {wgu.shape}, wd {wd.shape}, residual "
                     f"{None if residual is None else residual.shape} and tiles r1 {r1} "
                     f"chunk1 {chunk1} r2 {r2} chunk2 {chunk2} do not match")
  if m_rows * (f // r1) >= 2 ** 24:
    raise ValueError(f"mlp_phases: {m_rows * (f // r1)} phase-1 programs: the float32 count "
                     "is exact below 2^24")
  chunks = f // chunk2
  pre = chunks if pre_chunks is None else max(0, min(pre_chunks, chunks))
  n_programs = m_rows * (f // r1 + d // r2)
  out_shape = [jax.ShapeDtypeStruct((m_rows, d), jnp.bfloat16),
               jax.ShapeDtypeStruct((m_rows, f), jnp.bfloat16),
               jax.ShapeDtypeStruct(sync.shape, jnp.float32)]
  if residual is not None:
    out_shape.append(jax.ShapeDtypeStruct((m_rows, d), x.dtype))
  args = [x] + ([residual] if residual is not None else []) + [wgu, wd, sync]
  kernel = functools.partial(
      _kernel, m_rows=m_rows, d=d, f=f, r1=r1, chunk1=chunk1, r2=r2, chunk2=chunk2,
      pre_chunks=pre, slot=slot, residual=residual is not None, norm=norm_eps is not None,
      eps=float(norm_eps or 0.0), spin_limit=spin_limit, sleep_ns=int(sleep_ns),
      unsynchronized=unsynchronized, relay=relay, interpret=interpret)
  out = pl.pallas_call(
      kernel, grid=(n_programs,), out_shape=out_shape,
      input_output_aliases={len(args) - 1: 2},
      compiler_params=plgpu.CompilerParams(num_warps=warps, num_stages=1),
      interpret=interpret, name="mlp_phases")(*args)
  if residual is not None:
    return out[0], out[3], out[2]
  return out[0], out[2]
