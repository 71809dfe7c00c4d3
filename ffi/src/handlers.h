// FFI handler entry points (defined in handlers.cc), handed to Python as
// capsules by module.cc.
#ifndef LLAR_HANDLERS_H_
#define LLAR_HANDLERS_H_

namespace llar {

struct HandlerTable {
  void* all_reduce_instantiate;
  void* all_reduce_execute;
  void* copy_execute;
  void* wide_copy_execute;  // diagnostic twin of copy_execute (copy.cu)
};

HandlerTable GetHandlers();

}  // namespace llar

#endif  // LLAR_HANDLERS_H_
