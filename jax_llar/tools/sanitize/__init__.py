"""The sanitize family: every production kernel under compute-sanitizer.

  python -m jax_llar.tools.sanitize ...   (cli)

harness (the units, the commands, the verdicts).
"""
