"""Tools that measure and check jax_llar; the library never imports them.

Command-line programs (each on ``absl.app`` / ``absl.flags``; ``--help`` lists
their flags); a family is a package whose ``cli`` module is its command line:

  python -m jax_llar.tools.bench --level jax      per-step time of jitted chains
  python -m jax_llar.tools.bench --level kernel   per-call time of the kernels
  python -m jax_llar.tools.loopback               every world size simulated on one GPU
  python -m jax_llar.tools.sanitize               the kernels under compute-sanitizer
  python -m jax_llar.tools.tune                   this machine's tuning tables
  python -m jax_llar.tools.soak                   millions of checked calls
  python -m jax_llar.tools.sol                    speed-of-light probes
  python -m jax_llar.tools.graphcheck             is the custom call in a CUDA graph?
  python -m jax_llar.tools.store_atomicity        do 128-byte warp stores arrive whole?
  python -m jax_llar.tools.launch                 one process per GPU

Families' modules without flags, for use from tests and other programs:
`bench.jax_level`, `bench.kernel_level`, `bench.loop_level`,
`loopback.harness`, `loopback.fused`, `loopback.group`, `loopback.xla`,
`sanitize.harness`, `tune.plan`, `tune.tables`, `soak.run`; and `report`,
`traces`, `capture`, `copy`, `host`. The native part (kernel bench, speed-of-light probes, call trace,
test hooks, loopback harness) is the extension module
``jax_llar.tools._llar_tools``, loaded by `_native.load`.
The method behind the figures is described in benchmarks/METHOD.md in the
repository.
"""
