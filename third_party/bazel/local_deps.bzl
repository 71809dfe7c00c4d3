"""The repository rule that finds jax_llar's native dependencies on this machine.

jax_llar builds against what a JAX user already has installed, as its CMake
build does (ffi/CMakeLists.txt): the XLA FFI headers of the installed jaxlib,
the NCCL headers and libnccl.so.2 of the nvidia-nccl-cu13 (or -cu12) wheel,
nanobind's sources, Python's headers and the CUDA toolkit of `nvcc`. Like
JAX's and XLA's own configure rules (python_configure, cuda_configure), it
asks the interpreter named by PYTHON_BIN_PATH (default: python3 on PATH) where
they are and finds nvcc through CUDA_PATH, CUDA_HOME or PATH, then links them
into one external repository, @jax_llar_deps, with these targets:

  :python_headers  :nanobind  :xla_ffi  :nccl  :cuda  (cc_library)
  :cuda_compile_inputs  the headers an nvcc compile reads (a filegroup)
  build_info.bzl   NCCL_VERSION_CODE, CUDA_VERSION, JAXLIB_VERSION, XLA_FFI_API_VERSION, NVCC (the
                   toolkit's nvcc, an absolute path: the build is local)

Nothing is downloaded; a missing piece fails the fetch with what to install.
"""

_FIND = """
import json, os, sys, sysconfig
out = {"python_include": sysconfig.get_paths()["include"]}
try:
    import nanobind
    out["nanobind"] = os.path.dirname(nanobind.__file__)
except ImportError:
    sys.exit("nanobind is not installed (pip install nanobind)")
try:
    import jaxlib, jaxlib.version
    out["xla_ffi"] = os.path.join(os.path.dirname(jaxlib.__file__), "include")
    out["jaxlib_version"] = jaxlib.version.__version__
except ImportError:
    sys.exit("jaxlib is not installed (pip install 'jax[cuda13]')")
import importlib.util
spec = importlib.util.find_spec("nvidia.nccl")
if spec is None:
    sys.exit("the NCCL wheel is not installed (pip install nvidia-nccl-cu13)")
out["nccl"] = list(spec.submodule_search_locations)[0]
print(json.dumps(out))
"""

def _fail(what):
    fail("jax_llar_local_deps: " + what)

def _nvcc(rctx):
    for var in ("CUDA_PATH", "CUDA_HOME"):
        root = rctx.os.environ.get(var)
        if root:
            p = rctx.path(root + "/bin/nvcc")
            if p.exists:
                return p
    p = rctx.which("nvcc")
    if p == None:
        _fail("nvcc not found (set CUDA_PATH or put nvcc on PATH)")
    return p

def _cuda_root(rctx, nvcc):
    """The toolkit of `nvcc` (PATH may hold a wrapper script): nvcc's TOP."""
    r = rctx.execute([nvcc, "--dryrun", "-E", "-x", "cu", "/dev/null"])
    for line in (r.stderr + "\n" + r.stdout).splitlines():
        if line.startswith("#$ TOP="):
            top = line[len("#$ TOP="):].strip()
            if top.endswith("/bin/.."):
                top = top[:-len("/bin/..")]
            return rctx.path(top)
    return nvcc.dirname.dirname

def _nccl_version_code(rctx, header):
    for line in rctx.read(header).splitlines():
        parts = [w for w in line.replace("\t", " ").split(" ") if w]
        if len(parts) == 3 and parts[0] == "#define" and parts[1] == "NCCL_VERSION_CODE":
            return parts[2]
    _fail("no NCCL_VERSION_CODE in " + str(header))

def _ffi_api_version(rctx, header):
    """(major, minor) of XLA_FFI_API_MAJOR/MINOR in jaxlib's c_api.h, as text."""
    found = {}
    for line in rctx.read(header).splitlines():
        parts = [w for w in line.replace("\t", " ").split(" ") if w]
        if len(parts) == 3 and parts[0] == "#define" and parts[1] in (
                "XLA_FFI_API_MAJOR", "XLA_FFI_API_MINOR"):
            found[parts[1]] = parts[2]
    if len(found) != 2:
        _fail("no XLA_FFI_API_MAJOR/MINOR in " + str(header))
    return "(%s, %s)" % (found["XLA_FFI_API_MAJOR"], found["XLA_FFI_API_MINOR"])

def _cuda_version(rctx, nvcc):
    r = rctx.execute([nvcc, "--version"])
    if r.return_code != 0:
        _fail("nvcc --version failed: " + r.stderr)
    for line in r.stdout.splitlines():
        if "release" in line:
            # "Cuda compilation tools, release 13.0, V13.0.88"
            return line.split("V")[-1].strip()
    _fail("no release in nvcc --version")

def _impl(rctx):
    python = rctx.os.environ.get("PYTHON_BIN_PATH") or "python3"
    r = rctx.execute([python, "-c", _FIND])
    if r.return_code != 0:
        _fail((r.stderr or r.stdout).strip() + " (interpreter: " + python + ")")
    paths = json.decode(r.stdout)
    nvcc = _nvcc(rctx)
    cuda = _cuda_root(rctx, nvcc)
    rctx.symlink(paths["python_include"], "python_include")
    rctx.symlink(paths["nanobind"], "nanobind")
    rctx.symlink(paths["xla_ffi"], "xla_ffi")
    rctx.symlink(paths["nccl"], "nccl")
    rctx.symlink(cuda, "cuda")
    if not rctx.path("nccl/include/nccl_device.h").exists:
        _fail("NCCL >= 2.28.9 headers not found in " + paths["nccl"])
    if not rctx.path("xla_ffi/xla/ffi/api/ffi.h").exists:
        _fail("jaxlib's XLA FFI headers not found in " + paths["xla_ffi"])
    rctx.file("build_info.bzl", "\n".join([
        "NCCL_VERSION_CODE = \"%s\"" % _nccl_version_code(rctx, rctx.path("nccl/include/nccl.h")),
        "CUDA_VERSION = \"%s\"" % _cuda_version(rctx, nvcc),
        "JAXLIB_VERSION = \"%s\"" % paths["jaxlib_version"],
        "XLA_FFI_API_VERSION = \"%s\"" % _ffi_api_version(
            rctx, rctx.path("xla_ffi/xla/ffi/api/c_api.h")),
        # The toolkit's own nvcc, by absolute path (nvcc finds its toolkit
        # from where it is; a symlink in this repository would mislead it).
        "NVCC = \"%s/bin/nvcc\"" % cuda,
        "",
    ]))
    rctx.file("BUILD.bazel", _BUILD)

_BUILD = """
package(default_visibility = ["//visibility:public"])

exports_files(["build_info.bzl"])

cc_library(
    name = "python_headers",
    hdrs = glob(["python_include/**/*.h"]),
    includes = ["python_include"],
)

# nanobind, compiled into each extension (NB_STATIC, as nanobind_add_module
# does in the CMake build).
cc_library(
    name = "nanobind",
    srcs = ["nanobind/src/nb_combined.cpp"],
    hdrs = glob([
        "nanobind/include/**/*.h",
        "nanobind/src/*.h",
        "nanobind/ext/robin_map/include/**/*.h",
    ]),
    textual_hdrs = glob(["nanobind/src/*.cpp"], exclude = ["nanobind/src/nb_combined.cpp"]),
    copts = ["-fvisibility=hidden", "-fno-strict-aliasing", "-DNB_BUILD"],
    includes = ["nanobind/include", "nanobind/ext/robin_map/include"],
    deps = [":python_headers"],
)

cc_library(
    name = "xla_ffi",
    hdrs = glob(["xla_ffi/xla/ffi/api/*.h"]),
    includes = ["xla_ffi"],
)

cc_library(
    name = "nccl",
    hdrs = glob(["nccl/include/**/*.h"]),
    includes = ["nccl/include"],
    srcs = ["nccl/lib/libnccl.so.2"],
)

cc_library(
    name = "cuda",
    # CUDA 13 keeps CCCL (cub, thrust, libcu++: nv/target) in include/cccl.
    hdrs = glob(["cuda/include/**"]),
    includes = ["cuda/include", "cuda/include/cccl"],
    srcs = ["cuda/lib64/libcudart_static.a"],
    linkopts = ["-ldl", "-lrt", "-lpthread"],
)

filegroup(
    name = "cuda_compile_inputs",
    srcs = glob([
        "cuda/include/**",
        "cuda/bin/**",
        "cuda/nvvm/**",
        "nccl/include/**",
        "xla_ffi/xla/ffi/api/*.h",
    ]),
)
"""

jax_llar_local_deps = repository_rule(
    implementation = _impl,
    environ = ["PYTHON_BIN_PATH", "CUDA_PATH", "CUDA_HOME", "PATH"],
    local = True,
)
