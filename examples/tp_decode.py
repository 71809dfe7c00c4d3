"""Tensor-parallel decode, lax.psum vs jax_llar.psum (the main job as a script).

    python examples/tp_decode.py --preset llama3-8b-4l --tokens 64 --batch 1

Same flags as ``python -m jax_llar.demo``; see jax_llar/demo.py for the model.
"""

import sys

from jax_llar import demo

if __name__ == "__main__":
  sys.exit(demo.main())
