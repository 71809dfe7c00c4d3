"""Copies of weights and caches in a compiled decode program.

  python examples/tp_decode/hlo_check.py [--preset small] [--batch 1] [--loop scan]

Run from the repository root. Compiles the decode program of main.py (with
lax.psum) for the devices at hand and looks through the optimised HLO,
outside fusion bodies, for results shaped like one device's shard of a
weight matrix (a copy, transpose, slice or unfused product of a weight,
which would add weight-sized memory traffic to every token) and for copies
of a layer's KV cache; it counts the in-place cache updates (one per cache
array and layer).
The exit status is 1 when a weight-sized result or a cache copy is found.
Meant for a GPU; without one it compiles for forced CPU devices, where XLA
converts bfloat16 weights to float32 for its dots and copies caches of its
own accord, so the CPU answer says little about the GPU's.
"""

from __future__ import annotations

import re

from absl import flags

import model as model_lib

_SHAPE = re.compile(r"^(pred|s8|u8|s16|u16|s32|u32|s64|u64|f16|bf16|f32|f64)\[([0-9,]*)\]")
# name, result shape (an array, or a tuple of them: multi-output fusions), opcode
_INSTR = re.compile(r"^\s*(?:ROOT )?%(\S+) = (\((?:[^()]|\([^()]*\))*\)|\S+) ([\w-]+)\(")
_BYTES = {"pred": 1, "s8": 1, "u8": 1, "s16": 2, "u16": 2, "f16": 2, "bf16": 2, "s32": 4,
          "u32": 4, "f32": 4, "s64": 8, "u64": 8, "f64": 8}
_PASS = ("parameter", "get-tuple-element", "tuple", "bitcast", "constant", "while",
         "conditional", "call", "after-all", "opt-barrier")


def _nbytes(shape: str) -> int:
  """Bytes of an array shape string such as ``bf16[4,8]{1,0}``."""
  m = _SHAPE.match(shape)
  if not m:
    return 0
  n = 1
  for d in filter(None, m.group(2).split(",")):
    n *= int(d)
  return n * _BYTES[m.group(1)]


def _dims(shape: str) -> tuple[int, ...]:
  m = _SHAPE.match(shape)
  return tuple(int(d) for d in filter(None, m.group(2).split(","))) if m else ()


def results(hlo: str) -> list[dict]:
  """Instructions of `hlo` (optimised HLO text) outside fusion bodies that
  produce an array buffer, except pass-through ones (parameters, tuples,
  bitcasts, loops).

  Returns:
    dicts with name, opcode, shape, dims, bytes, fused_root (the root opcode
    of a fusion's body, else None), in_place (a fusion whose body's root is
    a dynamic-update-slice: XLA updates its operand's buffer in place) and
    output (the index of the output: a multi-output fusion gives one dict
    per output, named name#index).
  """
  comps, roots, current, fusion_bodies = {}, {}, None, set()
  for line in hlo.splitlines():
    if line and not line.startswith(" ") and "{" in line and "(" in line:
      words = line.split()
      current = (words[1] if words[0] == "ENTRY" else words[0]).lstrip("%")
      comps[current] = []
      continue
    m = _INSTR.match(line)
    if m and current:
      comps[current].append((m.group(1), m.group(2), m.group(3), line))
      if line.lstrip().startswith("ROOT"):
        roots[current] = m.group(3)
      c = re.search(r"calls=%?([\w.\-]+)", line) if m.group(3) == "fusion" else None
      if c:
        fusion_bodies.add(c.group(1))
  out = []
  for comp, instrs in comps.items():
    if comp in fusion_bodies:
      continue
    for name, shape, op, line in instrs:
      parts = [shape] if not shape.startswith("(") else re.findall(r"\w+\[[0-9,]*\]", shape)
      if op in _PASS or not parts or not all(_SHAPE.match(x) for x in parts):
        continue
      root = None
      if op == "fusion":
        c = re.search(r"calls=%?([\w.\-]+)", line)
        root = roots.get(c.group(1)) if c else None
      for i, part in enumerate(parts):  # a multi-output fusion: one entry per output
        out.append({"name": name + (f"#{i}" if len(parts) > 1 else ""), "opcode": op,
                    "shape": part.split("{")[0], "dims": _dims(part),
                    "bytes": _nbytes(part), "fused_root": root,
                    "in_place": root == "dynamic-update-slice", "output": i})
  return out


def _key(dims) -> tuple[int, ...]:
  return tuple(sorted(d for d in dims if d != 1))


def check(m: model_lib.Model, loop: str = "scan", n_tokens: int = 4,
          psum_fn=None) -> dict:
  """Compiles `m`'s decode program (`loop` "scan": `n_tokens` tokens in one
  lax.scan; "python": one step) and looks for copies of weights and caches.

  A result counts as weight-like when its dimensions (ignoring size-1
  dimensions, in any order) are those of one device's shard of a weight
  matrix: a copy, transpose, slice or unfused product of a weight. It
  counts as a cache copy when its dimensions are those of one layer's cache
  shard and it is not an in-place update. On the CPU backend XLA makes
  choices of its own (it converts bfloat16 weights to float32 for its dots
  and transposes caches), so this check is meant for the GPU compile.

  Returns:
    dict with in_place (the in-place cache updates: `m.cache_arrays` per
    layer expected),
    weight_like, cache_copies (both should be empty), n_while (while loops
    in the program), n_kernels (fusions and custom calls outside fusion
    bodies: the kernels of the program) and hlo (the optimised HLO text).
  """
  import jax
  import jax.numpy as jnp
  from jax import lax
  from jax.sharding import NamedSharding, PartitionSpec as P
  psum_fn = psum_fn or lax.psum
  c = m.cfg
  mesh = m.mesh

  def sds(shape, spec, dtype=jnp.bfloat16):
    return jax.ShapeDtypeStruct(shape, dtype, sharding=NamedSharding(mesh, spec))

  leaves = jax.tree_util.tree_leaves(m._tree(), is_leaf=lambda x: isinstance(x, model_lib._Leaf))  # pylint: disable=protected-access
  weight_keys = set()
  for leaf in leaves:
    if len(leaf.shape) == 2:
      shard = [d // m.tp if s == "tp" else d for d, s in zip(leaf.shape, tuple(leaf.spec) + (None,) * 2)]
      weight_keys.add(_key(shard))
  shard = list(m.cache_shape())
  shard[1] //= m.tp
  cache_key = _key(shard)
  params = m._map(lambda leaf: sds(leaf.shape, leaf.spec))  # pylint: disable=protected-access
  cache = [(sds(m.cache_shape(), model_lib.CACHE_SPEC),) * m.cache_arrays
           for _ in range(c.n_layers)]
  tok = sds((m.batch,), P(), jnp.int32)
  pos = sds((), P(), jnp.int32)
  if loop == "scan":
    toks = sds((n_tokens, m.batch), P(), jnp.int32)
    lowered = m.decode_scan(psum_fn, n_tokens).lower(params, tok, cache, pos, toks)
  else:
    lowered = m.decode_step(psum_fn).lower(params, tok, cache, pos)
  hlo = lowered.compile().as_text()
  found = results(hlo)
  return {"in_place": [f for f in found if f["in_place"]],
          "weight_like": [f for f in found if _key(f["dims"]) in weight_keys],
          "cache_copies": [f for f in found
                           if _key(f["dims"]) == cache_key and not f["in_place"]],
          "n_while": len(re.findall(r"\swhile\(", hlo)),
          "n_kernels": sum(f["opcode"] in ("fusion", "custom-call") and f["output"] == 0
                           for f in found),
          "hlo": hlo}


PRESET = flags.DEFINE_enum("preset", "small", sorted(model_lib.PRESETS), "Model widths.")
BATCH = flags.DEFINE_integer("batch", 1, "Sequences decoded together.", lower_bound=1)
LOOP = flags.DEFINE_enum("loop", "scan", ["scan", "python"],
                         "Decode program: scan (4 tokens in one lax.scan) or python "
                         "(one jitted step).")
MAX_LEN = flags.DEFINE_integer("max_len", 128, "Cache length.", lower_bound=2)
DUMP = flags.DEFINE_string("dump", None, "Also write the optimised HLO to this file.")
CPU_DEVICES = flags.DEFINE_integer("cpu_devices", 2,
                                   "Host devices to force when there is no GPU.",
                                   lower_bound=1)


def main() -> int:
  from jax_llar.tools import host
  if not host.gpu_present():
    changed = host.use_cpu(CPU_DEVICES.value)
    if changed:
      print("no GPU here: compiling for forced CPU devices (" + ", ".join(changed) + ")")
  import jax
  import numpy as np
  from jax.sharding import Mesh
  mesh = Mesh(np.array(jax.devices()), ("tp",))
  m = model_lib.build(model_lib.PRESETS[PRESET.value], mesh, BATCH.value, MAX_LEN.value)
  r = check(m, LOOP.value)
  if DUMP.value:
    with open(DUMP.value, "w") as f:
      f.write(r["hlo"])
  print(f"{PRESET.value} batch {BATCH.value}, {LOOP.value} loop, TP={m.tp} on "
        f"{jax.devices()[0].platform}: {r['n_while']} while loop(s), {r['n_kernels']} "
        f"kernels (fusions and custom calls)")
  for what in ("weight_like", "cache_copies"):
    for f in r[what]:
      print(f"  {what:12s} {f['opcode']:10s} {f['fused_root'] or '':22s} "
            f"{f['shape']:28s} {f['bytes']:>12d} B  %{f['name']}")
  print(f"in-place cache updates: {len(r['in_place'])} (expected "
        f"{m.cache_arrays * m.cfg.n_layers}); weight-sized results: "
        f"{len(r['weight_like'])}; "
        f"cache copies: {len(r['cache_copies'])}")
  return 1 if r["weight_like"] or r["cache_copies"] else 0


if __name__ == "__main__":
  from jax_llar.tools import _cli
  _cli.run(main)
