"""Kernel variants through the native kernel bench, bitwise against the
reference: the production one-shot kernel, the run-time world-size kernel
(groups of other than 2, 4 or 8 ranks), the grid rule with 256 lines per
block, the run-time world-size kernel with 128 lines per block, the
send-and-loopback diagnostic, and the one-shot compiled without call
signatures and run with signature 0 (the kernel level's measure of what
signatures cost; each run after the signed ones on the same scratch and
epoch counters); 50 calls per graph, one replay.

    python kernel_variants.py DTYPE      (float32, bfloat16 or float16)

Runs in a process of its own: the bench advances the communicator set's
epoch counters with grid rules that XLA programs do not use.

Prints {"checked" (variant, size) pairs, "failures" (at most 10 strings)}.
"""

import sys

import jax
import ml_dtypes
import numpy as np

from jax_llar import algorithms, comm, testing
from jax_llar.tools import _native
from jax_llar.tools.bench import kernel_level as kernel_level
from jax_llar.tools.bench.kernel_level import KERNEL_IMPLS, KernelImpl

from _prelude import emit

VARIANTS = {
    "one_shot_ll": KERNEL_IMPLS[algorithms.Algorithm.ONE_SHOT_LL.impl],
    "generic": KERNEL_IMPLS["diag.one_shot_ll_generic"],
    "b256": KERNEL_IMPLS["diag.one_shot_ll_b256"],
    "generic_b128": KernelImpl("one_shot_ll", generic=True, block_lines=128),
    "send_loopback": KERNEL_IMPLS["diag.one_shot_ll_send_loopback"],
    "unsigned": KERNEL_IMPLS["diag.one_shot_ll_unsigned"],
    "sig0": KERNEL_IMPLS["diag.one_shot_ll_sig0"],
}

dtype = np.dtype(ml_dtypes.bfloat16) if sys.argv[1] == "bfloat16" else np.dtype(sys.argv[1])
tools = _native.require("the kernel-variant program")
devices = jax.devices()
cs = comm.get_or_create([[d.local_hardware_id for d in devices]])
rng = np.random.default_rng(7)
checked, failures = 0, []
for n in (1, 3, 255, 1025, 4096 // dtype.itemsize + 1, 32768 + 3):
  inputs = [testing.random_array(rng, (n,), dtype) for _ in devices]
  for name, spec in VARIANTS.items():
    _, outs = kernel_level.bench(tools, cs.comm_id, spec, inputs, 50, 1)
    want = kernel_level.expected(spec, inputs, dtype)
    checked += 1
    for r, o in enumerate(outs):
      if not testing.bitwise_equal(o, want[r]):
        failures.append(f"{name}, n={n}, rank {r}")
emit({"checked": checked, "failures": failures[:10]})
