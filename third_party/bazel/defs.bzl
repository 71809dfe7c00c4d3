"""Build macros of jax_llar's Bazel build, named after their counterparts in
JAX's and XLA's Bazel rules (cuda_library; nanobind_extension as in
xla/tsl's and JAX's jaxlib BUILD files), kept small enough to work with
Bazel 4 offline (Debian's bazel-bootstrap) and without rules_cuda:

  cuda_library(name, srcs, hdrs, deps, copts)
      Compiles each .cu of `srcs` with the toolkit's nvcc
      (@jax_llar_deps//:build_info.bzl NVCC) into a position-independent
      object, with the flags of ffi/CMakeLists.txt, and wraps the objects in
      a cc_library with `deps`.
  nanobind_extension(name, srcs, deps)
      A Python extension module `name`.so: `srcs` with nanobind compiled in
      statically (NB_STATIC, as nanobind_add_module in the CMake build).
"""

load("@jax_llar_deps//:build_info.bzl", "NVCC")

# The CUDA architectures the CMake build compiles for with nvcc >= 12.8.
CUDA_ARCHITECTURES = ["90", "100"]

# ffi/CMakeLists.txt: LLAR_CUDA_CODEGEN_OPTIONS and the CXX settings.
_NVCC_FLAGS = [
    "-std=c++17",
    "-O3",
    "-DNDEBUG",
    "--expt-relaxed-constexpr",
    "-ftz=false",
    "-prec-div=true",
    "-prec-sqrt=true",
    "-Xcompiler=-fPIC",
    "-Xcompiler=-fvisibility=hidden",
    "-Xcompiler=-fvisibility-inlines-hidden",
]

def _gencode():
    return ["-gencode=arch=compute_%s,code=sm_%s" % (a, a) for a in CUDA_ARCHITECTURES]

def cuda_library(name, srcs, hdrs = [], includes = [], deps = [], copts = [], **kwargs):
    objs = []
    for src in srcs:
        stem = src.replace("/", "_").replace(".cu", "")
        obj = "_objs/%s/%s.pic.o" % (name, stem)
        native.genrule(
            name = "%s_%s_nvcc" % (name, stem),
            srcs = [src] + hdrs + ["@jax_llar_deps//:cuda_compile_inputs"],
            outs = [obj],
            cmd = " ".join([NVCC, "-c", "$(location %s)" % src, "-o", "$@"] + _NVCC_FLAGS +
                           _gencode() + copts + ["-I" + i for i in includes] + [
                "-Iexternal/jax_llar_deps/nccl/include",
                "-isystem external/jax_llar_deps/xla_ffi",
            ]),
            # nvcc reads the toolkit it belongs to (outside the workspace).
            tags = ["no-sandbox"],
        )
        objs.append(obj)
    native.cc_library(
        name = name,
        srcs = objs,
        hdrs = hdrs,
        deps = deps,
        alwayslink = True,
        **kwargs
    )

def nanobind_extension(name, srcs, deps = [], copts = [], linkopts = [], **kwargs):
    native.cc_binary(
        name = name + ".so",
        srcs = srcs,
        deps = deps + [
            "@jax_llar_deps//:nanobind",
            "@jax_llar_deps//:python_headers",
        ],
        copts = copts + ["-fvisibility=hidden", "-fvisibility-inlines-hidden"],
        linkshared = True,
        linkopts = linkopts,
        **kwargs
    )
