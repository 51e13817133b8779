#include "mpt/io/npy.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <iterator>
#include <optional>
#include <string_view>
#include <vector>

#include "io/checked_file.hpp"
#include "mpt/ops.hpp"

namespace mpt::io {
namespace {

constexpr char kMagic[6] = {'\x93', 'N', 'U', 'M', 'P', 'Y'};
constexpr std::size_t kAlign = 64;

// What save_npy writes for each dtype and load_npy reads in any byte order. '<V2' is what
// numpy.save writes for ml_dtypes.bfloat16 (a plain 2-byte void is '|V2'); bfloat16 is saved as '<f4'.
constexpr struct {
  std::string_view descr;
  DType dtype;
} kDescrs[] = {{"<f4", float32}, {"<f8", float64}, {"<f2", float16}, {"<i4", int32},
               {"<i8", int64},   {"|u1", uint8},   {"|b1", bool_},   {"<V2", bfloat16}};

template <class... Args>
[[noreturn]] void bad(const std::string& path, const Args&... args) {
  fail("load_npy: '", path, "': ", args...);
}

std::string printable(std::string_view s, std::size_t limit = 120) {
  std::string out;
  for (unsigned char c : s.substr(0, limit)) {
    char hex[5];
    std::snprintf(hex, sizeof hex, "\\x%02x", c);
    out += c >= 32 && c < 127 ? std::string(1, static_cast<char>(c)) : hex;
  }
  return s.size() > limit ? out + "..." : out;
}

struct Header {
  std::optional<std::string> descr;  // the descr string, or the raw text of a non-string descr
  bool descr_is_string = false;
  std::optional<bool> fortran_order;
  std::optional<Shape> shape;
};

// The header is a Python dict literal: {'descr': '<f4', 'fortran_order': False, 'shape': (3, 4), }
class HeaderParser {
 public:
  HeaderParser(std::string_view text, const std::string& path) : s_(text), path_(path) {}

  Header parse() {
    Header h;
    expect('{', "a '{' opening the header dict");
    while (!peek('}')) {
      const std::string key = string_literal("a quoted key");
      expect(':', "':' after key '" + printable(key) + "'");
      if (key == "descr") {
        h.descr_is_string = peek('\'') || peek('"');
        h.descr = h.descr_is_string ? string_literal("the descr") : skip_value();
      } else if (key == "fortran_order") {
        h.fortran_order = boolean();
      } else if (key == "shape") {
        h.shape = tuple();
      } else {
        bad(path_, "unexpected key '", printable(key), "' in the header (NumPy headers hold exactly 'descr', ",
            "'fortran_order' and 'shape'): ", printable(s_));
      }
      if (!peek('}')) expect(',', "',' or '}' after the value of '" + printable(key) + "'");
    }
    ++pos_;
    skip_space();
    if (pos_ < s_.size()) malformed("text after the closing '}'");
    return h;
  }

 private:
  [[noreturn]] void malformed(const std::string& what) {
    bad(path_, "malformed header (", what, " at byte ", pos_, "): ", printable(s_));
  }
  void skip_space() {
    while (pos_ < s_.size() && std::string_view(" \t\r\n").find(s_[pos_]) != std::string_view::npos) ++pos_;
  }
  bool peek(char c) {
    skip_space();
    if (pos_ >= s_.size()) bad(path_, "header is not terminated: its dict has no closing '}': ", printable(s_));
    return s_[pos_] == c;
  }
  void expect(char c, const std::string& what) {
    if (!peek(c)) malformed("expected " + what);
    ++pos_;
  }
  std::string string_literal(const std::string& what) {
    if (!peek('\'') && !peek('"')) malformed("expected " + what);
    const char quote = s_[pos_++];
    const std::size_t end = s_.find(quote, pos_);
    if (end == std::string_view::npos) malformed("unterminated string");
    std::string out(s_.substr(pos_, end - pos_));
    pos_ = end + 1;
    return out;
  }
  bool boolean() {
    skip_space();
    if (s_.substr(pos_, 4) == "True") return pos_ += 4, true;
    if (s_.substr(pos_, 5) == "False") return pos_ += 5, false;
    malformed("expected True or False for 'fortran_order'");
  }
  // A Python tuple of non-negative ints: (), (3,), (3, 4); Python 2 wrote longs as 3L.
  Shape tuple() {
    expect('(', "a tuple '(' for 'shape'");
    Shape shape;
    bool comma = false;
    while (!peek(')')) {
      const bool negative = s_[pos_] == '-';
      if (negative) ++pos_;
      if (pos_ >= s_.size() || s_[pos_] < '0' || s_[pos_] > '9') malformed("expected an integer in 'shape'");
      const std::size_t begin = pos_;
      std::int64_t v = 0;
      bool overflow = false;
      for (; pos_ < s_.size() && s_[pos_] >= '0' && s_[pos_] <= '9'; ++pos_)
        overflow |= __builtin_mul_overflow(v, 10, &v) || __builtin_add_overflow(v, s_[pos_] - '0', &v);
      if (overflow)
        bad(path_, "shape entry ", s_.substr(begin, pos_ - begin), " does not fit in int64: ", printable(s_));
      if (pos_ < s_.size() && s_[pos_] == 'L') ++pos_;
      if (negative) bad(path_, "negative size -", v, " in shape: ", printable(s_));
      shape.push_back(v);
      comma = false;
      if (!peek(')')) expect(',', "',' or ')' in 'shape'"), comma = true;
    }
    ++pos_;
    if (shape.size() == 1 && !comma) malformed("'shape' is a parenthesized int, not a tuple: write (n,)");
    return shape;
  }
  // Skips any Python literal (a structured descr is a list of tuples) and returns its text.
  std::string skip_value() {
    const std::size_t begin = pos_;
    int depth = 0;
    do {
      if (peek('\'') || peek('"')) {
        string_literal("a string");
        continue;
      }
      const char c = s_[pos_++];
      if (c == '[' || c == '(' || c == '{') ++depth;
      if (c == ']' || c == ')' || c == '}') --depth;
    } while (depth > 0 || (!peek(',') && !peek('}')));
    return std::string(s_.substr(begin, pos_ - begin));
  }

  std::string_view s_;
  std::string path_;
  std::size_t pos_ = 0;
};

struct Layout {
  DType dtype;
  std::size_t item;
  bool swap;
};

// '<f4', '>i8', '=f2' (native), '|u1', 'f4' (no order: native); '<V2' and '>V2' only.
Layout layout_of(const std::string& descr, bool is_string, const std::string& path) {
  std::string supported = " (supported:";
  for (const auto& [code, dtype] : kDescrs) supported += " '" + std::string(code) + "' " + to_string(dtype) + ",";
  supported += " in byte order '<', '>' or '=')";
  if (!is_string)
    bad(path, "unsupported dtype descr ", printable(descr), " (not a string: a list is a structured array)", supported);
  std::string_view d = descr;
  char order = '=';
  if (!d.empty() && std::string_view("<>=|").find(d[0]) != std::string_view::npos) order = d[0], d.remove_prefix(1);
  for (const auto& [code, dtype] : kDescrs) {
    if (d != code.substr(1) || (dtype == bfloat16 && order != '<' && order != '>')) continue;
    const bool big = order == '>' || (order != '<' && std::endian::native == std::endian::big);
    return {dtype, itemsize(dtype), itemsize(dtype) > 1 && big != (std::endian::native == std::endian::big)};
  }
  bad(path, "unsupported dtype descr '", printable(descr), "'", supported);
}

std::string errno_text() { return std::strerror(errno); }

// Reads [offset, offset + n) of the file; the file may have shrunk since fstat.
void read_at(int fd, void* dst, std::size_t n, std::size_t offset, const std::string& path, const char* what) {
  auto* p = static_cast<unsigned char*>(dst);
  for (std::size_t got = 0; got < n;) {
    const ssize_t r = ::pread(fd, p + got, n - got, static_cast<off_t>(offset + got));
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) bad(path, "reading the ", what, " failed: ", errno_text());
    if (r == 0) bad(path, "the file ended while reading the ", what, " (", got, " of ", n, " bytes)");
    got += static_cast<std::size_t>(r);
  }
}

void byte_swap(unsigned char* p, std::size_t count, std::size_t item) {
  for (std::size_t i = 0; i < count; ++i, p += item) std::reverse(p, p + item);
}

// The header numpy.save writes, byte for byte: the dict, spare room for the first axis to grow
// to 21 digits, then spaces and '\n' up to a multiple of 64 bytes.
std::string header_for(DType dtype, const Shape& shape) {
  const auto* entry = std::find_if(std::begin(kDescrs), std::end(kDescrs), [&](const auto& e) { return e.dtype == dtype; });
  std::string dict = "{'descr': '" + std::string(entry->descr) + "', 'fortran_order': False, 'shape': (";
  for (std::size_t i = 0; i < shape.size(); ++i) dict += (i ? ", " : "") + std::to_string(shape[i]);
  dict += shape.size() == 1 ? ",), }" : "), }";
  if (!shape.empty()) dict.append(21 - std::to_string(shape[0]).size(), ' ');
  auto padding = [&](std::size_t prefix) { return kAlign - (prefix + dict.size() + 1) % kAlign; };
  const bool v1 = dict.size() + padding(10) + 1 <= 65535;  // numpy's rule: 2.0 only when 1.0's uint16 overflows
  const std::size_t prefix = v1 ? 10 : 12;
  const std::size_t pad = padding(prefix);
  const std::size_t hlen = dict.size() + pad + 1;
  std::string out(kMagic, sizeof kMagic);
  out += static_cast<char>(v1 ? 1 : 2);
  out += '\0';
  for (std::size_t i = 0; i < prefix - 8; ++i) out += static_cast<char>((hlen >> (8 * i)) & 0xff);
  return out + dict + std::string(pad, ' ') + '\n';
}

struct Fd {
  int fd = -1;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

/// An opened .npy file whose header has been read and checked against the file's size.
struct NpyFile {
  Fd f;
  Layout lay;
  Shape shape;
  std::int64_t count = 0;
  std::size_t offset = 0, need = 0, size = 0;
  bool fortran = false;
};

void open_npy(const std::string& path, NpyFile& out) {
  // stat first: opening a FIFO for reading would block until a writer comes.
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) bad(path, "cannot open: ", errno_text());
  auto check_regular = [&] {
    const auto m = st.st_mode;
    if (S_ISREG(m)) return;
    const char* kind = S_ISDIR(m) ? "a directory" : S_ISFIFO(m) ? "a FIFO" : S_ISSOCK(m) ? "a socket" : "a device";
    bad(path, "not a regular file (", kind, ")");
  };
  check_regular();
  Fd& f = out.f;
  f.fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);  // O_NONBLOCK: in case it became a FIFO
  if (f.fd < 0) bad(path, "cannot open: ", errno_text());
  if (::fstat(f.fd, &st) != 0) bad(path, "cannot stat: ", errno_text());
  check_regular();
  const auto size = static_cast<std::size_t>(st.st_size);

  unsigned char pre[12] = {};
  read_at(f.fd, pre, std::min(size, sizeof pre), 0, path, "header");
  if (size < sizeof kMagic || std::memcmp(pre, kMagic, sizeof kMagic) != 0)
    bad(path, "not an NPY file (bad magic: expected \\x93NUMPY, got '",
        printable(std::string_view(reinterpret_cast<char*>(pre), std::min(size, sizeof kMagic))), "', ", size,
        " bytes in all)");
  const int major = pre[6], minor = pre[7];
  if (size >= 8 && (major < 1 || major > 3 || minor != 0))
    bad(path, "unsupported NPY format version ", major, ".", minor, " (this reader knows 1.0, 2.0 and 3.0)");
  const std::size_t prefix = major == 1 ? 10 : 12;  // magic, version, uint16 or uint32 header length
  if (size < prefix) bad(path, "header is truncated: the file ends after ", size, " bytes, inside the NPY prefix");
  std::size_t hlen = pre[8] | std::size_t{pre[9]} << 8;
  if (major > 1) hlen |= std::size_t{pre[10]} << 16 | std::size_t{pre[11]} << 24;
  if (hlen > size - prefix)
    bad(path, "header is truncated: it announces ", hlen, " bytes, the file holds ", size - prefix, " after the ",
        prefix, "-byte prefix");
  std::string text(hlen, '\0');
  read_at(f.fd, text.data(), hlen, prefix, path, "header");

  const Header h = HeaderParser(text, path).parse();
  for (auto [key, has] : {std::pair{"descr", h.descr.has_value()}, std::pair{"fortran_order", h.fortran_order.has_value()},
                          std::pair{"shape", h.shape.has_value()}})
    if (!has) bad(path, "header lacks the key '", key, "': ", printable(text));
  const Layout lay = layout_of(*h.descr, h.descr_is_string, path);
  const Shape& shape = *h.shape;
  std::int64_t count = 1, bytes = 0;
  for (std::int64_t d : shape)
    if (__builtin_mul_overflow(count, d, &count)) bad(path, "shape ", to_string(shape), " has more than 2^63 elements");
  if (__builtin_mul_overflow(count, static_cast<std::int64_t>(lay.item), &bytes))
    bad(path, "shape ", to_string(shape), " of ", to_string(lay.dtype), " needs more than 2^63 bytes");
  const std::size_t offset = prefix + hlen, need = static_cast<std::size_t>(bytes);
  if (need > size - offset)
    bad(path, "file is shorter than its data: shape ", to_string(shape), " of '", *h.descr, "' needs ", need,
        " bytes after the ", offset, "-byte header, ", size - offset, " are present");

  out.lay = lay, out.shape = shape, out.count = count, out.offset = offset, out.need = need, out.size = size;
  // Fortran order is the C order of the reversed shape.
  out.fortran = *h.fortran_order && shape.size() > 1;
}

}  // namespace

Tensor load_npy(const std::string& path, Device device) {
  NpyFile n;
  open_npy(path, n);
  // Fortran order: read the C order of the reversed shape, then reverse the axes.
  Tensor out = Tensor::empty(n.fortran ? Shape(n.shape.rbegin(), n.shape.rend()) : n.shape, n.lay.dtype, Device::cpu());
  auto* data = static_cast<unsigned char*>(out.data_ptr());
  read_at(n.f.fd, data, n.need, n.offset, path, "data");
  if (n.lay.swap) byte_swap(data, static_cast<std::size_t>(n.count), n.lay.item);
  if (n.lay.dtype == bool_) std::replace_if(data, data + n.need, [](unsigned char b) { return b > 1; }, 1);
  out = out.to(device);
  return n.fortran ? ops::transpose(out) : out;
}

Tensor load_npy(const std::string& path, NpyLoadOptions options) {
  if (!options.mmap) return load_npy(path, Device::cpu());
  NpyFile n;
  open_npy(path, n);
  // The file's bytes are the tensor's: they must already be in mpt's layout.
  if (n.fortran) bad(path, "mmap needs a C-order array; this one is Fortran-order (np.ascontiguousarray before saving)");
  if (n.lay.swap) bad(path, "mmap needs little-endian data; this file is big-endian (astype('<...') before saving)");
  if (n.offset % n.lay.item != 0)
    bad(path, "mmap needs the data at a multiple of its ", n.lay.item, "-byte items; the header ends at byte ", n.offset);
  auto impl = std::make_shared<TensorImpl>();
  impl->shape = n.shape, impl->dtype = n.lay.dtype, impl->id = detail::next_tensor_id();
  if (n.need == 0) {
    impl->storage = std::make_shared<Storage>(0, Device::cpu());
    return Tensor(impl);
  }
  // Private and writable: pages come from the file as they are read and may be dropped again
  // under memory pressure (so an array larger than memory trains); a write (an in-place op)
  // copies its page and never reaches the file.
  const std::size_t length = n.offset + n.need;
  void* map = ::mmap(nullptr, length, PROT_READ | PROT_WRITE, MAP_PRIVATE, n.f.fd, 0);
  if (map == MAP_FAILED) bad(path, "mmap of ", length, " bytes failed: ", errno_text());
  impl->storage = std::make_shared<Storage>(static_cast<unsigned char*>(map) + n.offset, n.need, Device::cpu(),
                                            [map, length](void*) { ::munmap(map, length); });
  return Tensor(impl);
}


void save_npy(const std::string& path, const Tensor& t) {
  MPT_CHECK(t.defined(), "save_npy: '", path, "': the tensor is undefined");
  // NumPy has no bfloat16: write its exact float32 values (see npy.hpp).
  const DType dtype = t.dtype() == bfloat16 ? float32 : t.dtype();
  const std::string header = header_for(dtype, t.shape());
  const auto n = static_cast<std::size_t>(t.numel());
  std::vector<char> bytes(header.size() + n * itemsize(dtype));
  std::memcpy(bytes.data(), header.data(), header.size());
  if (n > 0) t.copy_to_host(bytes.data() + header.size(), dtype);  // brings it to the host and converts
  if constexpr (std::endian::native == std::endian::big)
    byte_swap(reinterpret_cast<unsigned char*>(bytes.data() + header.size()), n, itemsize(dtype));
  try {
    write_atomically(path, bytes);
  } catch (const Error& e) {
    fail("save_npy: ", e.what());
  }
}

}  // namespace mpt::io
