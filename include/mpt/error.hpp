#pragma once
/// mpt::Error: the one exception type the library throws for bad input and failed calls.
///
///   try { mpt::ops::matmul(a, b); }
///   catch (const mpt::Error& e) { std::cerr << e.what(); }  // "matmul: inner dimensions ..."
#include <sstream>
#include <stdexcept>
#include <string>

namespace mpt {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};

namespace detail {
template <class... Args>
std::string cat(const Args&... args) {
  std::ostringstream os;
  (os << ... << args);
  return os.str();
}
}  // namespace detail

/// Throws mpt::Error with the streamed arguments as message.
template <class... Args>
[[noreturn]] void fail(const Args&... args) {
  throw Error(detail::cat(args...));
}

}  // namespace mpt

#define MPT_CHECK(cond, ...)                 \
  do {                                       \
    if (!(cond)) ::mpt::fail(__VA_ARGS__);   \
  } while (0)
