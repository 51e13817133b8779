#include <cstdlib>
#include <iostream>
#include <sstream>
#include <utility>
#include <vector>

#include <doctest/doctest.h>

#include "mpt/log.hpp"

namespace {

/// Collects the logger's messages while alive, and restores the level and the default sink after.
class LogCapture {
 public:
  LogCapture() : old_level_(mpt::log_level()) {
    mpt::set_log_sink([this](mpt::LogLevel level, const std::string& m) { seen.emplace_back(level, m); });
  }
  ~LogCapture() {
    mpt::set_log_sink(nullptr);
    mpt::set_log_level(old_level_);
  }
  std::vector<std::pair<mpt::LogLevel, std::string>> seen;

 private:
  mpt::LogLevel old_level_;
};

}  // namespace

TEST_CASE("log: messages below the level are dropped") {
  using mpt::LogLevel;
  LogCapture cap;
  mpt::set_log_level(LogLevel::warning);
  mpt::log(LogLevel::debug, "d");
  mpt::log(LogLevel::info, "i");
  mpt::log(LogLevel::warning, "w ", 1);
  mpt::log(LogLevel::error, "e ", 2.5);
  REQUIRE(cap.seen.size() == 2);
  CHECK(cap.seen[0] == std::pair{LogLevel::warning, std::string("w 1")});
  CHECK(cap.seen[1] == std::pair{LogLevel::error, std::string("e 2.5")});

  mpt::set_log_level(LogLevel::debug);
  CHECK(mpt::log_enabled(LogLevel::debug));
  mpt::log(LogLevel::debug, "d");
  CHECK(cap.seen.size() == 3);

  mpt::set_log_level(LogLevel::off);
  mpt::log(LogLevel::error, "e");
  CHECK(cap.seen.size() == 3);
  CHECK_FALSE(mpt::log_enabled(LogLevel::error));
}

TEST_CASE("log: the default sink writes 'mpt: ' lines to std::cerr") {
  const mpt::LogLevel old = mpt::log_level();
  mpt::set_log_sink(nullptr);
  mpt::set_log_level(mpt::LogLevel::info);
  std::ostringstream buf;
  std::streambuf* saved = std::cerr.rdbuf(buf.rdbuf());
  mpt::log(mpt::LogLevel::warning, "ModelCheckpoint: ", "val_loss", " is not available");
  mpt::log(mpt::LogLevel::debug, "hidden");
  std::cerr.rdbuf(saved);
  mpt::set_log_level(old);
  CHECK(buf.str() == "mpt: ModelCheckpoint: val_loss is not available\n");
}

TEST_CASE("log: level names and MPT_LOG_LEVEL") {
  using mpt::LogLevel;
  CHECK(mpt::parse_log_level("debug") == LogLevel::debug);
  CHECK(mpt::parse_log_level("INFO") == LogLevel::info);
  CHECK(mpt::parse_log_level("Warning") == LogLevel::warning);
  CHECK(mpt::parse_log_level("warn") == LogLevel::warning);
  CHECK(mpt::parse_log_level("error") == LogLevel::error);
  CHECK(mpt::parse_log_level("off") == LogLevel::off);
  CHECK_FALSE(mpt::parse_log_level("loud").has_value());
  CHECK(std::string(mpt::to_string(LogLevel::warning)) == "warning");

  const char* saved = std::getenv("MPT_LOG_LEVEL");
  const std::string old = saved ? saved : "";
  ::unsetenv("MPT_LOG_LEVEL");
  CHECK(mpt::detail::log_level_from_env() == LogLevel::info);
  ::setenv("MPT_LOG_LEVEL", "ERROR", 1);
  CHECK(mpt::detail::log_level_from_env() == LogLevel::error);
  ::setenv("MPT_LOG_LEVEL", "off", 1);
  CHECK(mpt::detail::log_level_from_env() == LogLevel::off);
  ::setenv("MPT_LOG_LEVEL", "loud", 1);
  std::ostringstream buf;
  std::streambuf* cerr_buf = std::cerr.rdbuf(buf.rdbuf());
  CHECK(mpt::detail::log_level_from_env() == LogLevel::info);
  std::cerr.rdbuf(cerr_buf);
  CHECK(buf.str().find("MPT_LOG_LEVEL='loud'") != std::string::npos);
  if (saved) ::setenv("MPT_LOG_LEVEL", old.c_str(), 1);
  else ::unsetenv("MPT_LOG_LEVEL");
}
