#pragma once
// Writes IDX files (plain or gzip) into a per-process temporary directory for the IDX and
// dataset tests. Link zlib (tests/CMakeLists.txt does for these tests).
#include <unistd.h>
#include <zlib.h>

#include <bit>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <stdexcept>
#include <string>
#include <vector>

namespace mpt::test {

using Bytes = std::vector<std::uint8_t>;

/// A fresh directory under the system temp dir, removed with everything in it at destruction.
struct TempDir {
  std::filesystem::path path;
  explicit TempDir(const std::string& tag) {
    path = std::filesystem::temp_directory_path() / ("mpt_" + tag + "_" + std::to_string(::getpid()));
    std::filesystem::remove_all(path);
    std::filesystem::create_directories(path);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
  std::string file(const std::string& name) const { return (path / name).string(); }
};

inline void put_be32(Bytes& out, std::uint32_t v) {
  for (int s = 24; s >= 0; s -= 8) out.push_back(static_cast<std::uint8_t>(v >> s));
}

/// Header (0, 0, type, ndims, big-endian dims) followed by `payload` as given.
inline Bytes idx_bytes(std::uint8_t type, const std::vector<std::uint32_t>& dims, const Bytes& payload) {
  Bytes out{0, 0, type, static_cast<std::uint8_t>(dims.size())};
  for (auto d : dims) put_be32(out, d);
  out.insert(out.end(), payload.begin(), payload.end());
  return out;
}

/// Big-endian element bytes of values of T (int8/int16/int32/float/double).
template <class T>
Bytes be_payload(const std::vector<T>& values) {
  Bytes out;
  for (T v : values) {
    std::uint64_t bits = 0;
    if constexpr (sizeof(T) == 1) bits = std::bit_cast<std::uint8_t>(v);
    if constexpr (sizeof(T) == 2) bits = std::bit_cast<std::uint16_t>(v);
    if constexpr (sizeof(T) == 4) bits = std::bit_cast<std::uint32_t>(v);
    if constexpr (sizeof(T) == 8) bits = std::bit_cast<std::uint64_t>(v);
    for (int s = 8 * static_cast<int>(sizeof(T)) - 8; s >= 0; s -= 8) out.push_back(static_cast<std::uint8_t>(bits >> s));
  }
  return out;
}

inline void write_plain(const std::string& path, const Bytes& bytes) {
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) throw std::runtime_error("cannot write " + path);
  if (!bytes.empty()) std::fwrite(bytes.data(), 1, bytes.size(), f);
  std::fclose(f);
}

inline void write_gz(const std::string& path, const Bytes& bytes) {
  gzFile g = gzopen(path.c_str(), "wb");
  if (!g) throw std::runtime_error("cannot write " + path);
  if (!bytes.empty()) gzwrite(g, bytes.data(), static_cast<unsigned>(bytes.size()));
  gzclose(g);
}

inline Bytes read_all(const std::string& path) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (!f) throw std::runtime_error("cannot read " + path);
  Bytes out;
  std::uint8_t buf[65536];
  for (std::size_t n; (n = std::fread(buf, 1, sizeof buf, f)) > 0;) out.insert(out.end(), buf, buf + n);
  std::fclose(f);
  return out;
}

}  // namespace mpt::test
