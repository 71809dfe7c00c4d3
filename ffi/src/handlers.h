// FFI handlers of the all-reduce (defined in handlers.cc), handed to Python
// as capsules by module.cc.
#ifndef LLAR_HANDLERS_H_
#define LLAR_HANDLERS_H_

#include "api.h"

namespace llar {

struct AllReduceHandlers {
  void* instantiate;
  void* execute;
};

LLAR_API AllReduceHandlers GetAllReduceHandlers();

}  // namespace llar

#endif  // LLAR_HANDLERS_H_
