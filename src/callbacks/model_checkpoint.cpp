#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <iostream>

#include "mpt/callbacks.hpp"
#include "mpt/log.hpp"
#include "mpt/model.hpp"

namespace mpt::callbacks {

namespace {

/// Python's repr of a float: the shortest text that reads back the same ("0.1", "3.0").
std::string python_repr(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  char buf[40];
  for (int p = 1; p <= 17; ++p) {
    std::snprintf(buf, sizeof buf, "%.*g", p, v);
    if (std::strtod(buf, nullptr) == v) break;
  }
  std::string s = buf;
  if (s.find_first_of(".e") == std::string::npos) s += ".0";
  return s;
}

/// One replacement field's value formatted with a Python format spec
/// ([[fill]align][sign][#][0][width][.precision][type], types d f F e E g G %).
std::string python_format(double v, bool is_int, const std::string& spec, const std::string& where) {
  std::size_t i = 0;
  char fill = ' ', align = 0, sign = '-';
  bool alt = false;
  auto is_align = [](char c) { return c == '<' || c == '>' || c == '^' || c == '='; };
  if (spec.size() >= 2 && is_align(spec[1])) fill = spec[0], align = spec[1], i = 2;
  else if (!spec.empty() && is_align(spec[0])) align = spec[0], i = 1;
  if (i < spec.size() && (spec[i] == '+' || spec[i] == '-' || spec[i] == ' ')) sign = spec[i++];
  if (i < spec.size() && spec[i] == '#') alt = true, ++i;
  if (i < spec.size() && spec[i] == '0') {
    if (!align) fill = '0', align = '=';
    ++i;
  }
  // A width or precision past these gives no usable file name (a name has at most 255 bytes):
  // refused, never parsed into an overflow or a giant string.
  constexpr std::size_t kMaxWidth = 255, kMaxPrecision = 100;
  auto number = [&](std::size_t limit, const char* what) {
    std::size_t n = 0;
    while (i < spec.size() && std::isdigit(static_cast<unsigned char>(spec[i]))) {
      n = n * 10 + static_cast<std::size_t>(spec[i++] - '0');
      MPT_CHECK(n <= limit, where, ": the ", what, " in format spec '", spec, "' is more than ", limit);
    }
    return n;
  };
  const std::size_t width = number(kMaxWidth, "width");
  int precision = -1;
  if (i < spec.size() && spec[i] == '.') {
    ++i;
    MPT_CHECK(i < spec.size() && std::isdigit(static_cast<unsigned char>(spec[i])), where, ": bad format spec '", spec, "'");
    precision = static_cast<int>(number(kMaxPrecision, "precision"));
  }
  char type = i < spec.size() ? spec[i++] : 0;
  MPT_CHECK(i == spec.size() && (type == 0 || std::string("dfFeEgG%").find(type) != std::string::npos), where,
            ": unsupported format spec '", spec, "'");
  const bool negative = std::signbit(v) && !std::isnan(v);
  const double a = std::abs(v);
  std::string body;
  char buf[512];
  if (type == 'd' || (type == 0 && is_int)) {
    MPT_CHECK(std::isfinite(v) && v == std::floor(v), where, ": format 'd' needs an integer, got ", v);
    std::snprintf(buf, sizeof buf, "%.0f", a);
    body = buf;
  } else if (type == 0 && precision < 0) {
    body = python_repr(a);
  } else {
    const char t = type == 0 ? 'g' : type == '%' ? 'f' : type;
    std::string fmt = std::string("%") + (alt ? "#" : "") + "." + std::to_string(precision < 0 ? 6 : precision) + t;
    std::snprintf(buf, sizeof buf, fmt.c_str(), type == '%' ? a * 100 : a);
    body = buf;
    if (type == '%') body += "%";
  }
  std::string sign_text = negative ? "-" : sign == '+' ? "+" : sign == ' ' ? " " : "";
  std::string out = sign_text + body;
  if (out.size() < width) {
    const std::size_t pad = width - out.size();
    switch (align ? align : '>') {
      case '<': out += std::string(pad, fill); break;
      case '^': out = std::string(pad / 2, fill) + out + std::string(pad - pad / 2, fill); break;
      case '=': out = sign_text + std::string(pad, fill) + body; break;
      default: out = std::string(pad, fill) + out;
    }
  }
  return out;
}

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

}  // namespace

ModelCheckpoint::ModelCheckpoint(std::string filepath, ModelCheckpointOptions o)
    : filepath_(std::move(filepath)), o_(std::move(o)), best_(NAN) {
  MPT_CHECK(!filepath_.empty(), "ModelCheckpoint: empty filepath");
  MPT_CHECK(o_.mode == "auto" || o_.mode == "min" || o_.mode == "max", "ModelCheckpoint: mode must be auto, min or max, got '",
            o_.mode, "'");
  if (o_.save_weights_only)
    MPT_CHECK(ends_with(filepath_, ".h5") || ends_with(filepath_, ".hdf5"), "ModelCheckpoint: with save_weights_only "
              "the filepath must end in .weights.h5 (Keras 3 layout) or .h5 (legacy layout), got '", filepath_, "'");
  if (auto* f = std::get_if<std::string>(&o_.save_freq)) {
    MPT_CHECK(*f == "epoch", "ModelCheckpoint: save_freq must be \"epoch\" or a number of batches, got '", *f, "'");
  } else {
    freq_ = std::get<std::int64_t>(o_.save_freq);
    MPT_CHECK(freq_ > 0, "ModelCheckpoint: save_freq must be a positive number of batches, got ", freq_);
  }
  if (o_.mode == "auto") {
    std::string m = o_.monitor.rfind("val_", 0) == 0 ? o_.monitor.substr(4) : o_.monitor;
    const bool up = m.find("acc") != std::string::npos || m.find("auc") != std::string::npos ||
                    m.find("precision") != std::string::npos || m.find("recall") != std::string::npos;
    const bool down = m.find("loss") != std::string::npos || m.find("error") != std::string::npos || m == "mae" ||
                      m == "mse" || m == "mape" || m == "msle";
    MPT_CHECK(up || down || !o_.save_best_only, "ModelCheckpoint: cannot tell whether '", o_.monitor,
              "' should be minimized or maximized; pass .mode = \"min\" or \"max\"");
    maximize_ = up && !down;
  } else {
    maximize_ = o_.mode == "max";
  }
  if (o_.initial_value_threshold) best_ = *o_.initial_value_threshold;
}

void ModelCheckpoint::on_train_begin(const Logs&) { batches_since_save_ = 0; }

void ModelCheckpoint::on_epoch_begin(int epoch, const Logs&) { current_epoch_ = epoch; }

bool ModelCheckpoint::wants_batch_logs(std::int64_t) { return freq_ > 0 && batches_since_save_ + 1 >= freq_; }

void ModelCheckpoint::on_train_batch_end(std::int64_t batch, const Logs& logs) {
  if (freq_ == 0 || ++batches_since_save_ < freq_) return;
  batches_since_save_ = 0;
  save(current_epoch_, batch, logs);
}

void ModelCheckpoint::on_epoch_end(int epoch, Logs& logs) {
  if (freq_ == 0) save(epoch, -1, logs);
}

std::string ModelCheckpoint::file_path(int epoch, std::int64_t batch, const Logs& logs) const {
  const std::string where = "ModelCheckpoint: filepath '" + filepath_ + "'";
  std::string out;
  for (std::size_t i = 0; i < filepath_.size(); ++i) {
    const char c = filepath_[i];
    if (c == '}') {
      MPT_CHECK(i + 1 < filepath_.size() && filepath_[i + 1] == '}', where, ": single '}' (write '}}' for a brace)");
      out += '}', ++i;
      continue;
    }
    if (c != '{') {
      out += c;
      continue;
    }
    if (i + 1 < filepath_.size() && filepath_[i + 1] == '{') {
      out += '{', ++i;
      continue;
    }
    const std::size_t close = filepath_.find('}', i);
    MPT_CHECK(close != std::string::npos, where, ": unclosed '{'");
    const std::string field = filepath_.substr(i + 1, close - i - 1);
    const std::size_t colon = field.find(':');
    const std::string key = field.substr(0, colon), spec = colon == std::string::npos ? "" : field.substr(colon + 1);
    if (key == "epoch") {
      out += python_format(epoch + 1, true, spec, where);
    } else if (key == "batch" && batch >= 0 && !logs.count("batch")) {
      out += python_format(static_cast<double>(batch + 1), true, spec, where);
    } else {
      auto it = logs.find(key);
      if (it == logs.end()) {
        std::string keys = "epoch";
        if (batch >= 0) keys += ", batch";
        for (const auto& [k, v] : logs) keys += ", " + k;
        fail(where, " uses {", key, "}, which is not in the logs (available: ", keys, ")");
      }
      out += python_format(it->second, false, spec, where);
    }
    i = close;
  }
  return out;
}

void ModelCheckpoint::save(int epoch, std::int64_t batch, const Logs& logs) {
  MPT_CHECK(model() != nullptr, "ModelCheckpoint: no model (the callback is used outside fit)");
  const std::string path = file_path(epoch, batch, logs);
  if (o_.save_best_only) {
    auto it = logs.find(o_.monitor);
    if (it == logs.end()) {
      mpt::log(LogLevel::warning, "ModelCheckpoint: can save best model only with ", o_.monitor, " available");
    } else {
      const double current = it->second;
      char best_text[64];
      std::snprintf(best_text, sizeof best_text, std::isnan(best_) ? "None" : "%.5f", best_);
      const bool improved = std::isnan(best_) ? !std::isnan(current) : maximize_ ? current > best_ : current < best_;
      if (!improved) {
        if (o_.verbose > 0)
          std::cout << "\nEpoch " << epoch + 1 << ": " << o_.monitor << " did not improve from " << best_text << "\n";
        return;
      }
      if (o_.verbose > 0) {
        char cur[64];
        std::snprintf(cur, sizeof cur, "%.5f", current);
        std::cout << "\nEpoch " << epoch + 1 << ": " << o_.monitor << " improved from " << best_text << " to " << cur
                  << ", saving model to " << path << "\n";
      }
      best_ = current;
    }
  } else if (o_.verbose > 0) {
    std::cout << "\nEpoch " << epoch + 1 << ": saving model to " << path << "\n";
  }
  const auto dir = std::filesystem::path(path).parent_path();
  std::error_code ec;
  if (!dir.empty()) std::filesystem::create_directories(dir, ec);  // as Keras; save reports failures
  if (o_.save_weights_only) model()->save_weights(path);
  else model()->save(path);
}

}  // namespace mpt::callbacks
