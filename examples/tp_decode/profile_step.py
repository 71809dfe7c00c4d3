"""Where the time of one decode step goes: its kernels, per layer.

  python examples/tp_decode/profile_step.py [--presets llama3.2-1b] [--shard_of 2]
      [--step NAME=KEY:VALUE,...]... [--compare NAME=PATH]... [--json FILE]
      [--hlo_dir DIR]

Run from the repository root, on a GPU (it runs on the CPU too, where a
trace holds no kernels). Each preset is built at the widths one device holds
at TP=--shard_of (model.Config.shard; 0: the whole model) on one device, the
all-reduce being the identity, once per step form: --step NAME=KEY:VALUE,...
sets fields of model.Step (mv, norm, glu, attn, kv, head, head_scale,
mv_rows, pallas_products as NAME+NAME; NAME=dots: Step.dots(), the step as first written); --compare
NAME=PATH adds the model of another model.py (an earlier version, say, whose
decode_scan may take the positions from the host and return fresh buffers).
For each form:

- inter-token latency as main.py measures it (--repeats runs of --tokens
  tokens after a --prompt prefill, one lax.scan of --chunk tokens per jitted
  call, the forms alternating), median and p90, and its token ids against
  the first form's (the forms sum in different orders: ids can differ);
- the kernels of one token, from one chunk run under jax.profiler (XLA runs
  its command buffers op by op while a profiler is active, so durations are
  the kernels' own and the gaps those of op-by-op launches; a token: the
  kernels after one LM head up to and including the next, the LM head being
  the longest kernel), each matched to its instruction in the optimised HLO
  (through the thunk sequence of XLA's dump), with its layer (the
  named scope of model.py), source line, bytes of its operands and results
  (whole arrays: an in-place cache update counts without its cache, a
  gather or dynamic slice with its whole table), duration and the idle
  gap before it; the per-layer table (median over the layers) and totals;
- the optimised HLO and the token's kernel list, to --hlo_dir (and XLA's
  dump of the programs, which ties kernels to instructions, to
  --hlo_dir/xla_dump; without --hlo_dir to a temporary folder).

The result (level "app", impl "none", metric itl_us, one row per preset and
form, with the weight-read floor of main.py) goes to --json.
"""

from __future__ import annotations

import collections
import dataclasses
import glob
import importlib.util
import json
import os
import re
import shutil
import statistics
import sys
import tempfile
import time

from absl import app, flags

import model as model_lib
from hbm import measure_bandwidth

PRESETS_F = flags.DEFINE_list("presets", ["llama3.2-1b"], "Models, each in turn.")
SHARD_OF = flags.DEFINE_integer("shard_of", 2, "Build each preset at the per-device "
                                "widths of TP=N (0: the whole model).", lower_bound=0)
STEPS = flags.DEFINE_multi_string(
    "step", ["dots=dots", "step="],
    "A step form NAME=KEY:VALUE,... (fields of model.Step; NAME=dots for "
    "Step.dots()); repeatable.")
COMPARE = flags.DEFINE_multi_string(
    "compare", [], "NAME=PATH: also the model of the model.py at PATH (its default "
    "step); repeatable.")
BATCH = flags.DEFINE_integer("batch", 1, "Sequences decoded together.", lower_bound=1)
TOKENS = flags.DEFINE_integer("tokens", 128, "Tokens per timed run.", lower_bound=1)
CHUNK = flags.DEFINE_integer("chunk", 16, "Tokens per jitted call.", lower_bound=1)
PROMPT = flags.DEFINE_integer("prompt", 64, "Prompt tokens prefilled.", lower_bound=1)
REPEATS = flags.DEFINE_integer("repeats", 5, "Timed runs per form.", lower_bound=1)
PROFILE = flags.DEFINE_boolean("profile", True, "Trace one chunk of each form.")
SEED = flags.DEFINE_integer("seed", 0, "Seed of the weights and the prompt.")
JSON_F = flags.DEFINE_string("json", None, "Write the result here.")
HLO_DIR = flags.DEFINE_string("hlo_dir", None, "Write each form's optimised HLO and "
                              "kernel list here.")

_SHAPE = re.compile(r"\b(pred|s8|u8|s16|u16|s32|u32|s64|u64|f16|bf16|f32|f64)\[([0-9,]*)\]")
_BYTES = {"pred": 1, "s8": 1, "u8": 1, "s16": 2, "u16": 2, "f16": 2, "bf16": 2, "s32": 4,
          "u32": 4, "f32": 4, "s64": 8, "u64": 8, "f64": 8}
_NO_KERNEL = ("parameter", "get-tuple-element", "tuple", "bitcast", "constant", "while",
              "conditional", "call", "after-all", "opt-barrier", "partition-id",
              "replica-id", "copy-start", "copy-done")


def _nbytes(text: str) -> int:
  total = 0
  for dt, dims in _SHAPE.findall(text):
    n = 1
    for d in filter(None, dims.split(",")):
      n *= int(d)
    total += n * _BYTES[dt]
  return total


def _split_instr(line: str):
  """(name, result type, opcode, operands text, rest) of one HLO
  instruction line, or None."""
  m = re.match(r"\s*(?:ROOT )?%?([\w.\-]+) = ", line)
  if not m:
    return None
  rest = line[m.end():]
  if rest.startswith("("):
    depth = 0
    for i, ch in enumerate(rest):
      depth += ch == "("
      depth -= ch == ")"
      if depth == 0:
        break
    rtype, rest = rest[:i + 1], rest[i + 1:].lstrip()
  else:
    rtype, _, rest = rest.partition(" ")
  m2 = re.match(r"([\w\-]+)\(", rest)
  if not m2:
    return None
  op = m2.group(1)
  rest = rest[m2.end():]
  depth = 1
  for i, ch in enumerate(rest):
    depth += ch == "("
    depth -= ch == ")"
    if depth == 0:
      break
  return m.group(1), rtype, op, rest[:i], rest[i + 1:]


def _frames(hlo: str) -> dict:
  """Stack frame id -> (function, line, parent id) from the HLO module's
  FunctionNames / FileLocations / StackFrames tables (parent 0: none)."""
  funcs, locs, frames, section = {}, {}, {}, None
  for line in hlo.splitlines():
    if line in ("FileNames", "FunctionNames", "FileLocations", "StackFrames"):
      section = line
      continue
    if not line.strip():
      section = None
      continue
    m = re.match(r"(\d+) (.*)$", line)
    if not m or section is None:
      continue
    i, rest = int(m.group(1)), m.group(2)
    if section == "FunctionNames":
      funcs[i] = rest.strip('"')
    elif section == "FileLocations":
      f = re.search(r"function_name_id=(\d+)", rest)
      ln = re.search(r"\bline=(\d+)", rest)
      locs[i] = (int(f.group(1)) if f else 0, int(ln.group(1)) if ln else None)
    elif section == "StackFrames":
      loc = re.search(r"file_location_id=(\d+)", rest)
      par = re.search(r"parent_frame_id=(\d+)", rest)
      frames[i] = (int(loc.group(1)) if loc else 0, int(par.group(1)) - 1 if par else 0)
  out = {}
  for i, (loc, parent) in frames.items():
    fn, ln = locs.get(loc, (0, None))
    out[i] = (funcs.get(fn, ""), ln, parent)
  return out


def _operand_type(shapes: dict, operand: str) -> str:
  """The type of an operand: its instruction's result type, or for
  ``name#k`` (element k of a tuple, as XLA prints loop parameters) that
  element's."""
  base, _, k = operand.partition("#")
  t = shapes.get(base, "")
  if not k:
    return t
  elems = re.findall(r"\w+\[[0-9,]*\]", t)
  return elems[int(k)] if int(k) < len(elems) else ""


def _model_line(frames: dict, frame: int | None) -> int | None:
  """The line in Model._layer (else Model._forward) of the stack of
  `frame`."""
  seen, fallback = set(), None
  while frame and frame in frames and frame not in seen:
    seen.add(frame)
    fn, ln, parent = frames[frame]
    if fn == "Model._layer":
      return ln
    if fn == "Model._forward" and fallback is None:
      fallback = ln
    frame = parent
  return fallback


def hlo_kernels(hlo: str) -> tuple[dict, list]:
  """The instructions of the optimised HLO `hlo` that launch kernels,
  outside fusion bodies: per computation, in the order of the schedule,
  dicts with name, opcode, bytes (operands, each once, and results; an in-place update
  without the buffer it updates), op_name, line (in model.py's layer),
  fused_root; and the names of while-loop bodies."""
  frames = _frames(hlo)
  comps, roots, current, bodies, fusion_bodies, shapes = {}, {}, None, [], set(), {}
  for line in hlo.splitlines():
    if line and not line.startswith(" ") and "{" in line and "(" in line:
      words = line.split()
      current = (words[1] if words[0] == "ENTRY" else words[0]).lstrip("%")
      comps[current], shapes = [], {}
      continue
    parts = _split_instr(line) if current else None
    if not parts:
      continue
    name, rtype, op, operands, rest = parts
    shapes[name] = rtype
    if line.lstrip().startswith("ROOT"):
      roots[current] = op
    calls = re.search(r"calls=%?([\w.\-]+)", rest)
    if op == "fusion" and calls:
      fusion_bodies.add(calls.group(1))
    body = re.search(r"body=%?([\w.\-]+)", rest)
    if op == "while" and body:
      bodies.append(body.group(1))
    opname = re.search(r'op_name="([^"]*)"', rest)
    dedup = re.search(r'deduplicated_name="([^"]*)"', rest)
    srcline = re.search(r"source_line=(\d+)", rest)
    frame = re.search(r"stack_frame_id=(\d+)", rest)
    # Each operand once: a kernel given one buffer twice (the Pallas glu
    # product's gate and up halves of one weight) reads it once.
    in_types = [_operand_type(shapes, o)
                for o in dict.fromkeys(re.findall(r"%([\w.\-#]+)", operands))]
    comps[current].append({
        "name": name, "kernel": dedup.group(1) if dedup else name,
        "opcode": op, "calls": calls.group(1) if calls else None,
        "out_bytes": _nbytes(rtype), "in_bytes": sum(_nbytes(t) for t in in_types),
        "in_max": max([_nbytes(t) for t in in_types] or [0]),
        "op_name": opname.group(1) if opname else "",
        "line": (int(srcline.group(1)) if srcline else
                 _model_line(frames, int(frame.group(1)) if frame else None)),
        "target": (re.search(r'custom_call_target="([^"]*)"', rest) or [None, None])[1]})
  out = {}
  for comp, instrs in comps.items():
    if comp in fusion_bodies:
      continue
    ks = []
    for ins in instrs:
      if ins["opcode"] in _NO_KERNEL:
        continue
      root = roots.get(ins["calls"]) if ins["calls"] else None
      nbytes = ins["in_bytes"] + ins["out_bytes"]
      if root == "dynamic-update-slice" or ins["opcode"] == "dynamic-update-slice":
        nbytes -= ins["out_bytes"] + min(ins["in_max"], ins["out_bytes"])  # in place
      ks.append(dict(ins, fused_root=root, bytes=max(nbytes, 0)))
    out[comp] = ks
  return out, bodies


def _sanitize(name: str) -> str:
  return re.sub(r"[.\-]", "_", name)


def _norm(name: str) -> str:
  """A kernel or instruction name without its numbering."""
  return re.sub(r"(_\d+)+$", "", _sanitize(name))


def _short_op(op_name: str) -> str:
  """The tail of an op_name after the layer scope (or the last two parts)."""
  m = re.search(r"layer\d+/(.*)", op_name)
  tail = m.group(1) if m else "/".join(op_name.split("/")[-2:])
  return tail[-48:]


def device_kernels(events) -> list:
  """Kernel-like events (start_us, dur_us, name) on the device planes'
  stream lines, sorted by start."""
  out = []
  for plane in events.planes:
    if not str(plane.name).startswith("/device:"):
      continue
    for line in plane.lines:
      lname = str(line.name)
      if not lname.startswith("Stream"):
        continue
      for e in line.events:
        try:
          stats = {str(k): str(v) for k, v in list(e.stats)}
        except Exception:  # pylint: disable=broad-except
          stats = {}
        out.append((float(e.start_ns) / 1e3, float(e.duration_ns) / 1e3, str(e.name), stats))
  out.sort(key=lambda k: k[0])
  return out


def token_window(kernels: list, chunk: int) -> list | None:
  """The kernels of one token in the middle of the chunk: after one LM head
  (a kernel at least half as long as the longest) up to and including the
  next; None when the trace does not show `chunk` such heads."""
  if not kernels:
    return None
  longest = max(k[1] for k in kernels)
  heads = [i for i, k in enumerate(kernels) if k[1] >= 0.5 * longest]
  if len(heads) < 3:
    return None
  i = len(heads) // 2
  return kernels[heads[i - 1] + 1:heads[i] + 1]


def _layer_of(ins: dict) -> int | None:
  m = re.search(r"layer(\d+)/", ins["op_name"])
  return int(m.group(1)) if m else None


_THUNK = re.compile(r"^(\s*)(\d+): (k\w+)\s*(?:\[[^\]]*\])?\s*([\w.\-]*)")


def loop_thunks(dump_dir: str, program_id: str, module: str) -> tuple[list, str] | None:
  """The thunks inside the while-loop bodies of one compiled module, in
  the order XLA runs them, from its XLA dump (``--xla_dump_to``): dicts
  with id, kind, kernel (the kernel's name; empty for library calls) and
  hlo (the instruction's name, from the thunk metadata); and the module's
  optimised HLO text. None when the dump has no such module."""
  stem = os.path.join(dump_dir, f"module_{program_id}.{module}.")
  seq_path = next((stem + x for x in ("thunk_sequence_after_thunk_passes.txt",
                                      "thunk_sequence.txt") if os.path.exists(stem + x)), None)
  hlo_path = next(iter(sorted(glob.glob(stem + "*after_optimizations.txt"))), None)
  if not seq_path or not hlo_path:
    return None
  meta = {}
  if os.path.exists(stem + "thunk_metadata.txt"):
    with open(stem + "thunk_metadata.txt") as fh:
      for chunk in fh.read().split("thunk_metadata {")[1:]:
        tid = re.search(r"thunk_id:\s*(\d+)", chunk)
        ann = re.search(r'profile_annotation:\s*"([^"]*)"', chunk)
        if tid and ann:
          meta[int(tid.group(1))] = ann.group(1)
  out, body_indent = [], None
  with open(seq_path) as fh:
    for line in fh:
      indent = len(line) - len(line.lstrip())
      if line.strip() == "body:":
        body_indent = indent
        continue
      if body_indent is not None and line.strip() and indent <= body_indent:
        body_indent = None if line.strip() != "body:" else indent
      m = _THUNK.match(line)
      if m and body_indent is not None and m.group(3) != "kCommandBuffer":
        tid = int(m.group(2))
        out.append({"id": tid, "kind": m.group(3), "kernel": m.group(4),
                    "hlo": meta.get(tid, "")})
  with open(hlo_path) as fh:
    return out, fh.read()


def annotate(window: list, thunks: list, instrs: dict) -> list:
  """Each kernel of `window` (start, duration, name, ...) with its HLO
  instruction: the next thunk of the loop body (`loop_thunks`, taken
  cyclically from the last match) that launches a kernel of that name, or,
  for a kernel no thunk names (a library's), the next thunk without a
  kernel name; `instrs`: HLO instruction name -> `hlo_kernels` dict."""
  out, prev_end, j, n = [], None, 0, len(thunks)
  for ts, dur, kname, *_ in window:
    hit = None
    for want in (lambda t: t["kernel"] == kname, lambda t: not t["kernel"]):
      for step in range(n):
        if want(thunks[(j + step) % n]):
          hit = (j + step) % n
          break
      if hit is not None:
        break
    if hit is not None:
      j = (hit + 1) % n
    ins = instrs.get(thunks[hit]["hlo"]) if hit is not None else None
    out.append({"kernel": kname, "start_us": ts, "dur_us": dur,
                "gap_us": 0.0 if prev_end is None else max(0.0, ts - prev_end),
                "hlo": thunks[hit]["hlo"] if hit is not None else None,
                "opcode": ins["opcode"] if ins else None,
                "what": _short_op(ins["op_name"]) if ins else "",
                "line": ins["line"] if ins else None,
                "bytes": ins["bytes"] if ins else 0,
                "layer": _layer_of(ins) if ins else None})
    prev_end = ts + dur
  layered = [i for i, k in enumerate(out) if k["layer"] is not None]
  for i, k in enumerate(out):  # before layer 0: between tokens; after the last: head
    if not layered or i < layered[0]:
      k["part"] = "between tokens"
    elif i > layered[-1]:
      k["part"] = "head"
    else:
      if k["layer"] is None:
        k["layer"] = out[i - 1]["layer"]
      k["part"] = f"layer {k['layer']}"
  return out
def per_layer(kernels: list, n_layers: int) -> dict:
  """Median over layers (those with the usual kernel count) of each kernel
  position: name, what, duration, gap, bytes; plus per-part totals."""
  by = collections.defaultdict(list)
  for k in kernels:
    by[k["part"]].append(k)
  layers = [by.get(f"layer {i}", []) for i in range(n_layers)]
  counts = collections.Counter(len(l) for l in layers)
  usual = counts.most_common(1)[0][0] if counts else 0
  same = [l for l in layers if len(l) == usual]
  table = []
  for pos in range(usual):
    ks = [l[pos] for l in same]
    dur = statistics.median(k["dur_us"] for k in ks)
    table.append({"kernel": _norm(ks[0]["kernel"]), "what": ks[0]["what"],
                  "line": ks[0]["line"], "dur_us": dur,
                  "gap_us": statistics.median(k["gap_us"] for k in ks),
                  "bytes": ks[0]["bytes"],
                  "gbs": ks[0]["bytes"] / dur / 1e3 if dur > 0 else None})
  parts = {}
  for part, ks in by.items():
    key = "layers" if part.startswith("layer") else part
    p = parts.setdefault(key, {"kernels": 0, "dur_us": 0.0, "gap_us": 0.0, "bytes": 0})
    p["kernels"] += len(ks)
    p["dur_us"] += sum(k["dur_us"] for k in ks)
    p["gap_us"] += sum(k["gap_us"] for k in ks)
    p["bytes"] += sum(k["bytes"] for k in ks)
  return {"kernels_per_layer": usual, "layers_with_usual_count": len(same),
          "layer_counts": dict(counts), "layer": table, "parts": parts,
          "layer_dur_us": sum(r["dur_us"] for r in table),
          "layer_gap_us": sum(r["gap_us"] for r in table)}


def _parse_step(spec: str):
  """NAME=KEY:VALUE,... -> (name, model.Step); NAME=dots: Step.dots()."""
  name, _, body = spec.partition("=")
  try:
    return name, model_lib.Step.parse(body)
  except ValueError as e:
    raise app.UsageError(f"--step {spec}: {e}") from e


def _load(path: str, name: str):
  spec = importlib.util.spec_from_file_location(f"model_{name}", path)
  mod = importlib.util.module_from_spec(spec)
  sys.modules[spec.name] = mod  # dataclasses look the module up
  spec.loader.exec_module(mod)
  return mod


@dataclasses.dataclass
class Form:
  """One step form: its model, compiled decode program and results."""
  name: str
  model: object
  legacy: bool = False  # a model.py from before the decode state was donated
  positions: list = None  # legacy: a device scalar per position
  fn: object = None
  tok0: object = None
  cache0: object = None
  hlo: str = ""
  compile_s: float = 0.0
  samples: list = dataclasses.field(default_factory=list)
  toks: object = None


_COPY = []


def _copy(tree):
  """A copy of `tree` on the device (the decode programs donate their state)."""
  import jax
  import jax.numpy as jnp
  if not _COPY:
    _COPY.append(jax.jit(lambda c: jax.tree_util.tree_map(jnp.copy, c)))
  out = _COPY[0](tree)
  jax.block_until_ready(out)
  return out


def _state(f: Form, chunk: int):
  """A fresh copy of `f`'s decode state: (tok, cache, pos, toks); legacy
  forms take pos as a host value and have no toks."""
  import jax.numpy as jnp
  return _copy((f.tok0, f.cache0, jnp.int32(PROMPT.value),
                jnp.zeros((chunk,) + f.tok0.shape, jnp.int32)))


def _call(f: Form, params, state, c: int, chunk: int):
  """One chunk: (new state, its tokens (chunk, B) as a device array)."""
  tok, cache, pos, toks = state
  if f.legacy:
    out, tok, cache = f.fn(params, tok, cache, f.positions[c * chunk])
    return (tok, cache, pos, toks), out
  toks, tok, cache, pos = f.fn(params, tok, cache, pos, toks)
  return (tok, cache, pos, toks), toks


def _run(f: Form, params, tokens: int, chunk: int):
  """One run of `tokens` tokens from the prefilled cache: per-chunk ITL
  samples (seconds) and the tokens."""
  import numpy as np
  state, samples, toks = _state(f, chunk), [], []
  for c in range(tokens // chunk):
    t0 = time.perf_counter()
    state, out = _call(f, params, state, c, chunk)
    state[0].block_until_ready()
    samples.append((time.perf_counter() - t0) / chunk)
    toks.append(np.asarray(out))  # before the next call takes the buffer back
  del state
  return samples, np.concatenate(toks, 0)


def run_preset(name: str, forms_spec: list, compare: list, mesh, bw) -> tuple[list, dict]:
  import jax
  import jax.numpy as jnp
  import numpy as np
  from jax.sharding import NamedSharding, PartitionSpec as P
  n = SHARD_OF.value
  cfg = model_lib.PRESETS[name].shard(n) if n else model_lib.PRESETS[name]
  b, chunk, tokens = BATCH.value, CHUNK.value, TOKENS.value
  max_len = PROMPT.value + tokens
  ident = lambda x, axis: x  # noqa: E731
  forms = []
  for fname, step in forms_spec:
    forms.append(Form(fname, model_lib.build(cfg, mesh, b, max_len, step)))
  for fname, path in compare:
    mod = _load(path, fname)
    ocfg = dataclasses.replace(mod.PRESETS[name], **{
        f.name: getattr(cfg, f.name) for f in dataclasses.fields(mod.Config)})
    forms.append(Form(fname, mod.build(ocfg, mesh, b, max_len),
                      legacy=not hasattr(mod, "Step")))
  params = forms[0].model.init_params(SEED.value)
  jax.block_until_ready(params)
  prompt = jnp.asarray(np.random.default_rng([SEED.value, 0]).integers(
      0, cfg.vocab, (b, PROMPT.value)), jnp.int32)
  rep = NamedSharding(mesh, P())
  failed = []
  for f in forms:
    m = f.model
    try:
      f.tok0, f.cache0 = m.prefill()(params, prompt, m.init_cache())
      if f.legacy:
        f.positions = [jax.device_put(np.int32(PROMPT.value + i), rep)
                       for i in range(tokens)]
      tok, cache, pos, toks = _state(f, chunk)
      args = ((params, tok, cache, f.positions[0]) if f.legacy
              else (params, tok, cache, pos, toks))
      t0 = time.perf_counter()
      compiled = m.decode_scan(ident, chunk).lower(*args).compile()
      f.compile_s = time.perf_counter() - t0
      f.fn, f.hlo = compiled, compiled.as_text()
      _run(f, params, tokens, chunk)  # warm-up
    except Exception as e:  # pylint: disable=broad-except
      print(f"  {f.name}: failed: {type(e).__name__}: {str(e)[:400]}", flush=True)
      failed.append({"step": f.name, "error": f"{type(e).__name__}: {str(e)[:2000]}"})
  forms = [f for f in forms if f.fn is not None]
  for r in range(REPEATS.value):
    order = forms[r % len(forms):] + forms[:r % len(forms)]
    for f in order:
      smp, toks = _run(f, params, tokens, chunk)
      f.samples += smp
      if f.toks is None:
        f.toks = toks
  wb = forms[0].model.weight_bytes_per_device()
  # The floor main.py reports: weight bytes at the read bandwidth (a bound).
  floor = wb / (bw["read_gbs"] * 1e9) * 1e6 if bw else None
  floor_copy = wb / (bw["copy_gbs"] * 1e9) * 1e6 if bw else None
  workload = f"{name} batch {b}" + (f", one TP={n} shard" if n else "")
  rows, profiles = [], {}
  for f in forms:
    us = sorted(x * 1e6 for x in f.samples)
    med = statistics.median(us)
    q = 0.9 * (len(us) - 1)
    lo = int(q)
    p90 = us[lo] + (us[min(lo + 1, len(us) - 1)] - us[lo]) * (q - lo)
    row = {"impl": "none", "step": f.name, "world_size": mesh.size, "dtype": "bfloat16",
           "metric": "itl_us", "value": med, "p90_us": p90,
           "min_us": us[0], "samples": len(us), "workload": workload, "preset": name,
           "batch": b, "shard_of": n, "tokens": tokens, "chunk": chunk,
           "prompt": PROMPT.value, "repeats": REPEATS.value, "legacy": f.legacy,
           "step_fields": dataclasses.asdict(f.model.step) if hasattr(f.model, "step")
           else None, "compile_s": f.compile_s,
           "tokens_agree_with_first": bool(np.array_equal(f.toks, forms[0].toks)),
           "timing_only": True, "weight_bytes_per_device": wb, "floor_us": floor,
           "floor_copy_us": floor_copy, "over_floor": med / floor if floor else None}
    rows.append(row)
    if HLO_DIR.value:
      os.makedirs(HLO_DIR.value, exist_ok=True)
      with open(os.path.join(HLO_DIR.value, f"{name}-{f.name}.hlo.txt"), "w") as fh:
        fh.write(f.hlo)
    if PROFILE.value:
      prof = profile_form(f, params, chunk, cfg.n_layers, DUMP_DIR[0] if DUMP_DIR else None)
      if prof:
        profiles[f.name] = prof
        row.update({k: prof[k] for k in ("kernels_per_token", "kernel_us_per_token",
                                         "gap_us_per_token", "kernels_per_layer")})
        if HLO_DIR.value:
          with open(os.path.join(HLO_DIR.value, f"{name}-{f.name}.kernels.txt"), "w") as fh:
            fh.write(kernel_listing(prof))
  del params
  for fl in failed:
    rows.append(dict(fl, impl="none", workload=workload, preset=name, metric="itl_us",
                     value=None))
  return rows, profiles


def profile_form(f: Form, params, chunk: int, n_layers: int,
                 dump_dir: str | None) -> dict | None:
  """The kernels of one token of `f` from a traced chunk (see the module
  docstring); None when the trace has no device kernels."""
  import jax
  from jax.profiler import ProfileData
  d = tempfile.mkdtemp(prefix="tp_decode_prof_")
  try:
    state = _state(f, chunk)
    with jax.profiler.trace(d):
      state, out = _call(f, params, state, 0, chunk)
      jax.block_until_ready(out)
    del out, state
    paths = [os.path.join(r, x) for r, _, fs in os.walk(d) for x in fs
             if x.endswith(".xplane.pb")]
    if not paths:
      return None
    kernels = device_kernels(ProfileData.from_file(paths[0]))
  finally:
    shutil.rmtree(d, ignore_errors=True)
  win = token_window(kernels, chunk)
  if not win:
    return None
  call_span = (kernels[-1][0] + kernels[-1][1] - kernels[0][0]) / chunk
  stats = win[0][3] if len(win[0]) > 3 else {}
  found = (loop_thunks(dump_dir, stats.get("program_id", ""), stats.get("hlo_module", ""))
           if dump_dir else None)
  thunks, hlo = found if found else ([], f.hlo)
  instrs = {k["name"]: k for ks in hlo_kernels(hlo)[0].values() for k in ks}
  ann = annotate(win, thunks, instrs)
  pl = per_layer(ann, n_layers)
  return {"kernels_per_token": len(ann),
          "kernel_us_per_token": sum(k["dur_us"] for k in ann),
          "gap_us_per_token": sum(k["gap_us"] for k in ann),
          "span_us": ann[-1]["start_us"] + ann[-1]["dur_us"] - ann[0]["start_us"],
          "call_span_us_per_token": call_span,
          "annotated_from": "XLA dump" if found else "none (no XLA dump of the module)",
          "kernels_per_layer": pl["kernels_per_layer"], "per_layer": pl,
          "token": ann, "loop_thunks": len(thunks),
          "kernel_details": {k[2]: k[3].get("kernel_details", "") for k in win
                             if len(k) > 3}}


def kernel_listing(prof: dict) -> str:
  lines = [f"{'part':15s} {'kernel':44s} {'what':40s} {'line':>5s} {'dur us':>8s} "
           f"{'gap us':>7s} {'bytes':>11s} {'GB/s':>7s}"]
  for k in prof["token"]:
    gbs = k["bytes"] / k["dur_us"] / 1e3 if k["dur_us"] > 0 else 0
    lines.append(f"{k['part']:15s} {k['kernel'][:44]:44s} {k['what'][:40]:40s} "
                 f"{str(k['line'] or ''):>5s} {k['dur_us']:8.2f} {k['gap_us']:7.2f} "
                 f"{k['bytes']:11d} {gbs:7.0f}")
  return "\n".join(lines) + "\n"


def print_profile(name: str, prof: dict) -> None:
  pl = prof["per_layer"]
  print(f"    {name}: {prof['kernels_per_token']} kernels per token, kernels "
        f"{prof['kernel_us_per_token']:.1f} us + gaps {prof['gap_us_per_token']:.1f} us "
        f"(span {prof['span_us']:.1f} us under the profiler); per layer "
        f"{pl['kernels_per_layer']} kernels ({pl['layers_with_usual_count']} layers), "
        f"{pl['layer_dur_us']:.1f} us + gaps {pl['layer_gap_us']:.1f} us", flush=True)
  for part, p in pl["parts"].items():
    print(f"      {part:15s} {p['kernels']:4d} kernels {p['dur_us']:8.1f} us + gaps "
          f"{p['gap_us']:7.1f} us  {p['bytes'] / 1e6:9.1f} MB", flush=True)
  for r in pl["layer"]:
    gbs = f"{r['gbs']:6.0f}" if r["gbs"] else "     -"
    print(f"      {r['kernel'][:36]:36s} {r['what'][:34]:34s} {str(r['line'] or ''):>4s} "
          f"{r['dur_us']:7.2f} us gap {r['gap_us']:5.2f}  {r['bytes'] / 1e6:8.2f} MB "
          f"{gbs} GB/s", flush=True)


DUMP_DIR = []  # the XLA dump folder of this process, when there is one


def _xla_dump() -> str | None:
  """Turns on XLA's dump of the programs named jit_f* (the thunk sequences
  tie kernels to HLO instructions) unless XLA_FLAGS already dumps; returns
  the folder. Must run before JAX starts its backend."""
  flags_now = os.environ.get("XLA_FLAGS", "")
  m = re.search(r"--xla_dump_to=(\S+)", flags_now)
  if m:
    return m.group(1)
  d = (os.path.join(HLO_DIR.value, "xla_dump") if HLO_DIR.value
       else tempfile.mkdtemp(prefix="tp_decode_xla_dump_"))
  os.environ["XLA_FLAGS"] = (f"{flags_now} --xla_dump_to={d} "
                             "--xla_dump_hlo_module_re=jit_f.*").strip()
  return d


def main() -> int:
  from jax_llar.tools import host, report
  gpu = host.gpu_present()
  if not gpu:
    host.use_cpu(1)
  elif PROFILE.value:
    DUMP_DIR.append(_xla_dump())
  import jax
  import numpy as np
  from jax.sharding import Mesh
  forms_spec = [_parse_step(x) for x in STEPS.value]
  compare = [tuple(c.split("=", 1)) for c in COMPARE.value]
  mesh = Mesh(np.array(jax.devices()[:1]), ("tp",))
  bw = measure_bandwidth(mesh, (1 << 30) if gpu else (32 << 20))
  print(f"profile_step: {jax.devices()[0].device_kind}; HBM {bw['copy_gbs']:.0f} GB/s "
        f"copy, {bw['read_gbs']:.0f} GB/s read; "
        + (f"one TP={SHARD_OF.value} shard per preset, " if SHARD_OF.value else "")
        + "all-reduce as identity", flush=True)
  rows, profiles = [], {}
  for name in PRESETS_F.value:
    t0 = time.perf_counter()
    r, p = run_preset(name, forms_spec, compare, mesh, bw)
    rows += r
    profiles[name] = p
    print(f"{name} ({time.perf_counter() - t0:.0f} s):", flush=True)
    for row in r:
      if row.get("error"):
        continue
      print(f"  {row['step']:16s} {row['value']:8.1f} us/token [p90 {row['p90_us']:7.1f}]  "
            f"{row['over_floor'] or 0:.2f}x floor {row['floor_us'] or 0:.1f}  tokens agree "
            f"{row['tokens_agree_with_first']}  compile {row['compile_s']:.1f} s"
            + (f"  {row.get('kernels_per_token')} kernels/token" if "kernels_per_token" in row
               else ""), flush=True)
    for fname, prof in p.items():
      print_profile(fname, prof)
  result = {"env": report.environment(), "level": "app", "rows": rows,
            "profiles": profiles, "bandwidth": bw,
            "command": "python examples/tp_decode/profile_step.py " + " ".join(sys.argv[1:]),
            "shard_note": (f"one device running one TP={SHARD_OF.value} shard (per-device "
                           f"widths, all-reduce as identity)" if SHARD_OF.value else None)}
  if DUMP_DIR and not HLO_DIR.value and DUMP_DIR[0].startswith(tempfile.gettempdir()):
    shutil.rmtree(DUMP_DIR[0], ignore_errors=True)
  if JSON_F.value:
    os.makedirs(os.path.dirname(os.path.abspath(JSON_F.value)), exist_ok=True)
    with open(JSON_F.value, "w") as fh:
      json.dump(result, fh, indent=1)
    print(f"saved {JSON_F.value}")
  return 0


if __name__ == "__main__":
  from jax_llar.tools import _cli
  _cli.run(main)
