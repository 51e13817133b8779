#include "io/idx.hpp"

#include <zlib.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>

#include "mpt/data/data.hpp"

namespace mpt::io {
namespace detail {
namespace {

constexpr int kMaxDims = 8;
// No IDX file mpt reads comes near this; a header asking for more is corrupt.
constexpr std::uint64_t kMaxPayloadBytes = std::uint64_t{1} << 40;
// Deflate cannot expand data by more than about 1032:1, which bounds what a gzip file can hold.
constexpr std::uint64_t kMaxGzipRatio = 1032;

template <class... Args>
[[noreturn]] void bad(const std::string& path, const Args&... args) {
  fail("read_idx: '", path, "': ", args...);
}

std::size_t element_size(std::uint8_t type) {
  switch (type) {
    case 0x08: case 0x09: return 1;
    case 0x0B: return 2;
    case 0x0C: case 0x0D: return 4;
    case 0x0E: return 8;
    default: return 0;
  }
}

std::string dims_str(const Shape& dims) {
  std::string s;
  for (std::size_t i = 0; i < dims.size(); ++i) s += (i ? " x " : "") + std::to_string(dims[i]);
  return s;
}

// Bytes from a plain file or a gzip stream. read() returns fewer bytes only at the end of the
// data; `truncated` says whether that end came in the middle of a gzip stream.
class Source {
 public:
  Source(const std::string& path, bool gzip) : path_(path), gzip_(gzip) {
    if (gzip_) {
      gz_ = gzopen(path.c_str(), "rb");
      if (!gz_) bad(path, "cannot open: ", errno ? std::strerror(errno) : "out of memory");
      gzbuffer(gz_, 1 << 18);
    } else {
      file_ = std::fopen(path.c_str(), "rb");
      if (!file_) bad(path, "cannot open: ", std::strerror(errno));
    }
  }
  ~Source() {
    if (gz_) gzclose_r(gz_);
    if (file_) std::fclose(file_);
  }
  Source(const Source&) = delete;
  Source& operator=(const Source&) = delete;

  std::size_t read(void* dst, std::size_t n) {
    auto* out = static_cast<unsigned char*>(dst);
    std::size_t got = 0;
    while (got < n) {
      const std::size_t want = std::min<std::size_t>(n - got, std::size_t{1} << 30);
      std::size_t r;
      if (gzip_) {
        const int k = gzread(gz_, out + got, static_cast<unsigned>(want));
        check_gz();
        if (k < 0) bad(path_, "corrupt gzip stream");
        r = static_cast<std::size_t>(k);
      } else {
        r = std::fread(out + got, 1, want, file_);
        if (r < want && std::ferror(file_)) bad(path_, "read error: ", std::strerror(errno));
      }
      if (r == 0) break;
      got += r;
    }
    return got;
  }

  bool truncated() const { return truncated_; }

  // Closes the stream; a gzip stream must have ended cleanly (the CRC is checked on the way).
  void close() {
    if (gz_) {
      const int rc = gzclose_r(gz_);
      gz_ = nullptr;
      if (rc == Z_BUF_ERROR) bad(path_, "truncated gzip stream (unexpected end of file)");
      if (rc != Z_OK) bad(path_, "corrupt gzip stream (gzclose error ", rc, ")");
    }
  }

 private:
  void check_gz() {
    int err = Z_OK;
    const char* msg = gzerror(gz_, &err);
    if (err == Z_OK) return;
    if (err == Z_BUF_ERROR) {
      truncated_ = true;
      return;
    }
    bad(path_, "corrupt gzip stream: ", msg ? msg : "unknown zlib error");
  }

  std::string path_;
  bool gzip_;
  gzFile gz_ = nullptr;
  std::FILE* file_ = nullptr;
  bool truncated_ = false;
};

}  // namespace

const char* idx_type_name(std::uint8_t type) {
  switch (type) {
    case 0x08: return "uint8";
    case 0x09: return "int8";
    case 0x0B: return "int16";
    case 0x0C: return "int32";
    case 0x0D: return "float32";
    case 0x0E: return "float64";
    default: return "unknown";
  }
}

namespace {

/// The size of a regular file (an error naming it for anything else).
std::uint64_t regular_file_size(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::file_status st = fs::status(path, ec);
  if (!fs::exists(st)) bad(path, "no such file");
  if (fs::is_directory(st)) bad(path, "is a directory, not an IDX file");
  if (!fs::is_regular_file(st)) bad(path, "is not a regular file");
  const std::uint64_t file_size = fs::file_size(path, ec);
  if (ec) bad(path, "cannot read its size: ", ec.message());
  return file_size;
}

/// True when the file starts with gzip's magic bytes.
bool is_gzip(const std::string& path) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (!f) bad(path, "cannot open: ", std::strerror(errno));
  unsigned char magic[2] = {0, 0};
  const bool gzip = std::fread(magic, 1, 2, f) == 2 && magic[0] == 0x1f && magic[1] == 0x8b;
  std::fclose(f);
  return gzip;
}

/// The payload's bytes from the header's big-endian dimensions (appended to dims); too_big when
/// they pass kMaxPayloadBytes (checked before anything is multiplied past it). Any zero
/// dimension makes an empty payload.
std::uint64_t payload_bytes(const unsigned char* dim_bytes, int ndims, std::size_t esize,
                            std::vector<std::int64_t>& dims, bool& too_big) {
  std::uint64_t bytes = esize;
  too_big = false;
  for (int i = 0; i < ndims; ++i) {
    const unsigned char* b = dim_bytes + 4 * i;
    const std::uint64_t d = (std::uint64_t{b[0]} << 24) | (std::uint64_t{b[1]} << 16) |
                            (std::uint64_t{b[2]} << 8) | std::uint64_t{b[3]};
    dims.push_back(static_cast<std::int64_t>(d));
    if (d != 0 && bytes > kMaxPayloadBytes / d) too_big = true;
    else bytes *= d;
  }
  for (auto d : dims)
    if (d == 0) too_big = false, bytes = 0;
  return bytes;
}

/// Reads up to `bytes` of payload: a plain file's size was checked already; a gzip stream grows
/// the buffer as data arrives, so memory follows what the stream really holds, not what the
/// header claims. Returns the bytes read.
std::size_t read_payload(Source& src, bool gzip, std::uint64_t bytes, std::vector<unsigned char>& payload) {
  if (!gzip) {
    payload.resize(bytes);
    return src.read(payload.data(), bytes);
  }
  std::size_t got = 0;
  while (got < bytes) {
    const std::size_t next =
        std::min<std::uint64_t>(bytes, std::max<std::uint64_t>(2 * payload.size(), std::uint64_t{1} << 20));
    payload.resize(next);
    const std::size_t r = src.read(payload.data() + got, next - got);
    got += r;
    if (got < next) break;
  }
  return got;
}

}  // namespace

IdxFile read_idx_file(const std::string& path) {
  const std::uint64_t file_size = regular_file_size(path);
  const bool gzip = is_gzip(path);
  const char* kind = gzip ? "decompressed data" : "file";
  Source src(path, gzip);
  auto truncation = [&](std::uint64_t need, std::uint64_t got, const char* what) {
    bad(path, "truncated: ", what, " needs ", need, " bytes but the ", kind, " has only ", got,
        src.truncated() ? " (the gzip stream ends early)" : "");
  };

  unsigned char head[4];
  std::size_t got = src.read(head, 4);
  if (got == 0 && !src.truncated()) bad(path, "the ", kind, " is empty, not an IDX file");
  if (got < 4) truncation(4, got, "the IDX header");
  if (head[0] != 0 || head[1] != 0)
    bad(path, "not an IDX file: the first two bytes are ", int(head[0]), ", ", int(head[1]),
        " instead of 0, 0", gzip ? "" : " (and it is not gzip-compressed)");
  IdxFile out;
  out.type = head[2];
  const std::size_t esize = element_size(out.type);
  if (esize == 0)
    bad(path, "unknown IDX type code 0x", "0123456789abcdef"[out.type >> 4], "0123456789abcdef"[out.type & 15],
        " (expected 0x08 uint8, 0x09 int8, 0x0B int16, 0x0C int32, 0x0D float32 or 0x0E float64)");
  const int ndims = head[3];
  if (ndims < 1 || ndims > kMaxDims)
    bad(path, "the header declares ", ndims, " dimensions (expected 1 to ", kMaxDims, ")");

  unsigned char dim_bytes[4 * kMaxDims];
  const std::size_t header_bytes = 4 + 4 * static_cast<std::size_t>(ndims);
  got = src.read(dim_bytes, 4 * static_cast<std::size_t>(ndims));
  if (got < 4 * static_cast<std::size_t>(ndims)) truncation(header_bytes, 4 + got, "the header's dimensions");
  bool too_big = false;
  const std::uint64_t bytes = payload_bytes(dim_bytes, ndims, esize, out.dims, too_big);
  const std::string declared = std::string(idx_type_name(out.type)) + " [" + dims_str(out.dims) + "]";
  if (too_big)
    bad(path, "the header declares ", declared, ", more than the ", kMaxPayloadBytes >> 30,
        " GiB an IDX file may hold (corrupt header?)");
  if (!gzip && header_bytes + bytes != file_size) {
    if (header_bytes + bytes > file_size)
      truncation(bytes, file_size - header_bytes, ("the data of " + declared).c_str());
    bad(path, file_size - header_bytes - bytes, " bytes of trailing data after the ", bytes,
        " bytes of ", declared, " the header declares");
  }
  if (gzip && bytes > file_size * kMaxGzipRatio + 1024)
    bad(path, "the header declares ", declared, " (", bytes, " bytes), more than a ", file_size,
        "-byte gzip file can hold (truncated file or corrupt header)");

  got = read_payload(src, gzip, bytes, out.payload);
  if (got < bytes) truncation(bytes, got, ("the data of " + declared).c_str());
  unsigned char extra;
  if (src.read(&extra, 1) != 0)
    bad(path, "trailing data after the ", bytes, " bytes of ", declared, " the header declares");
  if (src.truncated()) bad(path, "truncated gzip stream (unexpected end of file)");
  src.close();
  return out;
}

}  // namespace detail

namespace {
std::uint32_t be32(const std::uint8_t* b) {
  return (std::uint32_t{b[0]} << 24) | (std::uint32_t{b[1]} << 16) | (std::uint32_t{b[2]} << 8) | b[3];
}
std::uint64_t be64(const std::uint8_t* b) { return (std::uint64_t{be32(b)} << 32) | be32(b + 4); }
}  // namespace

Tensor read_idx(const std::string& path) {
  detail::IdxFile f = detail::read_idx_file(path);
  const std::size_t n = static_cast<std::size_t>(numel_of(f.dims));
  const std::uint8_t* p = f.payload.data();
  switch (f.type) {
    case 0x08: return Tensor::from_host(p, n, uint8, f.dims, Device::cpu());
    case 0x09: {
      Tensor t = Tensor::empty(f.dims, int32, Device::cpu());
      auto* o = n ? t.data<std::int32_t>() : nullptr;
      for (std::size_t i = 0; i < n; ++i) o[i] = static_cast<std::int8_t>(p[i]);
      return t;
    }
    case 0x0B: {
      Tensor t = Tensor::empty(f.dims, int32, Device::cpu());
      auto* o = n ? t.data<std::int32_t>() : nullptr;
      for (std::size_t i = 0; i < n; ++i)
        o[i] = static_cast<std::int16_t>(static_cast<std::uint16_t>((p[2 * i] << 8) | p[2 * i + 1]));
      return t;
    }
    case 0x0C: {
      Tensor t = Tensor::empty(f.dims, int32, Device::cpu());
      auto* o = n ? t.data<std::int32_t>() : nullptr;
      for (std::size_t i = 0; i < n; ++i) o[i] = std::bit_cast<std::int32_t>(be32(p + 4 * i));
      return t;
    }
    case 0x0D: {
      Tensor t = Tensor::empty(f.dims, float32, Device::cpu());
      auto* o = n ? t.data<float>() : nullptr;
      for (std::size_t i = 0; i < n; ++i) o[i] = std::bit_cast<float>(be32(p + 4 * i));
      return t;
    }
    default: {  // 0x0E, the only other type read_idx_file accepts
      Tensor t = Tensor::empty(f.dims, float64, Device::cpu());
      auto* o = n ? t.data<double>() : nullptr;
      for (std::size_t i = 0; i < n; ++i) o[i] = std::bit_cast<double>(be64(p + 8 * i));
      return t;
    }
  }
}

}  // namespace mpt::io
