"""``jax_llar.explain``: psums that sit in rolled loops.

A psum in a rolled loop pays, on every trip, what XLA's GPU runtime charges
for one trip of the loop (host-driven loop control, one launch per kernel of
a short body, a host round trip for a predicate it cannot count), which in a
small body is larger than the all-reduce itself; the README section "Getting
the speed in loops" says what a trip costs and which loop structures keep
the speed. `explain` finds such psums in a function's jaxpr, without
compiling it.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any, Callable, Iterator

import jax

from jax_llar import swap

# Primitives that all-reduce a sum: JAX's psum and its invariant and
# asynchronous forms (jax_llar.psum binds JAX's), and jax_llar's fused
# all-reduce + residual add + RMSNorm.
PSUM_PRIMITIVES = frozenset({
    "psum", "psum2", "psum_invariant", "psum_invariant_start", "unreduced_psum",
    "llar_psum_add_rms_norm",
})
# Primitives that only jax_llar binds: always its decision, whoever asked.
OWN_PRIMITIVES = {"llar_psum_add_rms_norm": "psum_add_rms_norm"}

# A loop whose trip executes at least this many psums (a scan unrolled this
# far, or a body doing this many steps) is treated as unrolled enough: the
# cost of a trip is shared by that many all-reduces. Fewer get a finding
# (benchmarks/NOTES.md has the loop level's results).
UNROLL_ENOUGH = 8

_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))

# Where a finding points the user for the advice on loops.
README_SECTION = 'the README section "Getting the speed in loops"'


def _n(count: int, noun: str) -> str:
  return f"{count} {noun}{'' if count == 1 else 's'}"


@dataclasses.dataclass(frozen=True)
class Finding:
  """One psum inside a rolled loop.

  Attributes:
    primitive: the psum's primitive name (``psum``, ``psum_invariant``,
      ...).
    loop: the innermost rolled loop holding it: ``"scan"`` (also
      ``fori_loop`` with static bounds) or ``"while"`` (also ``fori_loop``
      with traced bounds).
    trip_count: trips of that loop when the jaxpr says (a scan's length
      divided by its unroll factor, rounded up); None for a while loop (XLA
      may still derive a count from a counter compared with a constant).
    unroll: the scan's unroll factor (1 for ``while``).
    body_equations: equations of the loop body, counting those of calls
      nested in it (a measure of the work a trip shares its cost with).
    psums_per_trip: psums one trip executes (the unroll factor times those
      of the body; an inner scan's counted its length times).
    in_predicate: True when the psum is in a while loop's predicate.
    depth: rolled loops around the psum (1: not nested).
    where: the psum's source line as JAX recorded it ("" when unknown).
    advice: what to do, pointing to the README section.
    requested: who asked for jax_llar's fast path for this psum
      (``"psum"``, ``"swap"``, ``"install"``; ``jax_llar.swap.requested``;
      ``"psum_add_rms_norm"`` for the fused op, which jax_llar always
      decides), or None: the psum is JAX's.
  """
  primitive: str
  loop: str
  trip_count: int | None
  unroll: int
  body_equations: int
  psums_per_trip: int
  in_predicate: bool
  depth: int
  where: str
  advice: str
  requested: str | None = None

  def __str__(self) -> str:
    trips = (f"{self.trip_count} trips" if self.trip_count is not None
             else "trip count not in the jaxpr")
    place = "predicate" if self.in_predicate else "body"
    at = f" at {self.where}" if self.where else ""
    via = f"jax_llar ({self.requested})" if self.requested else "JAX's lowering"
    return (f"{self.primitive} [{via}]{at}: in the {place} of a rolled {self.loop} "
            f"({trips}, unroll {self.unroll}, {_n(self.psums_per_trip, 'psum')} per "
            f"trip, {_n(self.body_equations, 'equation')} in the body, {self.depth} rolled "
            f"loop(s) deep). {self.advice}")


def _is_jaxpr(v: Any) -> bool:
  return hasattr(v, "eqns") and hasattr(v, "invars")


def _sub_jaxprs(v: Any) -> Iterator[Any]:
  """The jaxprs inside one equation parameter (open or closed, or in a
  tuple/list of them)."""
  if _is_jaxpr(v):
    yield v
  elif _is_jaxpr(getattr(v, "jaxpr", None)):  # a ClosedJaxpr
    yield v.jaxpr
  elif isinstance(v, (tuple, list)):
    for item in v:
      yield from _sub_jaxprs(item)


def _count_equations(jaxpr) -> int:
  n = 0
  for eqn in jaxpr.eqns:
    n += 1
    for v in eqn.params.values():
      for sub in _sub_jaxprs(v):
        n += _count_equations(sub)
  return n


def _where(eqn) -> str:
  """``file:line (function)`` of the innermost frame outside JAX and outside
  this package's modules (those of ``jax_llar.psum``'s own code)."""
  try:
    from jax._src import source_info_util  # pylint: disable=g-import-not-at-top
    for frame in source_info_util.user_frames(eqn.source_info.traceback):
      if os.path.dirname(os.path.abspath(frame.file_name)) != _PACKAGE_DIR:
        return f"{frame.file_name}:{frame.start_line} ({frame.function_name})"
  except Exception:  # noqa: BLE001 - the location is a courtesy
    pass
  return ""


def _psums_per_run(jaxpr) -> int:
  """How many psums one run of `jaxpr` executes: a scan's body counts its
  length times, a while loop's body and predicate once (their trip count is
  not in the jaxpr), a cond its largest branch."""
  n = 0
  for eqn in jaxpr.eqns:
    name = eqn.primitive.name
    if name in PSUM_PRIMITIVES:
      n += 1
    elif name == "scan":
      n += int(eqn.params.get("length", 1)) * _psums_per_run(
          next(_sub_jaxprs(eqn.params["jaxpr"])))
    elif name == "cond":
      n += max((_psums_per_run(b) for b in _sub_jaxprs(eqn.params["branches"])),
               default=0)
    else:
      for v in eqn.params.values():
        for sub in _sub_jaxprs(v):
          n += _psums_per_run(sub)
  return n


@dataclasses.dataclass(frozen=True)
class _Loop:
  kind: str
  trip_count: int | None
  unroll: int
  body_equations: int
  psums_per_trip: int


def _advice(loop: _Loop, in_predicate: bool) -> str:
  if in_predicate:
    return ("XLA cannot count the trips of this loop, so by default every trip "
            "copies the predicate to the host and waits for it: test the predicate "
            "once every k steps (a body that does k steps per trip), or check it "
            f"outside a jitted block of k steps; see {README_SECTION}.")
  if loop.kind == "scan" and loop.unroll > 1:
    return (f"An unroll factor of {loop.unroll} shares each trip's cost among "
            f"{loop.psums_per_trip} all-reduces; {UNROLL_ENOUGH} or more keeps a small "
            f"step near its straight-line cost; see {README_SECTION}.")
  if loop.kind == "scan":
    return ("Each trip of a rolled scan or fori_loop costs more than a small "
            f"all-reduce: pass unroll={UNROLL_ENOUGH} (or more) to lax.scan / "
            f"lax.fori_loop, or do {UNROLL_ENOUGH} steps per trip in the body; see "
            f"{README_SECTION}.")
  return ("Each trip of a rolled while_loop costs more than a small all-reduce: "
          f"do {UNROLL_ENOUGH} (or more) steps per trip in the body, or use a "
          f"fori_loop with static bounds and unroll={UNROLL_ENOUGH}; see "
          f"{README_SECTION}.")


def _walk(jaxpr, loops: tuple[_Loop, ...], in_predicate: bool,
          out: list[Finding]) -> None:
  for eqn in jaxpr.eqns:
    name = eqn.primitive.name
    if name in PSUM_PRIMITIVES:
      if loops:
        loop = loops[-1]
        out.append(Finding(name, loop.kind, loop.trip_count, loop.unroll,
                           loop.body_equations, loop.psums_per_trip, in_predicate,
                           len(loops), _where(eqn), _advice(loop, in_predicate),
                           OWN_PRIMITIVES.get(name) or swap.requested(eqn.ctx)))
      continue
    if name == "scan":
      body = next(_sub_jaxprs(eqn.params["jaxpr"]))
      length = int(eqn.params.get("length", 0))
      unroll = eqn.params.get("unroll", 1)
      unroll = length if unroll is True else max(1, int(unroll))
      per_trip = unroll * _psums_per_run(body)
      if unroll >= length or per_trip >= UNROLL_ENOUGH:
        _walk(body, loops, in_predicate, out)  # straight line, or enough per trip
      else:
        loop = _Loop("scan", -(-length // unroll), unroll, _count_equations(body),
                     per_trip)
        _walk(body, loops + (loop,), False, out)
      continue
    if name == "while":
      body = next(_sub_jaxprs(eqn.params["body_jaxpr"]))
      cond = next(_sub_jaxprs(eqn.params["cond_jaxpr"]))
      loop = _Loop("while", None, 1, _count_equations(body),
                   _psums_per_run(body) + _psums_per_run(cond))
      # A psum in the predicate costs a host round trip per trip however much
      # the body does; the body's psums share the trip's cost.
      _walk(body, loops if loop.psums_per_trip >= UNROLL_ENOUGH else loops + (loop,),
            False, out)
      _walk(cond, loops + (loop,), True, out)
      continue
    for v in eqn.params.values():  # jit, shard_map, cond branches, custom_jvp, remat...
      for sub in _sub_jaxprs(v):
        _walk(sub, loops, in_predicate, out)


def explain(fun: Callable, *args, **kwargs) -> list[Finding]:
  """Finds the psums of ``fun(*args, **kwargs)`` that sit inside rolled loops.

  Traces `fun` to a jaxpr (``jax.make_jaxpr``: nothing is compiled or run)
  and walks it, into ``jit``, ``shard_map``, ``cond`` branches,
  ``custom_jvp``/``custom_vjp`` and ``remat`` bodies and every other
  equation that holds a jaxpr. A psum is JAX's (``lax.psum`` and its
  invariant and asynchronous forms) or jax_llar's (``jax_llar.psum``). A
  loop is a ``scan`` (``fori_loop`` with static bounds lowers to one) or a
  ``while_loop`` (``fori_loop`` with traced bounds lowers to one); it is
  rolled when one trip executes fewer than `UNROLL_ENOUGH` psums (the unroll
  factor times the body's psums) and, for a scan, it has more than one
  trip. A completely unrolled scan, or one whose trips do enough psums,
  counts as straight-line code. A psum in a while loop's predicate is
  always reported: its loop has no trip count XLA can derive. The advice
  follows the README section "Getting the speed in loops": on CUDA GPUs a trip of a rolled loop is run by XLA's
  runtime from the host (or, for a predicate XLA cannot count, waited for
  by the host), which costs more than a small one-shot all-reduce.

  Args:
    fun: a function of arrays, e.g. a ``jax.jit`` of a ``jax.shard_map``.
    *args, **kwargs: arguments as for a call of `fun`; arrays or
      ``jax.ShapeDtypeStruct`` (only shapes and dtypes are used).

  Returns:
    one `Finding` per psum inside a rolled loop, in program order (a psum in
    a while loop's predicate after those of its body); empty when there is
    none. Each names the innermost rolled loop around the psum.

  Raises:
    whatever tracing `fun` raises (e.g. NameError for an unbound axis name).

  For example, with a mesh of 2 devices on axis ``"x"``::

    >>> step = lambda i, v: jax_llar.psum(v, "x") * 0.5
    >>> f = jax.jit(jax.shard_map(lambda v: lax.fori_loop(0, 64, step, v),
    ...                           mesh=mesh, in_specs=P("x"), out_specs=P("x"),
    ...                           check_vma=False))
    >>> [str(x) for x in jax_llar.explain(f, jnp.ones(8))]
    ['psum [jax_llar (psum)] at ...: in the body of a rolled scan (64 trips, unroll 1, ...']

  (``check_vma=False``: a psum makes the carry invariant, which a loop
  whose carry goes in varying rejects under ``check_vma``.)
  """
  closed = jax.make_jaxpr(fun)(*args, **kwargs)
  findings: list[Finding] = []
  _walk(closed.jaxpr, (), False, findings)
  return findings
