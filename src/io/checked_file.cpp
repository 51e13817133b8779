#include "io/checked_file.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <omp.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>

#include "io/hdf5_file.hpp"
#include "io/keras_zip.hpp"
#include "mpt/error.hpp"

namespace mpt::io {

namespace {

// Layout of the userblock (little-endian integers):
//   [0, 16)  magic            [16, 20) header version   [20, 28) payload length
//   [28, 32) payload CRC32    [32, 36) header CRC32 (of all 512 bytes, this field zeroed)
//   [64, 512) a NUL-padded text note for people who open the file in an editor.
constexpr char kMagic[16] = {'\x89', 'M', 'P', 'T', ' ', 'c', 'h', 'e', 'c', 'k', 'p', 'o', 'i', 'n', 't', '\n'};
constexpr std::uint32_t kHeaderVersion = 1;
constexpr unsigned char kHdf5Signature[8] = {0x89, 'H', 'D', 'F', '\r', '\n', 0x1a, '\n'};
// A file whose first bytes differ from the magic in at most this many bits is a damaged mpt
// file (never handed to HDF5); foreign files are nowhere near.
constexpr int kMagicTolerance = 32;

std::string errno_text() { return std::strerror(errno); }

void put_u32(unsigned char* p, std::uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<unsigned char>(v >> (8 * i));
}
void put_u64(unsigned char* p, std::uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = static_cast<unsigned char>(v >> (8 * i));
}
std::uint32_t get_u32(const unsigned char* p) {
  std::uint32_t v = 0;
  for (int i = 3; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}
std::uint64_t get_u64(const unsigned char* p) {
  std::uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

std::uint32_t header_crc(const unsigned char* header) {
  unsigned char copy[kUserblockSize];
  std::memcpy(copy, header, kUserblockSize);
  put_u32(copy + 32, 0);
  return crc32_of(copy, kUserblockSize);
}

/// Differing bits between the file's first bytes and the magic's.
int magic_distance(const unsigned char* p, std::size_t n) {
  int bits = 0;
  for (std::size_t i = 0; i < std::min<std::size_t>(n, sizeof kMagic); ++i)
    bits += std::popcount(static_cast<unsigned>(p[i] ^ static_cast<unsigned char>(kMagic[i])));
  return bits;
}

struct Fd {
  int fd = -1;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

void write_all(int fd, const void* data, std::size_t n, off_t offset, const std::string& what) {
  const auto* p = static_cast<const unsigned char*>(data);
  while (n > 0) {
    const ssize_t w = ::pwrite(fd, p, n, offset);
    if (w < 0 && errno == EINTR) continue;
    MPT_CHECK(w > 0, what, ": write failed: ", errno_text());
    p += w, n -= static_cast<std::size_t>(w), offset += w;
  }
}

std::string dir_of(const std::string& path) {
  const auto slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  return slash == 0 ? "/" : path.substr(0, slash);
}

/// Fills in the userblock of a finished HDF5 file and fsyncs it.
void stamp(const std::string& tmp, const std::string& path, const std::string& kind) {
  Fd f;
  f.fd = ::open(tmp.c_str(), O_RDWR | O_CLOEXEC);
  MPT_CHECK(f.fd >= 0, "saving '", path, "': cannot reopen the temporary file: ", errno_text());
  struct stat st {};
  MPT_CHECK(::fstat(f.fd, &st) == 0, "saving '", path, "': fstat failed: ", errno_text());
  const auto size = static_cast<std::uint64_t>(st.st_size);
  MPT_CHECK(size > kUserblockSize, "saving '", path, "': the HDF5 writer produced no payload");
  std::vector<unsigned char> buf(1 << 20);
  std::uint32_t crc = 0;
  for (std::uint64_t off = kUserblockSize; off < size;) {
    const ssize_t r = ::pread(f.fd, buf.data(), std::min<std::uint64_t>(buf.size(), size - off), static_cast<off_t>(off));
    if (r < 0 && errno == EINTR) continue;
    MPT_CHECK(r > 0, "saving '", path, "': reading back the temporary file failed: ", errno_text());
    if (off == kUserblockSize)
      MPT_CHECK(r >= 8 && std::memcmp(buf.data(), kHdf5Signature, 8) == 0, "saving '", path,
                "': the HDF5 superblock is not where the userblock ends");
    crc = crc32_of(buf.data(), static_cast<std::size_t>(r), crc);
    off += static_cast<std::uint64_t>(r);
  }
  unsigned char header[kUserblockSize] = {};
  std::memcpy(header, kMagic, sizeof kMagic);
  put_u32(header + 16, kHeaderVersion);
  put_u64(header + 20, size - kUserblockSize);
  put_u32(header + 28, crc);
  const std::string note = "mpt checkpoint (" + kind +
                           "): an HDF5 file after this 512-byte userblock; bytes 20-27 hold the payload "
                           "length and 28-31 its CRC32 (little-endian).\n";
  std::memcpy(header + 64, note.data(), std::min<std::size_t>(note.size(), kUserblockSize - 64 - 1));
  put_u32(header + 32, header_crc(header));
  write_all(f.fd, header, sizeof header, 0, "saving '" + path + "'");
  MPT_CHECK(::fsync(f.fd) == 0, "saving '", path, "': fsync failed: ", errno_text());
  const int fd = f.fd;
  f.fd = -1;
  MPT_CHECK(::close(fd) == 0, "saving '", path, "': close failed: ", errno_text());
}

}  // namespace

std::uint32_t crc32_of(const void* data, std::size_t n, std::uint32_t crc) {
  const auto* p = static_cast<const Bytef*>(data);
  uLong c = crc;
  while (n > 0) {
    const uInt chunk = static_cast<uInt>(std::min<std::size_t>(n, 1u << 30));
    c = ::crc32(c, p, chunk);
    p += chunk, n -= chunk;
  }
  return static_cast<std::uint32_t>(c);
}

namespace {

/// A fresh temporary name in the folder of `path` (so that rename stays on one file system).
std::string temp_path_for(const std::string& path) {
  MPT_CHECK(!path.empty(), "save: empty file path");
  MPT_CHECK(path.back() != '/', "save: '", path, "' names a folder, not a file");
  static std::atomic<std::uint64_t> counter{0};
  const std::size_t slash = path.find_last_of('/');
  const std::string prefix = slash == std::string::npos ? "" : path.substr(0, slash + 1);
  std::string base = slash == std::string::npos ? path : path.substr(slash + 1);
  const std::string suffix = ".tmp-" + std::to_string(::getpid()) + "-" + std::to_string(counter++);
  // "." + base + suffix must fit in one name (NAME_MAX, 255 bytes on Linux's file systems): a
  // legal long name gets a shortened base here, never "File name too long".
  constexpr std::size_t kNameMax = 255;
  if (1 + base.size() + suffix.size() > kNameMax) base.resize(kNameMax - 1 - suffix.size());
  return prefix + "." + base + suffix;
}

/// Renames the finished temporary file over `path` and makes the rename durable.
void commit(const std::string& tmp, const std::string& path) {
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const std::string why = errno_text();
    ::unlink(tmp.c_str());
    fail("saving '", path, "': rename failed: ", why);
  }
  // File systems that cannot sync folders say EINVAL.
  const std::string dir = dir_of(path);
  Fd d;
  d.fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (d.fd >= 0 && ::fsync(d.fd) != 0 && errno != EINVAL && errno != EROFS)
    fail("saving '", path, "': fsync of folder '", dir, "' failed: ", errno_text());
}

}  // namespace

namespace {
/// Creates the temporary file itself first, so that a missing or read-only folder is reported
/// with the OS's reason rather than as HDF5's error stack; HDF5 then truncates and writes it.
void create_temp(const std::string& tmp, const std::string& path) {
  check_writable_file("saving", path);
  Fd f;
  f.fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
  MPT_CHECK(f.fd >= 0, "saving '", path, "': cannot create a file in '", dir_of(path), "': ", errno_text());
}

/// Runs the HDF5 writer; a failure caused by the file system (full disk, quota, size limit, I/O
/// error) is reported with the OS's reason first, HDF5's details after.
void write_with_reason(const std::string& tmp, const std::string& path,
                       const std::function<void(const std::string&)>& write_hdf5) {
  errno = 0;
  try {
    write_hdf5(tmp);
  } catch (const Error& e) {
    const int err = errno;
    if (err == ENOSPC || err == EDQUOT || err == EFBIG || err == EIO || err == EROFS)
      fail("saving '", path, "': ", std::strerror(err), " (", e.what(), ")");
    throw;
  }
}
}  // namespace

void save_atomically(const std::string& path, const std::string& kind,
                     const std::function<void(const std::string&)>& write_hdf5) {
  const std::string tmp = temp_path_for(path);
  create_temp(tmp, path);
  try {
    write_with_reason(tmp, path, write_hdf5);
    stamp(tmp, path, kind);
  } catch (...) {
    ::unlink(tmp.c_str());
    throw;
  }
  commit(tmp, path);
}

std::vector<char> stamped_image(const std::string& path, const std::string& kind,
                                const std::function<void(const std::string&)>& write_hdf5) {
  const std::string tmp = temp_path_for(path);
  std::vector<char> bytes;
  create_temp(tmp, path);
  try {
    write_with_reason(tmp, path, write_hdf5);
    stamp(tmp, path, kind);
    std::ifstream in(tmp, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), {});
    MPT_CHECK(in.good() || in.eof(), "saving '", path, "': reading back the temporary file failed");
  } catch (...) {
    ::unlink(tmp.c_str());
    throw;
  }
  ::unlink(tmp.c_str());
  return bytes;
}

void write_atomically(const std::string& path, const std::vector<char>& bytes) {
  const std::string tmp = temp_path_for(path);
  try {
    Fd f;
    f.fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666);
    MPT_CHECK(f.fd >= 0, "cannot create '", path, "' (temporary file): ", errno_text());
    write_all(f.fd, bytes.data(), bytes.size(), 0, "saving '" + path + "'");
    MPT_CHECK(::fsync(f.fd) == 0, "saving '", path, "': fsync failed: ", errno_text());
    const int fd = f.fd;
    f.fd = -1;
    MPT_CHECK(::close(fd) == 0, "saving '", path, "': close failed: ", errno_text());
  } catch (...) {
    ::unlink(tmp.c_str());
    throw;
  }
  commit(tmp, path);
}

namespace {
void check_file_type(const std::string& component, const std::string& path, const struct stat& st) {
  MPT_CHECK(!S_ISDIR(st.st_mode), component, ": '", path, "' is a directory, not a file");
  MPT_CHECK(S_ISREG(st.st_mode), component, ": '", path, "' is not a regular file (a FIFO, socket or device)");
}
}  // namespace

void check_regular_file(const std::string& component, const std::string& path) {
  struct stat st {};
  MPT_CHECK(::stat(path.c_str(), &st) == 0, component, ": cannot open '", path, "': ", errno_text());
  check_file_type(component, path, st);
}

void check_writable_file(const std::string& component, const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return;  // created by the write
  check_file_type(component, path, st);
}

std::vector<char> read_verified(const std::string& path, std::string* keras_config) {
  Fd f;
  // O_NONBLOCK: opening a FIFO would otherwise wait for a writer; the type check follows.
  f.fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  MPT_CHECK(f.fd >= 0, "cannot open '", path, "': ", errno_text());
  struct stat st {};
  MPT_CHECK(::fstat(f.fd, &st) == 0, "cannot stat '", path, "': ", errno_text());
  MPT_CHECK(S_ISREG(st.st_mode), "'", path, "' is not a regular file");
  MPT_CHECK(st.st_size > 0, "'", path, "' is empty (0 bytes): not a checkpoint");
  MPT_CHECK(st.st_size < (off_t{1} << 40), "'", path, "' is implausibly large (", st.st_size, " bytes)");
  std::vector<char> bytes(static_cast<std::size_t>(st.st_size));
  std::size_t got = 0;
  while (got < bytes.size()) {
    const ssize_t r = ::read(f.fd, bytes.data() + got, bytes.size() - got);
    if (r < 0 && errno == EINTR) continue;
    MPT_CHECK(r >= 0, "reading '", path, "' failed: ", errno_text());
    if (r == 0) break;
    got += static_cast<std::size_t>(r);
  }
  bytes.resize(got);
  MPT_CHECK(!bytes.empty(), "'", path, "' is empty (0 bytes): not a checkpoint");
  if (is_zip(bytes)) {
    verify_zip_stamp(bytes, path);
    // Read every entry through: libzip checks their CRCs.
    std::vector<char> config = zip_entry(bytes, "config.json", path);
    MPT_CHECK(!config.empty(), "'", path, "': the archive's config.json is empty (0 bytes): a .keras file "
              "holds the model's config there");
    zip_entry(bytes, "metadata.json", path);
    if (keras_config) keras_config->assign(config.begin(), config.end());
    std::vector<char> inner = zip_entry(bytes, "model.weights.h5", path);
    verify_image(inner, path + " (model.weights.h5)");
    return inner;
  }
  verify_image(bytes, path);
  return bytes;
}

void verify_image(const std::vector<char>& bytes, const std::string& path) {
  MPT_CHECK(!bytes.empty(), "'", path, "' is empty (0 bytes): not a checkpoint");
  const auto* p = reinterpret_cast<const unsigned char*>(bytes.data());
  const std::size_t n = bytes.size();

  const std::size_t prefix = std::min(n, sizeof kMagic);
  const int dist = magic_distance(p, prefix);
  const bool mpt_file = prefix == sizeof kMagic ? dist <= kMagicTolerance : dist <= static_cast<int>(prefix);
  if (mpt_file) {
    MPT_CHECK(dist == 0, "'", path, "': corrupt mpt checkpoint (damaged header magic)");
    MPT_CHECK(n >= kUserblockSize, "'", path, "': truncated mpt checkpoint (", n, " bytes, the header alone is ",
              kUserblockSize, ")");
    MPT_CHECK(get_u32(p + 32) == header_crc(p), "'", path, "': corrupt mpt checkpoint (header checksum mismatch)");
    MPT_CHECK(get_u32(p + 16) == kHeaderVersion, "'", path, "': mpt checkpoint header version ", get_u32(p + 16),
              " is not supported (this build reads version ", kHeaderVersion, ")");
    const std::uint64_t want = get_u64(p + 20), have = n - kUserblockSize;
    MPT_CHECK(want == have, "'", path, "': ", have < want ? "truncated" : "corrupt", " mpt checkpoint (",
              kUserblockSize + want, " bytes expected, ", n, " found)");
    MPT_CHECK(crc32_of(p + kUserblockSize, have) == get_u32(p + 28), "'", path,
              "': corrupt mpt checkpoint (CRC32 mismatch: the data was damaged after saving)");
    return;
  }
  // Not written by mpt (Keras, h5py): HDF5 looks for its signature at 0, 512, 1024, ...
  bool hdf5 = false;
  for (std::size_t off = 0; off + 8 <= n && !hdf5; off = off ? off * 2 : 512)
    hdf5 = std::memcmp(p + off, kHdf5Signature, 8) == 0;
  MPT_CHECK(hdf5, "'", path, "' is not an HDF5 file (no HDF5 signature; ", n, " bytes)");
}

namespace {
/// The time libhdf5 gets to parse a file mpt did not write: MPT_HDF5_PARSE_SECONDS (a positive
/// number; large foreign files on slow machines may need more), 10 by default.
double parse_seconds() {
  const char* e = std::getenv("MPT_HDF5_PARSE_SECONDS");
  if (e == nullptr || *e == '\0') return 10.0;
  char* end = nullptr;
  const double v = std::strtod(e, &end);
  MPT_CHECK(end != e && *end == '\0' && v > 0 && v < 1e6, "MPT_HDF5_PARSE_SECONDS: expected a positive number of seconds, got '",
            e, "'");
  return v;
}
}  // namespace

void parse_guarded(const std::vector<char>& bytes, const std::string& path, const std::function<void()>& parse) {
  const auto* p = reinterpret_cast<const unsigned char*>(bytes.data());
  const bool stamped = bytes.size() >= kUserblockSize && magic_distance(p, sizeof kMagic) == 0;  // and verified
  if (stamped) return parse();
  const double limit_s = parse_seconds();
  // No other thread of this process is inside libhdf5 while this one holds the HDF5 lock, so the
  // child never inherits libhdf5's lock taken (a valid file called malformed after a hang);
  // the child's copy of this thread's depth lets its parse take the scope without waiting.
  const h5::ProcessScope hdf5_lock;
  std::fflush(nullptr);
  const pid_t pid = ::fork();
  MPT_CHECK(pid >= 0, "'", path, "': cannot start the parse check: ", errno_text());
  if (pid == 0) {  // the child: one thread, no output of its own, exit without cleanup
    omp_set_num_threads(1);
    try {
      parse();
    } catch (...) {
    }
    ::_exit(0);
  }
  int status = 0;
  for (int waited_ms = 0;; waited_ms += 5) {
    const pid_t r = ::waitpid(pid, &status, WNOHANG);
    if (r == pid) break;
    if (r < 0 && errno != EINTR) fail("'", path, "': waiting for the parse check failed: ", errno_text());
    if (waited_ms >= limit_s * 1000) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, &status, 0);
      fail("'", path, "': HDF5 did not finish parsing the file in ", limit_s,
           " s: a malformed HDF5 file (libhdf5 loops on some damaged files; MPT_HDF5_PARSE_SECONDS sets the limit)");
    }
    ::usleep(5000);
  }
  MPT_CHECK(!WIFSIGNALED(status), "'", path, "': HDF5 crashed parsing the file (signal ", WTERMSIG(status),
            "): a malformed HDF5 file");
  // The child ends with _exit(0) whatever parse() did; any other status means a crash that a
  // signal handler of the program's (a crash reporter, libFuzzer) turned into an exit code.
  MPT_CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0, "'", path,
            "': HDF5 crashed parsing the file (exit status ", WIFEXITED(status) ? WEXITSTATUS(status) : -1,
            " after a crash handler): a malformed HDF5 file");
  parse();
}

}  // namespace mpt::io
