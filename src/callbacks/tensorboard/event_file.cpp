#include "callbacks/tensorboard/event_file.hpp"

#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <limits>

#include "src/callbacks/tensorboard/event.pb.h"
#include "mpt/error.hpp"

namespace mpt::tensorboard {
namespace {

constexpr std::array<std::uint32_t, 256> make_crc_table() {
  std::array<std::uint32_t, 256> t{};
  for (std::uint32_t i = 0; i < 256; ++i) {
    std::uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;  // reflected Castagnoli
    t[i] = c;
  }
  return t;
}
constexpr auto kCrcTable = make_crc_table();

void put_u32(std::string& s, std::uint32_t v) {
  for (int i = 0; i < 4; ++i) s.push_back(static_cast<char>(v >> (8 * i) & 0xff));
}
void put_u64(std::string& s, std::uint64_t v) {
  for (int i = 0; i < 8; ++i) s.push_back(static_cast<char>(v >> (8 * i) & 0xff));
}
std::uint64_t get_le(const char* p, int bytes) {
  std::uint64_t v = 0;
  for (int i = bytes - 1; i >= 0; --i) v = v << 8 | static_cast<unsigned char>(p[i]);
  return v;
}

double wall_time() {
  using namespace std::chrono;
  return duration<double>(system_clock::now().time_since_epoch()).count();
}

std::string host_name() {
  char buf[256] = {};
  if (gethostname(buf, sizeof buf - 1) != 0 || buf[0] == '\0') return "localhost";
  return buf;
}

}  // namespace

std::uint32_t crc32c(const void* data, std::size_t n, std::uint32_t crc) {
  const auto* p = static_cast<const unsigned char*>(data);
  crc = ~crc;
  for (std::size_t i = 0; i < n; ++i) crc = kCrcTable[(crc ^ p[i]) & 0xff] ^ (crc >> 8);
  return ~crc;
}

std::uint32_t masked_crc32c(const void* data, std::size_t n) {
  const std::uint32_t crc = crc32c(data, n);
  return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}

std::string tfrecord(const std::string& data) {
  std::string len, out;
  put_u64(len, data.size());
  out = len;
  put_u32(out, masked_crc32c(len.data(), len.size()));
  out += data;
  put_u32(out, masked_crc32c(data.data(), data.size()));
  return out;
}

std::vector<std::string> read_tfrecords(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  MPT_CHECK(in.good(), "TFRecord: cannot open '", path, "'");
  std::vector<std::string> records;
  for (;;) {
    char head[12];
    in.read(head, sizeof head);
    if (in.gcount() == 0) break;
    const std::size_t index = records.size();
    MPT_CHECK(in.gcount() == sizeof head, "TFRecord '", path, "': record ", index, " has a truncated header");
    MPT_CHECK(get_le(head + 8, 4) == masked_crc32c(head, 8), "TFRecord '", path, "': record ", index,
              ": the length's CRC does not match");
    const std::uint64_t len = get_le(head, 8);
    MPT_CHECK(len < (std::uint64_t{1} << 31), "TFRecord '", path, "': record ", index, " claims ", len, " bytes");
    std::string data(len, '\0');
    char crc[4];
    in.read(data.data(), static_cast<std::streamsize>(len));
    in.read(crc, sizeof crc);
    MPT_CHECK(in.good(), "TFRecord '", path, "': record ", index, " is truncated");
    MPT_CHECK(get_le(crc, 4) == masked_crc32c(data.data(), data.size()), "TFRecord '", path, "': record ", index,
              ": the data's CRC does not match");
    records.push_back(std::move(data));
  }
  return records;
}

Histogram histogram(const std::vector<double>& values, int buckets) {
  Histogram h;
  h.min = std::numeric_limits<double>::infinity(), h.max = -h.min;
  for (double v : values) {
    if (!std::isfinite(v)) continue;
    h.min = std::min(h.min, v), h.max = std::max(h.max, v);
    h.num += 1, h.sum += v, h.sum_squares += v * v;
  }
  if (h.num == 0) {
    h.min = h.max = 0;
    return h;
  }
  // As TensorFlow: a single value gets a unit-wide range around it.
  const double lo = h.min == h.max ? h.min - 0.5 : h.min, hi = h.min == h.max ? h.max + 0.5 : h.max;
  const double width = (hi - lo) / buckets;
  h.bucket.assign(static_cast<std::size_t>(buckets), 0.0);
  for (int i = 0; i < buckets; ++i) h.bucket_limit.push_back(i + 1 == buckets ? hi : lo + width * (i + 1));
  for (double v : values) {
    if (!std::isfinite(v)) continue;
    auto i = static_cast<int>((v - lo) / width);
    h.bucket[static_cast<std::size_t>(std::clamp(i, 0, buckets - 1))] += 1;
  }
  return h;
}

EventFileWriter::EventFileWriter(const std::string& dir, const std::string& owner) : owner_(owner) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec || !std::filesystem::is_directory(dir))
    fail(owner_, ": cannot create the log directory '", dir, "': ", ec ? ec.message() : "not a directory");
  static std::atomic<int> uid{0};
  const auto seconds = static_cast<long long>(wall_time());
  path_ = (std::filesystem::path(dir) / ("events.out.tfevents." + std::to_string(seconds) + "." + host_name() + "." +
                                         std::to_string(getpid()) + "." + std::to_string(uid++) + ".v2"))
              .string();
  out_.open(path_, std::ios::binary | std::ios::trunc);
  if (!out_.good()) fail(owner_, ": cannot write the event file '", path_, "': ", std::strerror(errno));
  Event e;
  e.set_wall_time(wall_time());
  e.set_file_version("brain.Event:2");
  write_event(e.SerializeAsString());
  flush();
}

void EventFileWriter::add_scalar(const std::string& tag, double value, std::int64_t step) {
  Event e;
  e.set_wall_time(wall_time());
  e.set_step(step);
  auto* v = e.mutable_summary()->add_value();
  v->set_tag(tag);
  v->set_simple_value(static_cast<float>(value));
  write_event(e.SerializeAsString());
}

void EventFileWriter::add_histogram(const std::string& tag, const Histogram& h, std::int64_t step) {
  Event e;
  e.set_wall_time(wall_time());
  e.set_step(step);
  auto* v = e.mutable_summary()->add_value();
  v->set_tag(tag);
  auto* p = v->mutable_histo();
  p->set_min(h.min), p->set_max(h.max), p->set_num(h.num), p->set_sum(h.sum), p->set_sum_squares(h.sum_squares);
  for (double l : h.bucket_limit) p->add_bucket_limit(l);
  for (double c : h.bucket) p->add_bucket(c);
  write_event(e.SerializeAsString());
}

namespace {
/// The OS's reason for the stream's failed write (errno, cleared before the write), if it gave one.
std::string write_reason() { return errno != 0 ? std::strerror(errno) : "the stream refused the write"; }
}  // namespace

void EventFileWriter::write_event(const std::string& event_bytes) {
  errno = 0;
  out_ << tfrecord(event_bytes);
  out_.flush();  // a full disk shows here, at the event that did not fit, with its reason
  if (!out_.good()) fail(owner_, ": cannot write the event file '", path_, "': ", write_reason());
}

void EventFileWriter::flush() {
  errno = 0;
  out_.flush();
  if (!out_.good()) fail(owner_, ": cannot write the event file '", path_, "': ", write_reason());
}

}  // namespace mpt::tensorboard
