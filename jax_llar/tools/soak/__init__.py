"""The soak family: millions of checked calls.

  python -m jax_llar.tools.soak ...   (cli)

run (the soak's loop and its checks).
"""
