// Keras 3's progress bar: "  12/469 ━━━━━━━━━━━━━━━━━━━━ 4s 10ms/step - accuracy: 0.81 - loss: 0.52".
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <iostream>
#include <iomanip>
#include <sstream>

#include "mpt/callbacks.hpp"

namespace mpt::callbacks {
namespace {

double now() {
  using namespace std::chrono;
  return duration<double>(steady_clock::now().time_since_epoch()).count();
}

std::string format_time(double s) {
  char buf[32];
  if (s < 60) std::snprintf(buf, sizeof buf, "%.0fs", s);
  else if (s < 3600) std::snprintf(buf, sizeof buf, "%d:%02d", static_cast<int>(s) / 60, static_cast<int>(s) % 60);
  else std::snprintf(buf, sizeof buf, "%d:%02d:%02d", static_cast<int>(s) / 3600, static_cast<int>(s) / 60 % 60, static_cast<int>(s) % 60);
  return buf;
}

std::string format_per_step(double s) {
  char buf[32];
  if (s >= 1) std::snprintf(buf, sizeof buf, "%.0fs/step", s);
  else if (s >= 1e-3) std::snprintf(buf, sizeof buf, "%.0fms/step", s * 1e3);
  else std::snprintf(buf, sizeof buf, "%.0fus/step", s * 1e6);
  return buf;
}

// Bookkeeping entries that History and CSVLogger keep but the bar leaves out.
bool shown(const std::string& key) { return key != "learning_rate" && key != "skipped_steps" && key != "loss_scale"; }

}  // namespace

ProgbarLogger::ProgbarLogger(int verbose, std::int64_t steps, int epochs)
    : verbose_(verbose), steps_(steps), epochs_(epochs), tty_(isatty(fileno(stdout)) != 0) {}

void ProgbarLogger::on_epoch_begin(int epoch, const Logs&) {
  start_ = now(), last_render_ = 0;
  if (verbose_ == 1) std::cout << "Epoch " << epoch + 1 << "/" << epochs_ << std::endl;
}

bool ProgbarLogger::wants_batch_logs(std::int64_t batch) {
  if (verbose_ != 1 || !tty_) return redraw_ = false;
  const double t = now();
  redraw_ = batch + 1 >= steps_ || t - last_render_ >= 0.1;  // at most ten redraws a second
  if (redraw_) last_render_ = t;
  return redraw_;
}

void ProgbarLogger::on_train_batch_end(std::int64_t batch, const Logs& logs) {
  if (!redraw_) return;
  redraw_ = false;
  render(batch + 1, logs, false);
}

void ProgbarLogger::on_epoch_end(int epoch, Logs& logs) {
  if (verbose_ == 1) {
    render(steps_, logs, true);
    std::cout << std::endl;
  } else if (verbose_ == 2) {
    double elapsed = now() - start_;
    std::ostringstream os;
    os << "Epoch " << epoch + 1 << "/" << epochs_ << "\n"
       << steps_ << "/" << steps_ << " - " << format_time(elapsed) << " - "
       << format_per_step(elapsed / static_cast<double>(std::max<std::int64_t>(steps_, 1)));
    for (const auto& [k, v] : logs)
      if (shown(k)) os << " - " << k << ": " << std::fixed << std::setprecision(4) << v;
    std::cout << os.str() << std::endl;
  }
}

void ProgbarLogger::render(std::int64_t current, const Logs& logs, bool final) {
  const int width = 20;
  const double elapsed = now() - start_;
  const double per_step = elapsed / static_cast<double>(std::max<std::int64_t>(current, 1));
  const int digits = static_cast<int>(std::to_string(steps_).size());
  const int filled = static_cast<int>(width * static_cast<double>(current) / static_cast<double>(std::max<std::int64_t>(steps_, 1)));
  std::ostringstream os;
  os << (tty_ ? "\r" : "") << std::setw(digits) << current << "/" << steps_ << " ";
  if (tty_) os << "\x1b[1m";
  for (int i = 0; i < filled; ++i) os << "━";
  if (tty_) os << "\x1b[0m\x1b[37m";
  for (int i = filled; i < width; ++i) os << (tty_ ? "━" : "─");
  if (tty_) os << "\x1b[0m";
  os << " " << format_time(final ? elapsed : per_step * static_cast<double>(steps_ - current)) << " "
     << format_per_step(per_step);
  for (const auto& [k, v] : logs)
    if (shown(k)) os << " - " << k << ": " << std::fixed << std::setprecision(4) << v;
  if (tty_) os << "\x1b[K";
  std::cout << os.str() << std::flush;
}

}  // namespace mpt::callbacks
