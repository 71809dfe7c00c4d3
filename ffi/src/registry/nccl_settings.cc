#include "registry/nccl_settings.h"

#include <pwd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "errors.h"

namespace llar {
namespace {

// `text` for a message: bytes outside printable ASCII as \xNN, so that a
// value read from a file (its bytes need not be UTF-8) always reaches Python
// as a RuntimeError's text.
std::string Printable(const std::string& text) {
  std::string out;
  for (const unsigned char c : text) {
    if (c >= 0x20 && c < 0x7f && c != '\\') {
      out += static_cast<char>(c);
    } else {
      char hex[5];
      std::snprintf(hex, sizeof(hex), "\\x%02x", c);
      out += hex;
    }
  }
  return out;
}

}  // namespace

NcclSetting NcclSettingOf(const std::string& name, const std::vector<std::string>& files) {
  if (const char* v = std::getenv(name.c_str())) return {true, v, "the environment"};
  // NCCL 2.28's setEnvFile: getline, skip a line whose first byte is '#',
  // drop the final '\n', split at the first '=' (a line without one is
  // skipped), both sides read as C strings, at most 1023 bytes each, then
  // setenv(name, value, 0): the first line that sets a name wins.
  constexpr size_t kMaxPart = 1023;
  for (const std::string& path : files) {
    std::ifstream in(path, std::ios::binary);
    if (!in) continue;
    std::string line;
    while (std::getline(in, line)) {
      if (!line.empty() && line[0] == '#') continue;
      line.resize(std::min(line.size(), line.find('\0')));
      const size_t eq = line.find('=');
      if (eq == std::string::npos) continue;
      if (line.compare(0, std::min(eq, kMaxPart), name) != 0) continue;
      if (name.empty()) continue;  // setenv refuses an empty name
      return {true, line.substr(eq + 1, kMaxPart), path};
    }
  }
  return {};
}

std::vector<std::string> NcclConfFiles() {
  // NCCL 2.28's initEnvFunc: paths through a 1024-byte buffer.
  constexpr size_t kMaxPath = 1023;
  std::vector<std::string> files;
  const char* user = std::getenv("NCCL_CONF_FILE");
  if (user != nullptr && user[0] != '\0') {
    files.push_back(std::string(user).substr(0, kMaxPath));
  } else {
    struct passwd entry;
    struct passwd* found = nullptr;
    std::vector<char> buffer(16384);
    if (getpwuid_r(getuid(), &entry, buffer.data(), buffer.size(), &found) == 0 &&
        found != nullptr) {
      const std::string home = found->pw_dir != nullptr ? found->pw_dir : "";
      files.push_back((home + "/.nccl.conf").substr(0, kMaxPath));
    }
  }
  files.push_back("/etc/nccl.conf");
  return files;
}

int64_t NcclIntValue(const std::string& value, int64_t fallback) {
  if (value.empty()) return fallback;
  errno = 0;
  const long long v = std::strtoll(value.c_str(), nullptr, 0);
  return errno != 0 ? fallback : static_cast<int64_t>(v);
}

// NCCL_COMM_BLOCKING=1 overrides ncclConfig_t::blocking = 0 (NCCL 2.28's
// parseCommConfig). A value in the environment may be the user's or one NCCL
// copied there from a configuration file (its first initialisation does
// setenv(name, value, 0) for each file's lines), so the message names both.
void RefuseForcedBlocking() {
  const NcclSetting blocking = NcclSettingOf("NCCL_COMM_BLOCKING", NcclConfFiles());
  if (!blocking.found || NcclIntValue(blocking.value, /*fallback=*/0) != 1) return;
  const bool env = blocking.source == "the environment";
  Fail("jax_llar: NCCL_COMM_BLOCKING=" + Printable(blocking.value) + " (set " +
       (env ? std::string("in the environment: by the user, or copied there by NCCL "
                          "from one of its configuration files") :
              "in " + Printable(blocking.source) + ", one of NCCL's configuration files") +
       ") makes NCCL's set-up calls blocking, so a process that never joins could not be "
       "waited for with a bound; " +
       (env ? std::string("unset it, or remove it from NCCL's configuration file "
                          "($NCCL_CONF_FILE, ~/.nccl.conf, /etc/nccl.conf) and set "
                          "NCCL_COMM_BLOCKING=0 in the environment, which takes "
                          "precedence,") :
              std::string("remove it from that file (or set NCCL_COMM_BLOCKING=0 in the "
                          "environment, which takes precedence)")) +
       " to use jax_llar for replica groups that span processes");
}

}  // namespace llar
