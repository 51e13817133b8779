#include "mpt/log.hpp"

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cstdlib>
#include <iostream>
#include <memory>
#include <mutex>

namespace mpt {
namespace {

std::atomic<LogLevel>& level_ref() {
  static std::atomic<LogLevel> level{detail::log_level_from_env()};
  return level;
}

std::mutex& sink_mutex() {
  static std::mutex m;
  return m;
}

std::shared_ptr<const LogSink>& sink_ref() {
  static std::shared_ptr<const LogSink> sink;
  return sink;
}

}  // namespace

namespace detail {
LogLevel log_level_from_env() {
  const char* env = std::getenv("MPT_LOG_LEVEL");
  if (!env || !*env) return LogLevel::info;
  if (auto level = parse_log_level(env)) return *level;
  // Written directly: the logger's own level is being decided here.
  std::cerr << "mpt: MPT_LOG_LEVEL='" << env << "' is not one of debug, info, warning, error, off; using info\n";
  return LogLevel::info;
}
}  // namespace detail

std::optional<LogLevel> parse_log_level(std::string_view text) {
  std::string s(text);
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  if (s == "debug") return LogLevel::debug;
  if (s == "info") return LogLevel::info;
  if (s == "warning" || s == "warn") return LogLevel::warning;
  if (s == "error") return LogLevel::error;
  if (s == "off") return LogLevel::off;
  return std::nullopt;
}

const char* to_string(LogLevel level) {
  switch (level) {
    case LogLevel::debug: return "debug";
    case LogLevel::info: return "info";
    case LogLevel::warning: return "warning";
    case LogLevel::error: return "error";
    case LogLevel::off: return "off";
  }
  return "?";
}

void set_log_level(LogLevel level) { level_ref().store(level); }
LogLevel log_level() { return level_ref().load(); }
bool log_enabled(LogLevel level) { return level != LogLevel::off && level >= log_level(); }

void set_log_sink(LogSink sink) {
  std::lock_guard<std::mutex> lock(sink_mutex());
  sink_ref() = sink ? std::make_shared<const LogSink>(std::move(sink)) : nullptr;
}

void log(LogLevel level, const std::string& message) {
  if (!log_enabled(level)) return;
  std::shared_ptr<const LogSink> sink;
  {
    std::lock_guard<std::mutex> lock(sink_mutex());
    sink = sink_ref();
  }
  // Called outside the lock, so a sink may itself log or replace the sink.
  if (sink) {
    (*sink)(level, message);
    return;
  }
  std::lock_guard<std::mutex> lock(sink_mutex());  // whole lines from concurrent threads
  std::cerr << "mpt: " + message + "\n";
}

}  // namespace mpt
