"""The tune family: this machine's tuning tables.

  python -m jax_llar.tools.tune ...   (cli)

plan (what to measure and the verdicts), tables (building and writing the
tables from measurements).
"""
