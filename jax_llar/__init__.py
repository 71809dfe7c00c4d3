"""jax_llar: low-latency all-reduce for JAX.

``jax_llar.psum(x, axis_name)`` is ``lax.psum`` for code inside a jitted
``jax.shard_map``. On CUDA GPUs that are NVLink peers, small psums run as a
barrier-free one-shot LL all-reduce (arXiv 2607.16100) through an XLA FFI
custom call that XLA captures into its CUDA graph; every other psum lowers
like ``lax.psum``, with the reason logged once. ``jax_llar.swap_psum()``
makes ``jax.lax.psum`` mean ``jax_llar.psum`` in code traced inside it.
The README says which psums take the fast path and how fast it is.

Public API:
  psum, swap_psum          the all-reduce, and the swap for existing code
  dispatch_log, clear_dispatch_log, Decision
                           what each psum did, and why
  status, error_reports    the extension in this process; timeout reports
  explain                  psums that sit in rolled loops (no compilation)
  config                   settings (``config.settings``)
  Algorithm                the kernels, by FFI id
  llar_psum_p              the primitive
"""

from jax_llar import config
from jax_llar.algorithms import Algorithm
from jax_llar.explain import explain
from jax_llar.log import Decision, clear_dispatch_log, dispatch_log
from jax_llar.psum import llar_psum_p, psum
from jax_llar.status import error_reports, status
from jax_llar.swap import swap_psum

__version__ = "0.1.0"

__all__ = [
    "Algorithm",
    "Decision",
    "clear_dispatch_log",
    "config",
    "dispatch_log",
    "error_reports",
    "explain",
    "llar_psum_p",
    "psum",
    "status",
    "swap_psum",
]
