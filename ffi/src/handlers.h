// FFI handlers of the all-reduce and of the fused all-reduce + residual add
// + RMSNorm (defined in handlers.cc), handed to Python as capsules by
// module.cc.
#ifndef LLAR_HANDLERS_H_
#define LLAR_HANDLERS_H_

#include "api.h"

namespace llar {

struct AllReduceHandlers {
  void* instantiate;
  void* execute;
};

LLAR_API AllReduceHandlers GetAllReduceHandlers();   // jax_llar_all_reduce
LLAR_API AllReduceHandlers GetAddRmsNormHandlers();  // jax_llar_all_reduce_add_rms_norm

}  // namespace llar

#endif  // LLAR_HANDLERS_H_
