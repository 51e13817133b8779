#pragma once
// Shared by the libFuzzer targets: the input as a file (the readers take paths), and the one
// outcome besides success that a reader may have: an mpt::Error. Anything else (a crash, a
// sanitizer report, another exception type, a hang) fails the fuzz run.
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <string>

#include <mpt/mpt.hpp>

namespace mpt::fuzz {

/// Writes the input to a per-process file with the given suffix (the readers tell formats
/// apart by content, some by name) and returns its path.
inline std::string as_file(const std::uint8_t* data, std::size_t size, const std::string& suffix) {
  static const std::string dir = [] {
    const char* t = std::getenv("TMPDIR");
    return std::string(t && *t ? t : "/tmp");
  }();
  const std::string path = dir + "/mpt-fuzz-" + std::to_string(::getpid()) + suffix;
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) std::abort();
  if (size > 0 && std::fwrite(data, 1, size, f) != size) std::abort();
  std::fclose(f);
  return path;
}

/// Runs f; mpt::Error is an accepted outcome, any other exception aborts (a finding).
template <class F>
void expect_clean(F&& f) {
  try {
    f();
  } catch (const mpt::Error&) {
  }
}

}  // namespace mpt::fuzz
