#pragma once
/// mpt's one logger: the library's messages (warnings, hints, notes) go through it, never straight to
/// std::cerr. Levels as Python's logging: messages below the current level are dropped; the level
/// starts from the MPT_LOG_LEVEL environment variable (debug, info, warning, error, off; default info).
/// The default sink writes "mpt: <message>" lines to std::cerr.
///
///   mpt::set_log_level(mpt::LogLevel::error);                  // silence warnings and notes
///   mpt::set_log_sink([](mpt::LogLevel level, const std::string& message) {
///     my_logger.write(mpt::to_string(level), message);         // or collect them in a test
///   });
///   mpt::set_log_sink(nullptr);                                 // back to std::cerr
///   mpt::log(mpt::LogLevel::warning, "ModelCheckpoint: ", monitor, " is not available");
#include <functional>
#include <optional>
#include <string>
#include <string_view>

#include "mpt/error.hpp"

namespace mpt {

enum class LogLevel { debug, info, warning, error, off };

/// Receives every message at or above the current level, without the "mpt: " prefix or a newline.
using LogSink = std::function<void(LogLevel, const std::string&)>;

void set_log_level(LogLevel level);
LogLevel log_level();
/// Replaces the sink; an empty function restores the default (std::cerr, "mpt: " prefix).
void set_log_sink(LogSink sink);
bool log_enabled(LogLevel level);

/// "debug", "info", "warning" (or "warn"), "error", "off", in any case; nullopt for anything else.
std::optional<LogLevel> parse_log_level(std::string_view text);
const char* to_string(LogLevel level);

/// Sends one message (a single line) to the sink if `level` is enabled.
void log(LogLevel level, const std::string& message);

/// Streams the arguments into one message, only when `level` is enabled.
template <class... Args>
void log(LogLevel level, const Args&... args) {
  if (log_enabled(level)) log(level, detail::cat(args...));
}

namespace detail {
/// The level MPT_LOG_LEVEL asks for now: info when unset; info and a warning when not a level name.
LogLevel log_level_from_env();
}  // namespace detail

}  // namespace mpt
