"""The loopback family: every rank of a group simulated on one GPU.

  python -m jax_llar.tools.loopback ...   (cli: the command line)

harness (the all-reduce cases), fused (the fused op's cases), group (a
loopback group behind FFI custom calls, for JAX programs), xla (the
command line's --op xla over it).
"""
