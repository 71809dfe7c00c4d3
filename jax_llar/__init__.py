"""jax_llar: low-latency all-reduce for JAX.

``jax_llar.psum(x, axis_name)`` is ``lax.psum`` for code inside a jitted
``jax.shard_map``. On CUDA GPUs that are NVLink peers, small psums run as a
barrier-free one-shot LL all-reduce (arXiv 2607.16100) through an XLA FFI
custom call that XLA captures into its CUDA graph; every other psum lowers
like ``lax.psum``, with the reason logged once. jax_llar provides the
lowering of JAX's own psum primitives: ``jax_llar.swap_psum()`` sends every
psum traced inside it (``lax.psum``, ``lax.pmean``, gradients, library code)
through the same dispatch, and ``jax_llar.install()`` (or
``JAX_LLAR_SWAP=1``) every psum of the process. The README says which psums
take the fast path and how fast it is.

Public API:
  psum                     the all-reduce (``lax.psum``, marked for jax_llar)
  psum_add_rms_norm        the all-reduce, residual add and RMSNorm as one op
  swap_psum, install, uninstall, installed
                           the swap for existing code: a region, the process
  dispatch_log, clear_dispatch_log, Decision
                           what each psum did, and why
  status, error_reports    the extension in this process; timeout reports
  explain                  psums that sit in rolled loops (no compilation)
  config                   settings (``config.settings``)
  Algorithm                the kernels, by FFI id
"""

from jax_llar import config
from jax_llar.algorithms import Algorithm
from jax_llar.explain import explain
from jax_llar.fused import psum_add_rms_norm
from jax_llar.log import Decision, clear_dispatch_log, dispatch_log
from jax_llar import lowering as _lowering
from jax_llar.psum import psum
from jax_llar.status import error_reports, status
from jax_llar.swap import install, installed, swap_psum, uninstall

__version__ = "0.2.0"

# Importing jax_llar.lowering registered the lowering rules of JAX's psum
# primitives; without them jax_llar.psum and the swaps would do nothing.
if not all(_lowering.rules_active().values()):
  raise ImportError("jax_llar: registering the lowering rules of JAX's psum "
                    "primitives failed")

__all__ = [
    "Algorithm",
    "Decision",
    "clear_dispatch_log",
    "config",
    "dispatch_log",
    "error_reports",
    "explain",
    "install",
    "installed",
    "psum",
    "psum_add_rms_norm",
    "status",
    "swap_psum",
    "uninstall",
]
