"""Run by `bazel run //:bazel_smoke` (BUILD.bazel), not by pytest: the
package as Bazel builds it imports, both native modules load and hand out
their FFI capsules, and the build record names what they were built with.
Makes no CUDA call (no GPU needed)."""

import importlib
import sys

# A pip install -e of jax_llar in the same Python (CI has one) redirects its
# imports to that install with a finder of scikit-build-core ahead of
# sys.path; drop it, so that the package comes from Bazel's runfiles.
sys.meta_path[:] = [f for f in sys.meta_path
                    if "editable" not in type(f).__module__ + type(f).__name__]
sys.path[:] = [p for p in sys.path if "site-packages/jax_llar" not in p]

llar = importlib.import_module("jax_llar._llar")
tools = importlib.import_module("jax_llar.tools._llar_tools")
info = importlib.import_module("jax_llar._build_info")

# The modules Bazel built (its runfiles), not an installed copy of the package.
for mod in (llar, tools, info):
  assert ".runfiles" in mod.__file__, (mod.__name__, mod.__file__)

targets = llar.registrations()
assert set(targets) == {"jax_llar_all_reduce", "jax_llar_all_reduce_add_rms_norm"}, targets
assert len(llar.nccl_unique_id.__doc__) > 0
assert info.NCCL_VERSION_CODE >= 22809, info.NCCL_VERSION_CODE
assert info.CUDA_VERSION and info.JAXLIB_VERSION, vars(info)
print("bazel_smoke: jax_llar._llar", sorted(targets), "NCCL", info.NCCL_VERSION_CODE,
      "CUDA", info.CUDA_VERSION, "jaxlib", info.JAXLIB_VERSION, file=sys.stderr)
