"""Registers and spills of the example's Triton kernels, without a GPU: an aid
to issue 27's experiments (benchmarks/NOTES.md entries 82-83).

  python examples/tp_decode/ptx_regs.py --shapes=4096x7168,2048x4096 \\
      --phases=2x2048x2x1024x4x0x0,2x2048x2x512x4x0x0 [--matvec]

Lowers phases.mlp_phases (tiles as chain_bench.py's --phase_tiles: r1 x chunk1
x r2 x chunk2 x warps x held chunks x sleep_ns [x relay | x nosync]) and, with
--matvec, matvec.py's glu and down kernels (their TILES) for each D x F to
Triton IR as JAX does for an H200 (Pallas's GPU query answered with an H200,
so that no GPU is needed), compiles the IR with the `triton` package's
compiler for sm_90 and reads `ptxas -v`'s registers and spill stores.

Approximate: the `triton` package (pip install triton) need not be the
Triton jaxlib carries, so its pipeline can differ from the kernel XLA runs;
the PTX version line is lowered to what --ptxas accepts. The registers a
thread x threads a program bound the programs a multiprocessor holds (65536
registers on H100/H200).
"""

from __future__ import annotations

import re
import subprocess
import sys
import tempfile

from absl import app, flags

SHAPES = flags.DEFINE_list("shapes", ["4096x7168", "2048x4096"], "D x F of the MLPs.")
PHASES = flags.DEFINE_list("phases", ["2x2048x2x1024x4x0x0"], "phases.py tiles.")
MATVEC = flags.DEFINE_boolean("matvec", False, "Also matvec.py's glu and down kernels.")
PTXAS = flags.DEFINE_string("ptxas", "ptxas", "The ptxas to run (-arch=sm_90a).")
PTX_VERSION = flags.DEFINE_string("ptx_version", "9.0", "The .version the PTX is given.")


def _lower(fn, args) -> list[str]:
  """The Triton IR of each Pallas kernel fn(*args) lowers to, for an H200."""
  import jax
  from jax._src.pallas.triton import gpu_info, lowering, pallas_call_registration
  query = gpu_info.get_gpu_info
  gpu_info.get_gpu_info = lambda: gpu_info._get_gpu_info_impl(gpu_info.GpuVersion.H200)
  modules = []
  lower = lowering.lower_jaxpr_to_triton_module

  def spy(*a, **k):
    modules.append(lower(*a, **k))
    return modules[-1]
  pallas_call_registration.lowering.lower_jaxpr_to_triton_module = spy
  try:
    jax.jit(fn).trace(*args).lower(lowering_platforms=("cuda",))
  finally:
    pallas_call_registration.lowering.lower_jaxpr_to_triton_module = lower
    gpu_info.get_gpu_info = query
  return [str(m.module) for m in modules]


def _regs(ttir: str, warps: int) -> str:
  """ptxas -v's registers and spill stores of one kernel's Triton IR."""
  import triton
  from triton.backends.compiler import GPUTarget
  with tempfile.TemporaryDirectory() as tmp:
    src = f"{tmp}/k.ttir"
    with open(src, "w") as f:
      f.write(ttir)
    k = triton.compile(src, target=GPUTarget("cuda", 90, 32),
                       options={"num_warps": warps, "num_stages": 1})
    ptx = re.sub(r"^\.version \S+", f".version {PTX_VERSION.value}", k.asm["ptx"],
                 flags=re.M)
    with open(f"{tmp}/k.ptx", "w") as f:
      f.write(ptx)
    r = subprocess.run([PTXAS.value, "-v", "-arch=sm_90a", f"{tmp}/k.ptx", "-o",
                        f"{tmp}/k.cubin"], capture_output=True, text=True, check=True)
  regs = re.search(r"Used (\d+) registers", r.stderr).group(1)
  spill = re.search(r"(\d+) bytes spill stores", r.stderr).group(1)
  return f"{regs} registers, {spill} bytes spilled"


def main(argv):
  del argv
  sys.path.insert(0, __file__.rsplit("/", 1)[0])
  import jax.numpy as jnp
  import matvec
  import phases
  bf = jnp.bfloat16
  for shape in SHAPES.value:
    d, f = (int(v) for v in shape.split("x"))
    x = jnp.zeros((1, d), bf)
    wgu, wd = jnp.zeros((2 * f, d), bf), jnp.zeros((d, f), bf)
    for spec in PHASES.value:
      kw = phases.parse_tile(spec)
      fn = lambda x, wgu, wd, s, kw=kw: phases.mlp_phases(x, wgu, wd, s, 0, norm_eps=1e-5, **kw)
      [ttir] = _lower(fn, (x, wgu, wd, phases.sync_buffer(1)))
      print(f"D {d} F {f} phases {spec}: {_regs(ttir, kw['warps'])}", flush=True)
    if MATVEC.value:
      fn = lambda x, wgu, wd: matvec.matvec(
          matvec.matvec(x, wgu, norm_eps=1e-5, glu=True, round_first=True), wd)
      for name, ttir, t in zip(("glu", "down"), _lower(fn, (x, wgu, wd)),
                               (matvec.tile(f, d, True), matvec.tile(d, f))):
        print(f"D {d} F {f} matvec {name} {t}: {_regs(ttir, t.warps)}", flush=True)


if __name__ == "__main__":
  app.run(main)
