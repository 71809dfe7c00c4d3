"""Tensor-parallel Llama-3 decoding: inter-token latency with each all-reduce.

  python examples/tp_decode/main.py [--presets llama3.2-1b,llama3-8b]
      [--batches 1] [--tokens 128] [--json FILE | --out DIR]

Run from the repository root. A Llama-3 decoder (model.py: all layers at the
real widths, bfloat16, random weights: latency does not depend on their
values) runs tensor parallel over the local devices with jax.shard_map, 2
all-reduces per layer and one for the greedy argmax per token. Each sequence
gets a random prompt (--prompt tokens), prefilled in one forward pass that
fills its KV cache (each sequence alone, with lax.psum, so that every batch
size, implementation and process starts from the same cache); then --tokens
tokens are decoded greedily, in jitted chunks of --chunk tokens (one
lax.scan per chunk, or one jitted call per token with --loop python; the
decode state, token, cache, position and the chunk's tokens, stays on the
device in donated buffers that each call returns in place), with the
all-reduce of each implementation:

  lax.psum            XLA's all-reduce (NCCL on GPUs), default XLA flags
  lax.psum+<flag>     the same under one XLA flag that targets small
                      all-reduces, each flag in a process of its own (XLA
                      reads its flags once); GPUs only
  llar.auto           jax_llar.psum
  llar.fused          the step with the all-reduce that ends each attention
                      and MLP block, the residual add and the next RMSNorm
                      in one call, jax_llar.psum_add_rms_norm (the fused
                      kernel where it serves the shape); the argmax's
                      all-reduce is jax_llar.psum
  llar.split          the same step form with jax_llar.psum, then XLA's add
                      and RMSNorm: what fusing gains is llar.split/llar.fused
                      (llar.auto/llar.fused also counts the step forms'
                      difference)
  lax.fused           the same step form written with lax.psum and XLA's add
                      and RMSNorm (what psum_add_rms_norm computes where it is
                      not fused): llar.fused's token reference
  none                the identity in place of the all-reduce, behind an
                      optimisation barrier (a fusion boundary at every site,
                      as an all-reduce is): timing only, its tokens are
                      meaningless
  ffi.copy            the FFI copy custom call (jax_llar.tools.copy) at every
                      all-reduce site: what a custom-call node costs in this
                      program, per site, against none (whose tokens it must
                      reproduce: the copy is an identity too)
  floor               no decoding: the bytes of weights one GPU reads per
                      token divided by the read bandwidth (bytes read per
                      second) of a large bfloat16 sum measured in the same
                      process (on GPUs from its kernels' device time in a
                      profiler trace, the best of several; elsewhere
                      host-timed, the best of several rounds: hbm.py): a
                      lower bound of the step, since every step reads every
                      weight. The row
                      keeps the bound at the elementwise kernel's bandwidth
                      (bytes read + written) as floor_copy_us. A timed row
                      below its floor is marked below_floor and named in the
                      summary; on GPUs it makes the exit status 1

The flag baselines run first, one process after the other, before this
process takes the GPUs' memory; all processes share XLA's autotuning cache
(--autotune_cache), so that they run the same matrix kernels. The batch
sweep of the plot is --batches=1,2,4,8,16,32,64.

Inter-token latency (ITL): every timed chunk gives one sample, its wall time
divided by its token count; a row reports the median and the 90th
percentile over all chunks of --repeats runs, and tokens/s = batch / median.
The timed runs of the implementations alternate, in an order that rotates
from run to run, so that a drift of the machine affects all alike. The
token ids of lax.psum and jax_llar.psum (and of none and ffi.copy) must be
identical: the exit status is 1 when they differ, or on GPUs when a timed row
is below its floor. The result (level "app", one row per preset, batch and
implementation, metric itl_us) goes to --json or to --out, in the result-file
shape of benchmarks/METHOD.md in the repository, with a plot of latency and
tokens/s against batch size where matplotlib is installed.

With --shard_of N it measures the per-device work of a TP=N step instead:
each preset is built at the widths one device holds at TP=N (query and KV
heads, MLP width and vocabulary divided by N: model.Config.shard) and runs
on the devices given, the all-reduce being the identity. Only the impls
none, ffi.copy and floor are allowed then; rows and the result carry shard_of, and the
workload names say "one TP=N shard". It is the way to study the step on a
machine of one GPU, and what a machine of one GPU runs when no --tp,
--shard_of or --impls is given (there is nothing to all-reduce on one GPU;
the first line says so).

Where no psum took jax_llar's fast path (no GPUs, one GPU), the llar rows
ran lax.psum and XLA's add and RMSNorm: the summary names them for what ran
and shows no ratio between them and lax.psum (it would be noise). With one
batch size the plot has one bar per implementation and the floor as a line.

Without a GPU it runs the small preset on forced CPU devices (it sets
JAX_PLATFORMS=cpu and XLA_FLAGS and says so), where jax_llar.psum lowers to
lax.psum (both rows differ only by noise) and the XLA flag variants are
skipped.
"""

from __future__ import annotations

import dataclasses
import gc
import hashlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

from absl import app, flags

from jax_llar.tools import _cli, host, report
from jax_llar.tools.progress import Progress

import model as model_lib
from hbm import measure_bandwidth

PRESETS = model_lib.PRESETS
GPU_PRESETS = ("llama3.2-1b", "llama3-8b")
CPU_PRESETS = ("small",)
IMPLS = ("lax.psum", "llar.auto", "llar.fused", "llar.split", "lax.fused", "none", "ffi.copy",
         "floor")
# The impls that measure without an all-reduce (timing only), allowed with
# --shard_of.
NO_ALL_REDUCE = ("none", "ffi.copy", "floor")
# The impls that run the fused step form (model.Step(norm="fused")).
FUSED_IMPLS = ("llar.fused", "llar.split", "lax.fused")
# Impls whose lowering decisions the rows report (jax_llar's dispatch log).
LLAR_IMPLS = ("llar.auto", "llar.fused", "llar.split")
SWEEP = (1, 2, 4, 8, 16, 32, 64)


def _psum_flags() -> dict[str, str]:
  """Short name -> XLA flag, for the flags of jax_llar.tools.bench.jax_level."""
  from jax_llar.tools.bench import jax_level as jax_level
  return {f.lstrip("-").split("=")[0].removeprefix("xla_gpu_"): f
          for f in jax_level.PSUM_FLAGS}


_FLAG_NAMES = _psum_flags()

PRESETS_F = flags.DEFINE_list(
    "presets", None, "Models, each measured in turn (default: "
    f"{','.join(GPU_PRESETS)} on GPUs, {','.join(CPU_PRESETS)} on CPU); known: "
    f"{', '.join(sorted(PRESETS))}.")
BATCHES = flags.DEFINE_list(
    "batches", None, "Batch sizes (sequences decoded together), each measured "
    "with every implementation (default: 1; the sweep of the plot: "
    f"{','.join(map(str, SWEEP))}).")
IMPLS_F = flags.DEFINE_list("impls", list(IMPLS), "Implementations to measure.")
PSUM_FLAGS_F = flags.DEFINE_list(
    "psum_flags", list(_FLAG_NAMES),
    "lax.psum baselines under XLA flags, by name (GPUs only; empty: none): " +
    "; ".join(f"{k} = {v}" for k, v in _FLAG_NAMES.items()) + ".")
FLAG_BATCHES = flags.DEFINE_list("flag_batches", ["1"],
                                 "Batch sizes of the XLA flag baselines.")
TOKENS = flags.DEFINE_integer("tokens", 128, "Tokens decoded per run (a multiple "
                              "of --chunk).", lower_bound=1)
CHUNK = flags.DEFINE_integer("chunk", 16, "Tokens per jitted decode call and per "
                             "timing sample.", lower_bound=1)
PROMPT = flags.DEFINE_integer("prompt", 64, "Prompt tokens prefilled per sequence.",
                              lower_bound=1)
REPEATS = flags.DEFINE_integer("repeats", 5, "Timed runs per implementation, after "
                               "one that compiles and warms up.", lower_bound=1)
LOOP = flags.DEFINE_enum("loop", "scan", ["scan", "python"],
                         "Decode loop: scan (one lax.scan of --chunk tokens per "
                         "jitted call) or python (one jitted call per token).")
ATTN = flags.DEFINE_enum("attn", "reduce", ["reduce", "dot", "pallas"],
                         "The decode step's attention (model.Step's attn) on every "
                         "path: reduce (XLA's fusions over the whole cache), dot "
                         "(batched products) or pallas (the cache update, scores, "
                         "softmax and V in one Pallas kernel, attention.py).")
MV = flags.DEFINE_enum("mv", "reduce", ["reduce", "dot", "pallas"],
                       "The decode step's matrix-vector products (model.Step's mv) "
                       "on every path: reduce (XLA's reductions), dot (XLA's dots) "
                       "or pallas (one Pallas kernel a product with the residual "
                       "add, RMSNorm's factor and the SiLU folded in, matvec.py).")
MV_PRODUCTS = flags.DEFINE_list("mv_products", list(model_lib.PALLAS_PRODUCTS),
                                "With --mv=pallas, the products that take the Pallas "
                                "kernel (model.Step's pallas_products).")
MLP = flags.DEFINE_enum("mlp", "kernels", ["kernels", "phases"],
                        "With --mv=pallas, the MLP (model.Step's mlp): kernels (the "
                        "gate/up and down products a kernel each) or phases (one kernel "
                        "of two phases, phases.py). The fused step form keeps kernels.")
SHARD_OF = flags.DEFINE_integer(
    "shard_of", 0, "Measure one device's share of a TP=N step: each preset at the "
    "per-device widths of TP=N (heads, KV heads, MLP width and vocabulary divided "
    "by N) on the devices given, the all-reduce being the identity; only with "
    "--impls none, ffi.copy and floor (the default then). 0: the full model.",
    lower_bound=0)
TP = flags.DEFINE_integer("tp", 0, "Devices to use, the tensor-parallel size (0: all).",
                          lower_bound=0)
CPU_DEVICES = flags.DEFINE_integer("cpu_devices", 2,
                                   "Host devices to force when there is no GPU.",
                                   lower_bound=1)
SEED = flags.DEFINE_integer("seed", 0, "Seed of the random weights and prompts.")
JSON_F = flags.DEFINE_string("json", None, "Write the result to this file (the plot "
                             "beside it); default: a file named after the machine "
                             "and date in --out.")
OUT = flags.DEFINE_string("out", report.default_out_dir(), "Folder of the result "
                          "when --json is not given (an existing file there is "
                          "never overwritten: the name gets -2, -3, ...).")
TAG = flags.DEFINE_string("tag", "", "Suffix of the result's file name in --out "
                          "(default: -<presets>, then -sweep with several batch sizes "
                          "and -python with --loop python).")
PLOT = flags.DEFINE_boolean("plot", True, "Also save the plot (needs matplotlib).")
FLAG_TIMEOUT = flags.DEFINE_integer("flag_timeout", 900, "Seconds allowed for each "
                                    "XLA flag baseline's process.", lower_bound=1)
AUTOTUNE_CACHE = flags.DEFINE_string(
    "autotune_cache", os.path.join(tempfile.gettempdir(), "jax_llar_autotune"),
    "GPUs: folder of XLA's per-fusion autotuning cache, shared by this process "
    "and the flag baselines' processes, so that all of them run the same matrix "
    "kernels and compile faster (empty: XLA's default, no shared cache).")


@dataclasses.dataclass(frozen=True)
class Settings:
  """What one run measures (see the module docstring and the flags)."""
  presets: tuple[str, ...]
  batches: tuple[int, ...]
  impls: tuple[str, ...] = IMPLS
  psum_flags: tuple[str, ...] = ()  # full XLA flags
  flag_batches: tuple[int, ...] = (1,)
  tokens: int = 128
  chunk: int = 16
  prompt: int = 64
  repeats: int = 5
  loop: str = "scan"
  tp: int = 0
  seed: int = 0
  flag_timeout: int = 900
  shard_of: int = 0
  attn: str = "reduce"
  mv: str = "reduce"
  mv_products: tuple = model_lib.PALLAS_PRODUCTS
  mlp: str = "kernels"


def _step(s: Settings, **kw) -> "model_lib.Step":
  """The step form of --attn, --mv, --mv_products and --mlp (kw: other
  fields; the fused form, norm "fused", keeps the MLP's kernels)."""
  mlp = "kernels" if kw.get("norm") == "fused" else s.mlp
  return model_lib.Step(attn=s.attn, mv=s.mv, pallas_products=s.mv_products, mlp=mlp, **kw)


def flag_impl(flag: str) -> str:
  """``lax.psum+<flag without leading dashes>``."""
  return "lax.psum+" + flag.lstrip("-")


def _pct(xs: list[float], q: float) -> float:
  xs = sorted(xs)
  k = (len(xs) - 1) * q
  lo = int(k)
  hi = min(lo + 1, len(xs) - 1)
  return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def _token_hash(a) -> str:
  import numpy as np
  return hashlib.sha256(np.ascontiguousarray(a, dtype=np.int32).tobytes()).hexdigest()[:16]


class _Decoder:
  """One implementation's decode program at one batch size, and its runs."""

  def __init__(self, m, impl, psum_fn, s: Settings, params, tok0, cache0, add_norm=None):
    import jax_llar
    self.impl, self.m, self.s = impl, m, s
    self.params, self.tok0, self.cache0 = params, tok0, cache0
    if impl in LLAR_IMPLS:
      jax_llar.clear_dispatch_log()
    tok, cache, pos, toks = self._state()
    if s.loop == "scan":
      fn, args = m.decode_scan(psum_fn, s.chunk, add_norm), (params, tok, cache, pos, toks)
    else:
      fn, args = m.decode_step(psum_fn, add_norm), (params, tok, cache, pos)
    t0 = time.perf_counter()
    self.fn = fn.lower(*args).compile()
    self.compile_s = time.perf_counter() - t0
    self.decisions = ([d for d in jax_llar.dispatch_log()] if impl in LLAR_IMPLS
                      else None)
    self.run()  # warm-up

  _copy_fn = None

  def _state(self):
    """A fresh device copy of the decode state: (tok, cache, pos, toks), pos
    the first position after the prompt, toks the (chunk, batch) buffer the
    scan writes its tokens into (decode_scan donates all four, decode_step
    the cache and pos)."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import NamedSharding, PartitionSpec as P
    if _Decoder._copy_fn is None:
      _Decoder._copy_fn = jax.jit(lambda c: jax.tree_util.tree_map(jnp.copy, c))
    rep = NamedSharding(self.m.mesh, P())
    pos = jax.device_put(np.int32(self.s.prompt), rep)
    toks = jax.device_put(np.zeros((self.s.chunk, self.m.batch), np.int32), rep)
    out = _Decoder._copy_fn((self.tok0, self.cache0, pos, toks))
    jax.block_until_ready(out)
    return out

  def run(self) -> tuple[list[float], "np.ndarray"]:
    """One run of s.tokens tokens from the prefilled cache: per chunk the
    inter-token latency sample (seconds), and the tokens (tokens, batch)."""
    import numpy as np
    s = self.s
    tok, cache, pos, buf = self._state()
    samples, toks = [], []
    for _ in range(s.tokens // s.chunk):
      if s.loop == "scan":
        t0 = time.perf_counter()
        buf, tok, cache, pos = self.fn(self.params, tok, cache, pos, buf)
        tok.block_until_ready()
        samples.append((time.perf_counter() - t0) / s.chunk)
        toks.append(np.asarray(buf))  # before the next call takes the buffer back
      else:
        t0 = time.perf_counter()
        for _ in range(s.chunk):
          tok, cache, pos = self.fn(self.params, tok, cache, pos)
          toks.append(tok)
        tok.block_until_ready()
        samples.append((time.perf_counter() - t0) / s.chunk)
    del cache
    if s.loop == "python":
      return samples, np.stack([np.asarray(t) for t in toks], 0)
    return samples, np.concatenate(toks, 0)


def _prefilled(m1, params, s: Settings, n_seq: int):
  """Per sequence i < n_seq: its random prompt (seeded by (seed, i)),
  prefilled alone (batch 1, lax.psum) -> (first token (1,), cache). A
  sequence's cache thus does not depend on the batch sizes measured or on
  the process."""
  import jax
  import jax.numpy as jnp
  import numpy as np
  prefill = m1.prefill()
  out = []
  for i in range(n_seq):
    prompt = np.random.default_rng([s.seed, i]).integers(0, m1.cfg.vocab, (1, s.prompt))
    tok, cache = prefill(params, jnp.asarray(prompt, jnp.int32), m1.init_cache())
    out.append((tok, cache))
  jax.block_until_ready(out)
  return out


def _batch_of(seqs, b: int, mesh):
  """(tok (b,), cache) of the first b prefilled sequences, concatenated."""
  import jax
  import jax.numpy as jnp
  from jax.sharding import NamedSharding, PartitionSpec as P
  toks = [t for t, _ in seqs[:b]]
  caches = [c for _, c in seqs[:b]]
  cat = jax.jit(lambda cs: jax.tree_util.tree_map(lambda *a: jnp.concatenate(a, 0), *cs),
                out_shardings=NamedSharding(mesh, model_lib.CACHE_SPEC))
  tok = jax.jit(lambda ts: jnp.concatenate(ts, 0), out_shardings=NamedSharding(mesh, P()))
  return tok(toks), cat(caches)


def run_preset(name: str, mesh, s: Settings, batches, impls, bw: dict | None) -> tuple[list, dict]:
  """All rows of one preset: per batch size, every impl of `impls` timed in
  alternating runs, plus the floor row when `bw` is given. Returns (rows,
  token ids of the first sequence per batch and impl)."""
  import jax
  import numpy as np
  from jax import lax

  import jax_llar
  cfg = PRESETS[name].shard(s.shard_of) if s.shard_of else PRESETS[name]
  max_len = s.prompt + s.tokens
  from jax_llar.tools import copy as copy_call
  fns = {"lax.psum": lax.psum, "llar.auto": jax_llar.psum,
         "none": lambda x, axis: lax.optimization_barrier(x),
         "ffi.copy": lambda x, axis: copy_call.copy(x),
         "llar.fused": jax_llar.psum, "llar.split": jax_llar.psum, "lax.fused": lax.psum}
  add_norms = {"llar.fused": jax_llar.psum_add_rms_norm,
               "llar.split": model_lib.unfused_add_norm(jax_llar.psum),
               "lax.fused": model_lib.unfused_add_norm(lax.psum)}
  m1 = model_lib.build(cfg, mesh, 1, max_len, _step(s))
  t0 = time.perf_counter()
  params = m1.init_params(s.seed)
  jax.block_until_ready(params)
  t_init = time.perf_counter() - t0
  t0 = time.perf_counter()
  seqs = _prefilled(m1, params, s, max(batches))
  print(f"  weights {m1.weight_bytes_per_device() / 2**30:.2f} GiB per device, made "
        f"in {t_init:.1f} s; {max(batches)} prompt(s) of {s.prompt} tokens "
        f"prefilled in {time.perf_counter() - t0:.1f} s (compile included)", flush=True)
  rows, first_ids = [], {}
  progress = Progress(len(batches), f"decode {name}")
  for b in batches:
    m = model_lib.build(cfg, mesh, b, max_len, _step(s))
    # The fused step form: the same weights and prefilled cache.
    mf = model_lib.build(cfg, mesh, b, max_len, _step(s, norm="fused"))
    tok0, cache0 = _batch_of(seqs, b, mesh)
    workload = (f"{name} batch {b}" + (f", one TP={s.shard_of} shard" if s.shard_of else "")
                + (f", attn {s.attn}" if s.attn != "reduce" else "")
                + (f", mv {s.mv}" if s.mv != "reduce" else "")
                + (f" ({'+'.join(s.mv_products)})" if s.mv == "pallas" else "")
                + (f", mlp {s.mlp}" if s.mlp != "kernels" else ""))
    common = {"world_size": m.tp, "dtype": "bfloat16", "metric": "itl_us",
              "workload": workload, "preset": name, "batch": b, "tokens": s.tokens,
              "chunk": s.chunk, "prompt": s.prompt, "loop": s.loop, "repeats": s.repeats}
    if s.shard_of:
      common["shard_of"] = s.shard_of
    common["attn"] = s.attn
    common["mv"] = s.mv
    if s.mv == "pallas":
      common["mv_products"] = list(s.mv_products)
      common["mlp"] = s.mlp
    timed = [i for i in impls if i in fns]
    decs = {}
    for impl in timed:
      decs[impl] = _Decoder(mf if impl in FUSED_IMPLS else m, impl, fns[impl], s, params,
                            tok0, cache0, add_norms.get(impl))
    runs = {impl: [] for impl in timed}
    for r in range(s.repeats):
      order = timed[r % len(timed):] + timed[:r % len(timed)] if timed else []
      for impl in order:
        runs[impl].append(decs[impl].run())
    ref = runs.get("lax.psum", [[None, None]])[0][1]
    fused_ref = runs.get("lax.fused", [[None, None]])[0][1]
    for impl in timed:
      d = decs[impl]
      samples = [x * 1e6 for smp, _ in runs[impl] for x in smp]
      toks = [t for _, t in runs[impl]]
      if any((t < 0).any() for t in toks):
        # model.Step(mlp="phases"): a phase kernel's wait reached its bound.
        raise RuntimeError(f"{impl}: token ids below 0 (a phase kernel's wait timed out; "
                           "the outputs are wrong)")
      med = statistics.median(samples)
      row = dict(common, impl=impl, value=med, p90_us=_pct(samples, 0.9),
                 min_us=min(samples), max_us=max(samples),
                 mean_us=statistics.fmean(samples), samples=len(samples),
                 tokens_per_s=b * 1e6 / med, compile_s=d.compile_s,
                 token_hash=_token_hash(toks[0]),
                 deterministic=all(np.array_equal(toks[0], t) for t in toks[1:]),
                 timing_only=impl in NO_ALL_REDUCE)
      if impl in FUSED_IMPLS and "mlp" in row:
        row["mlp"] = "kernels"  # the fused form keeps the MLP's kernels (_step)
      if impl in LLAR_IMPLS:
        # llar.auto against lax.psum, llar.split against lax.fused (bitwise:
        # the exit status depends on them); llar.fused against lax.fused (on
        # GPUs the fused kernel's normed output may differ from XLA's by 1
        # ulp, so ids may part: reported).
        r0 = ref if impl == "llar.auto" else fused_ref
        row["tokens_agree"] = (bool(np.array_equal(r0, toks[0])) if r0 is not None
                               else None)
        row["tokens_reference"] = "lax.psum" if impl == "llar.auto" else "lax.fused"
        # jax_llar's lowering decisions for this program (one per distinct
        # psum lowering, not per psum site).
        row["decisions"] = len(d.decisions)
        row["fast_decisions"] = sum(x.fast for x in d.decisions)
        row["fast_path"] = bool(d.decisions) and row["fast_decisions"] == len(d.decisions)
        row["fallback_reasons"] = sorted({f"{x.reason}: {x.detail}" for x in d.decisions
                                          if not x.fast})
      elif impl == "lax.psum":
        row["tokens_agree"] = True
      elif impl == "ffi.copy" and "none" in runs:
        # Both are identities: the copy kernel must give none's tokens.
        row["tokens_agree"] = bool(np.array_equal(runs["none"][0][1], toks[0]))
        row["tokens_reference"] = "none"
        row["sites_per_token"] = 2 * cfg.n_layers + 1
      rows.append(row)
      first_ids.setdefault(workload, {})[impl] = toks[0][:, 0].tolist()
    if bw is not None and "floor" in impls:
      wb, kvb = m.weight_bytes_per_device(), m.kv_bytes_per_device()
      fl = wb / (bw["read_gbs"] * 1e9) * 1e6
      rows.append(dict(common, impl="floor", value=fl, tokens_per_s=b * 1e6 / fl,
                       weight_bytes_per_device=wb, kv_bytes_per_device=kvb,
                       floor_read_us=fl,
                       floor_copy_us=wb / (bw["copy_gbs"] * 1e9) * 1e6,
                       floor_with_full_kv_us=(wb + kvb) / (bw["read_gbs"] * 1e9) * 1e6,
                       hbm_copy_gbs=bw["copy_gbs"], hbm_read_gbs=bw["read_gbs"],
                       hbm_read_basis=bw["read_basis"],
                       floor_basis="weight bytes / read bandwidth (bfloat16 sum), " + (
                           "its kernels' device time, the best of "
                           f"{bw['read_gbs_device']['kernels']}"
                           if bw["read_basis"] == "device" else
                           f"host-timed, best of {bw.get('rounds', 1)} rounds")))
      for row in rows[len(rows) - len(timed) - 1:-1]:
        row["below_floor"] = row["value"] < fl
    for row in rows[len(rows) - len(timed) - (bw is not None and "floor" in impls):]:
      _print_row(row)
    progress.step(f"batch {b}")
    del decs, cache0, tok0
    gc.collect()
  del params, seqs
  gc.collect()
  return rows, first_ids


def _print_row(r: dict) -> None:
  extra = ""
  if r["impl"] == "floor":
    extra = (f"  ({r['weight_bytes_per_device'] / 2**30:.2f} GiB of weights per device "
             f"read at {r['hbm_read_gbs']:.0f} GB/s; at the copy bandwidth "
             f"{r['floor_copy_us']:.1f} us)")
  else:
    extra = f"  p90 {r['p90_us']:9.1f} us  compile {r.get('compile_s', 0):5.1f} s"
    if r["impl"] in LLAR_IMPLS:
      extra += (f"  fast path {r['fast_decisions']}/{r['decisions']} lowerings  "
                f"tokens agree with {r['tokens_reference']}: {r['tokens_agree']}")
    if r["impl"] == "none":
      extra += "  (timing only)"
  print(f"  {r['workload']:24s} {r['impl']:24s} {r['value']:9.1f} us/token "
        f"{r['tokens_per_s']:9.0f} tok/s{extra}", flush=True)


def child_command(s: Settings, presets, out_json: str) -> list[str]:
  """The command line of one XLA flag baseline: this program with lax.psum
  only, at the flag batch sizes, the same tokens, prompt, loop, devices and
  seed."""
  return [sys.executable, os.path.abspath(__file__), "--impls=lax.psum",
          "--psum_flags=", "--presets=" + ",".join(presets),
          "--batches=" + ",".join(map(str, s.flag_batches)), f"--tokens={s.tokens}",
          f"--chunk={s.chunk}", f"--prompt={s.prompt}", f"--repeats={s.repeats}",
          f"--loop={s.loop}", f"--tp={s.tp}", f"--seed={s.seed}", f"--attn={s.attn}",
          f"--mv={s.mv}", "--mv_products=" + ",".join(s.mv_products), f"--mlp={s.mlp}",
          f"--json={out_json}", "--noplot", f"--autotune_cache={AUTOTUNE_CACHE.value}"]


def run_flag_baselines(s: Settings, presets) -> tuple[list[dict], list[dict]]:
  """lax.psum under each of ``s.psum_flags`` appended to XLA_FLAGS, each in
  a process of its own (`child_command`), one after the other. Returns the
  rows (impl ``lax.psum+<flag>``, ``xla_flags`` added) and one record per
  failed process (flag, rc, output tail)."""
  rows, failures = [], []
  for flag in s.psum_flags:
    env = dict(os.environ)
    env["XLA_FLAGS"] = " ".join(f for f in (env.get("XLA_FLAGS", ""), flag) if f)
    print(f"lax.psum with {flag} (a process of its own) ...", flush=True)
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="tp_decode_flag_") as d:
      path = os.path.join(d, "child.json")
      try:
        p = subprocess.run(child_command(s, presets, path), env=env, capture_output=True,
                           text=True, timeout=s.flag_timeout)
        rc, tail = p.returncode, (p.stdout + p.stderr)[-2000:]
      except subprocess.TimeoutExpired as e:
        rc, tail = "timeout", str(e)[-500:]
      if rc != 0 or not os.path.exists(path):
        failures.append({"flag": flag, "rc": rc, "output_tail": tail})
        print(f"  failed (rc={rc}): {tail[-600:]}", flush=True)
        continue
      with open(path) as f:
        child = json.load(f)
    for r in child["rows"]:
      r["impl"] = flag_impl(flag)
      r["xla_flags"] = env["XLA_FLAGS"]
      rows.append(r)
      _print_row(r)
    print(f"  ({time.perf_counter() - t0:.0f} s)", flush=True)
  return rows, failures


def run(s: Settings, baseline_rows: list[dict] | None = None,
        failures: list[dict] | None = None) -> dict:
  """Measures every preset of `s` in this process (flag baselines come from
  `run_flag_baselines`, given as `baseline_rows`) and returns the result:
  ``{"env", "level": "app", "rows", "settings", "configs", "bandwidth",
  "token_ids", "tokens_agree", "psum_flag_failures", "psum_flags_skipped",
  "dispatch"}``. tokens_agree is False when jax_llar's token ids differ from
  lax.psum's in some workload (flag baselines are compared too, in their
  rows, but do not count)."""
  import jax
  import numpy as np
  from jax.sharding import Mesh

  import jax_llar
  devices = jax.devices()
  platform = devices[0].platform
  n = s.tp or len(devices)
  mesh = Mesh(np.array(devices[:n]), ("tp",))
  if s.shard_of:
    print(f"tp_decode: one TP={s.shard_of} shard (per-device widths of TP="
          f"{s.shard_of}, all-reduce as identity) on {n} {platform} device(s)", flush=True)
  where = (f"{n} {platform} device(s)" if s.shard_of else f"TP={n} over {platform}")
  print(f"tp_decode: {where} ({devices[0].device_kind}); random "
        f"bfloat16 weights (latency does not depend on their values); prompt "
        f"{s.prompt} tokens prefilled, then {s.tokens} tokens decoded greedily per run "
        f"in chunks of {s.chunk} ({s.loop} loop), {s.repeats} timed runs per "
        f"implementation", flush=True)
  if any(i in s.impls for i in LLAR_IMPLS) and not jax_llar.status()["active"]:
    print("jax_llar lowers to lax.psum and XLA's add and RMSNorm here: the lax.psum and "
          "llar.auto rows, and the lax.fused and llar.fused rows, differ only by noise",
          flush=True)
  bw = None
  if "floor" in s.impls:
    bw = measure_bandwidth(mesh, (1 << 30) if platform == "gpu" else (32 << 20))
    memory = "HBM bandwidth per GPU" if platform == "gpu" else (
        "memory bandwidth per CPU device (host memory, shared by the forced devices: "
        "not a GPU's)")
    print(f"{memory}: {bw['copy_gbs']:.0f} GB/s (bfloat16 elementwise "
          f"kernel, bytes read + written), {bw['read_gbs']:.0f} GB/s (sum, bytes read, "
          f"{bw['read_basis']}-timed"
          + (f"; host-timed {bw['read_gbs_host']:.0f}" if "read_gbs_host" in bw else "") + ")",
          flush=True)
  rows, token_ids = [], {}
  for name in s.presets:
    c = PRESETS[name].shard(s.shard_of) if s.shard_of else PRESETS[name]
    print(f"{name}{f' (one TP={s.shard_of} shard)' if s.shard_of else ''}: "
          f"{c.n_layers} layers, d_model {c.d_model}, heads {c.n_heads}/"
          f"{c.n_kv_heads} x {c.head_dim}, MLP {c.d_ff}, vocabulary {c.vocab}"
          f"{', tied embeddings' if c.tied_embeddings else ''}; "
          f"{2 * c.n_layers + 1} all-reduces per token"
          f"{' (identity)' if s.shard_of else ''}", flush=True)
    r, ids = run_preset(name, mesh, s, s.batches, s.impls, bw)
    rows += r
    token_ids.update(ids)
  baseline_rows = list(baseline_rows or [])
  ref = {r["workload"]: r["token_hash"] for r in rows if r["impl"] == "lax.psum"}
  for r in baseline_rows:
    r["tokens_agree"] = (r["token_hash"] == ref[r["workload"]]
                         if r["workload"] in ref else None)
  rows += baseline_rows
  agree = all(r.get("tokens_agree") is not False for r in rows
              if r["impl"] in ("llar.auto", "llar.split", "ffi.copy"))
  below = [f"{r['workload']} {r['impl']} {r['value']:.1f} us" for r in rows
           if r.get("below_floor")]
  out = {"env": report.environment(), "level": "app", "rows": rows,
         "settings": dataclasses.asdict(s),
         "configs": {p: dataclasses.asdict(PRESETS[p].shard(s.shard_of) if s.shard_of
                                           else PRESETS[p]) for p in s.presets},
         "bandwidth": bw, "token_ids": token_ids, "tokens_agree": agree,
         "below_floor": below,
         "psum_flag_failures": failures or [],
         "psum_flags_skipped": None if platform == "gpu" or not s.psum_flags else
         "the XLA flags target XLA's GPU all-reduce: skipped without GPUs",
         "dispatch": [d.to_dict() for d in jax_llar.dispatch_log()][-50:],
         "fast_path_lowerings": sum(d.fast for d in jax_llar.dispatch_log())}
  if s.shard_of:
    out["shard_of"] = s.shard_of
    out["shard_note"] = (
        f"one device running one TP={s.shard_of} shard: every preset at the widths one "
        f"device holds at TP={s.shard_of} (query and KV heads, MLP width and vocabulary "
        f"divided by {s.shard_of}), the all-reduce as the identity, on {n} device(s); "
        f"the per-device work of a TP={s.shard_of} step without its communication "
        f"(token ids are those of this smaller model)")
  return out


def print_summary(result: dict) -> None:
  """Per workload: every implementation's median inter-token latency [p90],
  then the ratios lax.psum / llar.auto (default flags and the best flag
  variant), llar.split / llar.fused (what fusing gains, one step form),
  llar.auto / llar.fused (with the step forms' difference), lax.fused /
  llar.fused, llar.auto / none and none / floor."""
  by: dict = {}
  for r in result["rows"]:
    by.setdefault(r["workload"], {})[r["impl"]] = r
  # Where no psum took jax_llar's fast path, every llar row ran lax.psum
  # (and XLA's add and RMSNorm): their differences are noise, not a gain or
  # a loss, and are not printed as one.
  fast = result.get("fast_path_lowerings", 1) > 0
  ran = {} if fast else {"llar.auto": "lax.psum", "llar.fused": "lax.fused",
                          "llar.split": "lax.fused"}
  if not fast and any(r["impl"] in LLAR_IMPLS for r in result["rows"]):
    print("no psum took jax_llar's fast path here: the llar rows ran lax.psum (llar.fused: "
          "XLA's add and RMSNorm), so their ratios to lax.psum are noise and are not shown; "
          "on CUDA GPUs that are NVLink peers llar.auto runs jax_llar's kernels")
  print("inter-token latency, us per token: median [p90]")
  for w, v in by.items():
    cells = "  ".join(f"{i}{'=' + ran[i] if ran.get(i) else ''} {r['value']:.1f}"
                      + (f" [{r['p90_us']:.1f}]" if "p90_us" in r else "")
                      for i, r in v.items())
    print(f"  {w}: {cells}")
    ll, ps, no, fl = (v.get(k) for k in ("llar.auto", "lax.psum", "none", "floor"))
    lf, xf, ls = v.get("llar.fused"), v.get("lax.fused"), v.get("llar.split")
    ratios = []
    if not fast:  # only the ratios that do not compare jax_llar with itself
      ll = lf = ls = None
    if ll and ps:
      gain = 100 * (1 - ll["value"] / ps["value"])
      ratios.append(f"lax.psum/llar.auto {ps['value'] / ll['value']:.2f}x (llar.auto "
                    f"{abs(gain):.0f}% {'lower' if gain >= 0 else 'higher'})")
      flagged = [r for i, r in v.items() if i.startswith("lax.psum+")]
      if flagged:
        best = min(flagged, key=lambda r: r["value"])
        ratios.append(f"best flag variant/llar.auto {best['value'] / ll['value']:.2f}x "
                      f"({best['impl'].split('=')[0].removeprefix('lax.psum+')})")
    if ls and lf:
      gain = 100 * (1 - lf["value"] / ls["value"])
      ratios.append(f"llar.split/llar.fused {ls['value'] / lf['value']:.2f}x (fusing: "
                    f"{abs(gain):.0f}% {'lower' if gain >= 0 else 'higher'})")
    if ll and lf:
      ratios.append(f"llar.auto/llar.fused {ll['value'] / lf['value']:.2f}x (with the step "
                    "forms' difference)")
    if xf and lf:
      ratios.append(f"lax.fused/llar.fused {xf['value'] / lf['value']:.2f}x")
    if ll and no:
      ratios.append(f"llar.auto/none {ll['value'] / no['value']:.2f}x")
    cp = v.get("ffi.copy")
    if cp and no:
      per_site = (cp["value"] - no["value"]) / cp["sites_per_token"]
      ratios.append(f"ffi.copy/none {cp['value'] / no['value']:.2f}x ({per_site:+.2f} us "
                    f"per all-reduce site, {cp['sites_per_token']} sites per token)")
    if no and fl:
      ratios.append(f"none/floor {no['value'] / fl['value']:.2f}x")
    if ratios:
      print("    " + "; ".join(ratios))
  below = result.get("below_floor") or []
  if below:
    print("BELOW THE FLOOR (the floor is not a lower bound, or the timing is wrong): " +
          "; ".join(below))
  copies = [r for r in result["rows"] if r["impl"] == "ffi.copy" and "tokens_agree" in r]
  if copies:
    print("token ids of ffi.copy and none agree: "
          f"{all(r['tokens_agree'] for r in copies)}")
  if any(r["impl"] in ("llar.auto", "llar.split") for r in result["rows"]):
    print(f"token ids of lax.psum and llar.auto (and of lax.fused and llar.split) agree: "
          f"{result['tokens_agree']}")
  fused = [r for r in result["rows"] if r["impl"] == "llar.fused"]
  if fused:
    print("token ids of lax.fused and llar.fused agree: "
          f"{all(r.get('tokens_agree') is not False for r in fused)} (reported, not in the "
          "exit status: on GPUs the fused kernel's normed output may differ from XLA's by "
          "1 ulp)")
  if result.get("psum_flags_skipped"):
    print(f"lax.psum under XLA flags: {result['psum_flags_skipped']}")


def _what_ran(result: dict, rows: list[dict]) -> str:
  """A plot's title part: the parallelism that ran."""
  shard = result.get("shard_of")
  if shard:
    return f"one TP={shard} shard on {rows[0]['world_size']} device(s), all-reduce as identity"
  return f"TP={rows[0]['world_size']}"


def plot(result: dict, path: str) -> None:
  """Inter-token latency and tokens/s against batch size, one line per
  implementation, one column per preset, saved as PNG at `path`; with one
  batch size, one bar per implementation instead, the floor a dashed line.
  Titles say what ran (TP=N, or one TP=N shard).

  Raises:
    ImportError: when matplotlib is not installed.
  """
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  presets = list(dict.fromkeys(r["preset"] for r in result["rows"]))
  batches = {r["batch"] for r in result["rows"]}
  if len(batches) == 1:
    fig, axes = plt.subplots(1, len(presets), figsize=(6 * len(presets), 4.5), squeeze=False)
    for col, p in enumerate(presets):
      rows = [r for r in result["rows"] if r["preset"] == p]
      ax = axes[0][col]
      bars = [r for r in rows if r["impl"] != "floor"]
      ax.bar([r["impl"] for r in bars], [r["value"] for r in bars], color="tab:blue")
      for r in (r for r in rows if r["impl"] == "floor"):
        ax.axhline(r["value"], color="k", linestyle="--", label=f"floor {r['value']:.0f} us")
      ax.set_ylim(bottom=0)
      ax.set_ylabel("inter-token latency (us, median)")
      ax.set_title(f"{p}, batch {rows[0]['batch']}, {_what_ran(result, rows)}", fontsize=9)
      ax.tick_params(axis="x", labelrotation=30, labelsize=7)
      ax.grid(True, axis="y", alpha=0.3)
      if any(r["impl"] == "floor" for r in rows):
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return
  fig, axes = plt.subplots(2, len(presets), figsize=(6 * len(presets), 8), squeeze=False)
  for col, p in enumerate(presets):
    rows = [r for r in result["rows"] if r["preset"] == p]
    impls = list(dict.fromkeys(r["impl"] for r in rows))
    for impl in impls:
      pts = sorted((r["batch"], r["value"], r["tokens_per_s"]) for r in rows
                   if r["impl"] == impl)
      label = impl if len(impl) < 40 else impl[:40] + "..."
      style = "k--" if impl == "floor" else ("o:" if impl == "none" else "o-")
      for ax, k in ((axes[0][col], 1), (axes[1][col], 2)):
        ax.plot([q[0] for q in pts], [q[k] for q in pts], style, label=label, ms=4)
    for ax, ylabel in ((axes[0][col], "inter-token latency (us, median)"),
                       (axes[1][col], "tokens/s (batch / latency)")):
      ax.set_xscale("log", base=2)
      ax.set_yscale("log")
      ax.set_xlabel("batch size")
      ax.set_ylabel(ylabel)
      ax.set_title(f"{p}, {_what_ran(result, rows)}", fontsize=9)
      ax.grid(True, which="both", alpha=0.3)
      ax.legend(fontsize=6)
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  plt.close(fig)


def _ints(values, what: str) -> tuple[int, ...]:
  try:
    out = tuple(int(v) for v in values)
  except ValueError as e:
    raise app.UsageError(f"--{what}: comma list of integers expected") from e
  if any(v < 1 for v in out):
    raise app.UsageError(f"--{what}: values must be at least 1")
  return out


# What one GPU runs when no flag says otherwise: there is nothing to
# all-reduce, so one TP=2 shard's step (the per-device work of a 2-GPU
# step), the identity at every all-reduce, against the weight-read floor.
ONE_GPU_SHARD_OF = 2
ONE_GPU_NOTE = (f"one GPU: nothing to all-reduce, so this runs what one GPU can show: one "
                f"TP={ONE_GPU_SHARD_OF} shard's decode step (--shard_of={ONE_GPU_SHARD_OF}: "
                "the per-device work of a 2-GPU step, the all-reduce as the identity) "
                "against the weight-read floor; lax.psum and jax_llar need 2+ GPUs "
                "(--tp, --shard_of or --impls choose otherwise)")


def one_gpu_default(n_gpus: int) -> bool:
  """Whether to run `ONE_GPU_NOTE`'s plan: one GPU, and none of --tp,
  --shard_of, --impls given."""
  return n_gpus == 1 and not (TP.present or SHARD_OF.present or IMPLS_F.present)


def settings_from_flags(gpu: bool, n_gpus: int = 0) -> Settings:
  """Settings from the command line (defaults per platform; on one GPU
  without --tp, --shard_of or --impls, `ONE_GPU_NOTE`'s plan).

  Raises:
    app.UsageError: unknown presets, impls or flag names; --tokens not a
      multiple of --chunk.
  """
  shard_of = SHARD_OF.value or (ONE_GPU_SHARD_OF if gpu and one_gpu_default(n_gpus) else 0)
  presets = tuple(PRESETS_F.value or (GPU_PRESETS if gpu else CPU_PRESETS))
  unknown = [p for p in presets if p not in PRESETS]
  if unknown:
    raise app.UsageError(f"--presets: unknown {', '.join(unknown)}; known: "
                         f"{', '.join(sorted(PRESETS))}")
  impls = tuple(IMPLS_F.value)
  bad = [i for i in impls if i not in IMPLS]
  if not impls:
    raise app.UsageError(f"--impls: at least one of {', '.join(IMPLS)}")
  if bad:
    raise app.UsageError(f"--impls: unknown {', '.join(bad)}; known: {', '.join(IMPLS)}")
  bad = [f for f in PSUM_FLAGS_F.value if f not in _FLAG_NAMES]
  if bad:
    raise app.UsageError(f"--psum_flags: unknown {', '.join(bad)}; known: "
                         f"{', '.join(_FLAG_NAMES)}")
  if shard_of:
    if not IMPLS_F.present:
      impls = NO_ALL_REDUCE
    bad = [i for i in impls if i not in NO_ALL_REDUCE]
    if bad:
      raise app.UsageError(f"--shard_of: only the impls {', '.join(NO_ALL_REDUCE)} measure "
                           f"one shard (no all-reduce); not {', '.join(bad)}")
    for p in presets:
      try:
        PRESETS[p].shard(shard_of)
      except ValueError as e:
        raise app.UsageError(f"--shard_of {shard_of} for {p}: {e}") from e
  if MV.value != "pallas" and tuple(MV_PRODUCTS.value) != model_lib.PALLAS_PRODUCTS:
    raise app.UsageError("--mv_products chooses among the Pallas products: it needs --mv=pallas")
  if MLP.value == "phases" and MV.value != "pallas":
    raise app.UsageError("--mlp=phases needs --mv=pallas")
  if TOKENS.value % CHUNK.value:
    raise app.UsageError(f"--tokens ({TOKENS.value}) must be a multiple of --chunk "
                         f"({CHUNK.value})")
  return Settings(
      presets=presets, batches=_ints(BATCHES.value or ["1"], "batches"), impls=impls,
      psum_flags=tuple(_FLAG_NAMES[f] for f in PSUM_FLAGS_F.value),
      flag_batches=_ints(FLAG_BATCHES.value, "flag_batches"), tokens=TOKENS.value,
      chunk=CHUNK.value, prompt=PROMPT.value, repeats=REPEATS.value, loop=LOOP.value,
      tp=TP.value, seed=SEED.value, flag_timeout=FLAG_TIMEOUT.value,
      shard_of=shard_of, attn=ATTN.value, mv=MV.value,
      mv_products=tuple(MV_PRODUCTS.value), mlp=MLP.value)


def main() -> int:
  gpu = host.gpu_present()
  if not gpu:
    changed = host.use_cpu(CPU_DEVICES.value)
    if changed:
      print("no GPU here: running on forced CPU devices (" + ", ".join(changed) + ")",
            flush=True)
  elif AUTOTUNE_CACHE.value and "autotune_cache_dir" not in os.environ.get("XLA_FLAGS", ""):
    os.makedirs(AUTOTUNE_CACHE.value, exist_ok=True)
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                               " --xla_gpu_per_fusion_autotune_cache_dir=" +
                               AUTOTUNE_CACHE.value).strip()
  n_gpus = host.gpu_count() if gpu else 0
  if gpu and one_gpu_default(n_gpus):
    print(f"tp_decode: {ONE_GPU_NOTE}", flush=True)
  s = settings_from_flags(gpu, n_gpus)
  t0 = time.perf_counter()
  # The flag baselines run first, before this process takes the GPUs' memory.
  baseline_rows, failures = [], []
  if gpu and s.psum_flags and "lax.psum" in s.impls:
    baseline_rows, failures = run_flag_baselines(s, s.presets)
  elif s.psum_flags and not gpu:
    print("lax.psum under XLA flags: skipped (the flags target XLA's GPU all-reduce)",
          flush=True)
  result = run(s, baseline_rows, failures)
  result["command"] = "python examples/tp_decode/main.py " + " ".join(sys.argv[1:])
  result["elapsed_s"] = time.perf_counter() - t0
  print_summary(result)
  if JSON_F.value:
    path = JSON_F.value
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  else:
    os.makedirs(OUT.value, exist_ok=True)
    tag = TAG.value or ("-" + "+".join(s.presets) + ("-sweep" if len(s.batches) > 1 else "")
                        + ("-python" if s.loop == "python" else "")
                        + (f"-shard{s.shard_of}" if s.shard_of else ""))
    name, n = report.stem("app", tag), 1
    stem = name
    while any(os.path.exists(os.path.join(OUT.value, stem + e)) for e in (".json", ".png")):
      n += 1  # result files are a record: never overwritten
      stem = f"{name}-{n}"
    path = os.path.join(OUT.value, stem + ".json")
  with open(path, "w") as f:
    json.dump(result, f, indent=1)
  saved = [path]
  if PLOT.value:
    try:
      png = os.path.splitext(path)[0] + ".png"
      plot(result, png)
      saved.append(png)
    except ImportError:
      print("matplotlib is not installed: no plot (pip install 'jax_llar[bench]')",
            file=sys.stderr)
  print(f"saved {', '.join(saved)} ({result['elapsed_s']:.0f} s in all)")
  # A row below its floor fails a GPU run (on CPU the floor is host memory's
  # and the forced devices share it: reported only).
  below = bool(result["below_floor"]) and gpu
  return 0 if result["tokens_agree"] and not below else 1


if __name__ == "__main__":
  _cli.run(main)
