// Model.summary(): Keras 3's table (box drawing), with a dtype-policy column.
#include <iomanip>
#include <iostream>
#include <sstream>

#include "mpt/model.hpp"

namespace mpt {
namespace {

std::string with_commas(std::int64_t n) {
  std::string s = std::to_string(n), out;
  for (std::size_t i = 0; i < s.size(); ++i) {
    if (i && (s.size() - i) % 3 == 0) out += ',';
    out += s[i];
  }
  return out;
}

std::string bytes_str(double b) {
  const char* units[] = {"B", "KB", "MB", "GB"};
  int u = 0;
  while (b >= 1024 && u < 3) b /= 1024, ++u;
  std::ostringstream os;
  os << std::fixed << std::setprecision(2) << b << " " << units[u];
  return os.str();
}

std::string shape_str(const Shape& s) {
  if (s.empty()) return "?";
  std::string out = "(None";
  for (std::size_t i = 1; i < s.size(); ++i) out += ", " + std::to_string(s[i]);
  return out + ")";
}

// Display width of UTF-8 text (box-drawing characters are one column each).
std::size_t width(const std::string& s) {
  std::size_t w = 0;
  for (unsigned char c : s) w += (c & 0xC0) != 0x80;
  return w;
}

std::string pad(const std::string& s, std::size_t w, bool right = false) {
  std::size_t n = width(s);
  std::string fill(n < w ? w - n : 0, ' ');
  return right ? fill + s : s + fill;
}

std::string repeat(const std::string& s, std::size_t n) {
  std::string out;
  for (std::size_t i = 0; i < n; ++i) out += s;
  return out;
}

void print_totals(std::ostream& os, const std::vector<Variable>& vars) {
  std::int64_t total = 0, trainable = 0;
  double total_bytes = 0, trainable_bytes = 0;
  for (const auto& v : vars) {
    const double bytes = static_cast<double>(v.numel()) * static_cast<double>(itemsize(v.dtype()));
    total += v.numel(), total_bytes += bytes;
    if (v.trainable()) trainable += v.numel(), trainable_bytes += bytes;
  }
  os << " Total params: " << with_commas(total) << " (" << bytes_str(total_bytes) << ")\n";
  os << " Trainable params: " << with_commas(trainable) << " (" << bytes_str(trainable_bytes) << ")\n";
  os << " Non-trainable params: " << with_commas(total - trainable) << " (" << bytes_str(total_bytes - trainable_bytes)
     << ")\n";
}

}  // namespace

void Model::summary() const { summary(std::cout); }

void Model::summary(std::ostream& os) const {
  if (!nodes_.empty()) {
    summary_functional(os);
    print_totals(os, variables());
    return;
  }
  const std::vector<std::size_t> w{33, 24, 15, 16};
  auto rule = [&](const char* l, const char* m, const char* r, const char* h) {
    os << l;
    for (std::size_t i = 0; i < w.size(); ++i) os << repeat(h, w[i]) << (i + 1 < w.size() ? m : r);
    os << "\n";
  };
  auto row = [&](const std::vector<std::string>& cells, const char* bar) {
    os << bar;
    for (std::size_t i = 0; i < w.size(); ++i) os << " " << pad(cells[i], w[i] - 2, i == 2) << " " << bar;
    os << "\n";
  };
  os << "Model: \"" << name_ << "\"\n";
  rule("┏", "┳", "┓", "━");
  row({"Layer (type)", "Output Shape", "Param #", "Policy"}, "┃");
  rule("┡", "╇", "┩", "━");
  auto ls = layers();
  for (std::size_t i = 0; i < ls.size(); ++i) {
    const auto& l = ls[i];
    row({l->name() + " (" + l->class_name() + ")", shape_str(l->output_shape()), with_commas(l->count_params()),
         l->dtype_policy().name()},
        "│");
    if (i + 1 < ls.size()) rule("├", "┼", "┤", "─");
  }
  rule("└", "┴", "┘", "─");
  print_totals(os, variables());
}

}  // namespace mpt
