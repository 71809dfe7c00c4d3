"""The bench family: the all-reduce measured at three levels.

  python -m jax_llar.tools.bench --level jax|kernel|loop   (cli)

jax_level (jitted programs), kernel_level (the kernels alone, through the
tools module), loop_level (a whole loop of calls).
"""
