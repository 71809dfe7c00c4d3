// NCCL's settings as NCCL 2.28 reads them (src/misc/param.cc): the process
// environment, then NCCL's configuration files. The registry's checks read
// them (RefuseForcedBlocking); jax_llar._llar binds the first three.
// None of these makes a CUDA or NCCL call.
#ifndef LLAR_REGISTRY_NCCL_SETTINGS_H_
#define LLAR_REGISTRY_NCCL_SETTINGS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "api.h"

namespace llar {

// Setting `name`: the environment first (a variable that is set wins, even
// empty), else the first line `NAME=VALUE` for it in `files`, in order (the
// first file that sets it wins, and within a file its first line). A file
// line is NAME, '=', VALUE with nothing trimmed; lines starting with '#' and
// lines without '=' are skipped. An NCCL environment plugin (NCCL_ENV_PLUGIN)
// is not consulted.
struct NcclSetting {
  bool found = false;
  std::string value;
  std::string source;  // "the environment" or the file's path
};
LLAR_API NcclSetting NcclSettingOf(const std::string& name,
                                   const std::vector<std::string>& files);

// NCCL's configuration files, highest precedence first: $NCCL_CONF_FILE when
// set and not empty, else ~/.nccl.conf (the home directory of the password
// database's entry for this user, not $HOME); then /etc/nccl.conf.
LLAR_API std::vector<std::string> NcclConfFiles();

// NCCL's integer reading of a value (strtoll, base 0: "1", " 1", "0x1" and
// "1abc" are all 1); `fallback` for an empty value or one out of range.
LLAR_API int64_t NcclIntValue(const std::string& value, int64_t fallback);

// Throws std::runtime_error, saying where it is set and how to undo it, when
// NCCL_COMM_BLOCKING=1 (environment or files) would make the set-up calls of
// a spanning group blocking, which no bound could then end.
void RefuseForcedBlocking();

}  // namespace llar

#endif  // LLAR_REGISTRY_NCCL_SETTINGS_H_
