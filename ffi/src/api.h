// LLAR_API marks what the core library (libllar_core.so) exports to the two
// Python modules that link it, jax_llar._llar (src/module.cc) and
// jax_llar.tools._llar_tools (tools/module.cc). Everything else in the
// library is hidden.
#ifndef LLAR_API_H_
#define LLAR_API_H_

#define LLAR_API __attribute__((visibility("default")))

#endif  // LLAR_API_H_
