"""Tools that measure and check jax_llar; the library never imports them.

Command-line programs (each on ``absl.app`` / ``absl.flags``; ``--help`` lists
their flags):

  python -m jax_llar.tools.bench --level jax      per-step time of jitted chains
  python -m jax_llar.tools.bench --level kernel   per-call time of the kernels
  python -m jax_llar.tools.sol                    speed-of-light probes
  python -m jax_llar.tools.graphcheck             is the custom call in a CUDA graph?
  python -m jax_llar.tools.loopback               every world size simulated on one GPU

Modules without flags, for use from tests and other programs: `jax_level`,
`kernel_level`, `loopback_harness`, `report`, `traces`, `capture`, `copy`,
`host`. The native part (kernel bench, speed-of-light probes, call trace,
test hooks, loopback harness) is the extension module
``jax_llar.tools._llar_tools``, loaded by `_native.load`.
The method behind the figures is described in benchmarks/METHOD.md in the
repository.
"""
