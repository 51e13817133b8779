#include "io/keras_zip.hpp"

#include <cstdio>
#include <cstring>
#include <ctime>
#include <memory>

#include "io/checked_file.hpp"
#include "mpt/error.hpp"

#ifdef MPT_WITH_LIBZIP
#include <zip.h>
#endif

namespace mpt::io {

bool is_zip(const std::vector<char>& bytes) { return bytes.size() >= 4 && std::memcmp(bytes.data(), "PK\x03\x04", 4) == 0; }

namespace {
constexpr char kStampPrefix[] = "mpt-crc32:";
constexpr std::size_t kPrefixLen = sizeof kStampPrefix - 1, kStampLen = kPrefixLen + 8;
}  // namespace

void verify_zip_stamp(const std::vector<char>& zip, const std::string& display) {
  if (zip.size() < kStampLen + 22) return;
  const char* tail = zip.data() + zip.size() - kStampLen;
  int bits = 0;
  for (std::size_t i = 0; i < kPrefixLen; ++i)
    bits += __builtin_popcount(static_cast<unsigned char>(tail[i] ^ kStampPrefix[i]));
  if (bits > 24) return;  // not mpt's: no stamp to check
  MPT_CHECK(bits == 0, "'", display, "': corrupt .keras archive (damaged mpt stamp)");
  std::uint32_t want = 0;
  for (std::size_t i = kPrefixLen; i < kStampLen; ++i) {
    const char c = tail[i];
    const int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
    MPT_CHECK(d >= 0, "'", display, "': corrupt .keras archive (damaged mpt stamp)");
    want = (want << 4) | static_cast<std::uint32_t>(d);
  }
  MPT_CHECK(crc32_of(zip.data(), zip.size() - kStampLen) == want, "'", display,
            "': corrupt .keras archive (CRC32 mismatch: the archive was damaged after saving)");
}

#ifdef MPT_WITH_LIBZIP

namespace {

std::string zip_message(zip_error_t* e) {
  std::string s = zip_error_strerror(e);
  zip_error_fini(e);
  return s;
}

struct ZipCloser {
  void operator()(zip_t* z) const { zip_discard(z); }
};
struct FileCloser {
  void operator()(zip_file_t* f) const { zip_fclose(f); }
};

}  // namespace

std::vector<char> zip_entry(const std::vector<char>& bytes, const std::string& name, const std::string& display) {
  zip_error_t err;
  zip_error_init(&err);
  zip_source_t* src = zip_source_buffer_create(bytes.data(), bytes.size(), 0, &err);
  MPT_CHECK(src != nullptr, "'", display, "': ", zip_message(&err));
  std::unique_ptr<zip_t, ZipCloser> za(zip_open_from_source(src, ZIP_RDONLY | ZIP_CHECKCONS, &err));
  if (!za) {
    zip_source_free(src);
    fail("'", display, "': not a readable .keras (zip) archive: ", zip_message(&err));
  }
  zip_error_fini(&err);
  zip_stat_t st;
  zip_stat_init(&st);
  MPT_CHECK(zip_stat(za.get(), name.c_str(), 0, &st) == 0 && (st.valid & ZIP_STAT_SIZE), "'", display, "': no ", name,
            " in the archive");
  // A stored entry cannot be larger than the archive; a compressed one is bounded too (zip bombs).
  const bool stored = (st.valid & ZIP_STAT_COMP_METHOD) && st.comp_method == ZIP_CM_STORE;
  MPT_CHECK(st.size <= (stored ? bytes.size() : std::min<zip_uint64_t>(bytes.size() * 1024ull, 1ull << 36)), "'",
            display, "': ", name, " claims an implausible size (", st.size, " bytes)");
  std::unique_ptr<zip_file_t, FileCloser> f(zip_fopen(za.get(), name.c_str(), 0));
  MPT_CHECK(f != nullptr, "'", display, "': cannot open ", name, ": ", zip_strerror(za.get()));
  std::vector<char> out(static_cast<std::size_t>(st.size) + 1);
  std::size_t got = 0;
  for (;;) {  // read to the end: libzip checks the CRC there
    const zip_int64_t r = zip_fread(f.get(), out.data() + got, out.size() - got);
    MPT_CHECK(r >= 0, "'", display, "': damaged archive entry ", name, ": ", zip_file_strerror(f.get()));
    if (r == 0) break;
    got += static_cast<std::size_t>(r);
    MPT_CHECK(got <= st.size, "'", display, "': ", name, " is longer than the archive says");
  }
  MPT_CHECK(got == st.size, "'", display, "': ", name, " is shorter than the archive says");
  out.resize(got);
  return out;
}

std::vector<char> make_zip(const std::vector<std::pair<std::string, std::vector<char>>>& entries,
                           const std::string& display) {
  zip_error_t err;
  zip_error_init(&err);
  zip_source_t* buf = zip_source_buffer_create(nullptr, 0, 0, &err);
  MPT_CHECK(buf != nullptr, "saving '", display, "': ", zip_message(&err));
  zip_source_keep(buf);
  std::shared_ptr<zip_source_t> keep(buf, [](zip_source_t* s) { zip_source_free(s); });
  zip_t* za = zip_open_from_source(buf, ZIP_TRUNCATE, &err);
  if (!za) {
    zip_source_free(buf);
    fail("saving '", display, "': ", zip_message(&err));
  }
  const time_t now = std::time(nullptr);
  for (const auto& [name, content] : entries) {
    zip_source_t* s = zip_source_buffer(za, content.data(), content.size(), 0);
    zip_int64_t idx = s ? zip_file_add(za, name.c_str(), s, ZIP_FL_ENC_UTF_8 | ZIP_FL_OVERWRITE) : -1;
    if (idx < 0) {
      if (s) zip_source_free(s);
      std::string msg = zip_strerror(za);
      zip_discard(za);
      fail("saving '", display, "': cannot add ", name, ": ", msg);
    }
    if (zip_set_file_compression(za, static_cast<zip_uint64_t>(idx), ZIP_CM_STORE, 0) != 0 ||
        zip_file_set_mtime(za, static_cast<zip_uint64_t>(idx), now, 0) != 0) {
      std::string msg = zip_strerror(za);
      zip_discard(za);
      fail("saving '", display, "': ", msg);
    }
  }
  const std::string placeholder = std::string(kStampPrefix) + "00000000";
  if (zip_set_archive_comment(za, placeholder.data(), static_cast<zip_uint16_t>(placeholder.size())) != 0) {
    std::string msg = zip_strerror(za);
    zip_discard(za);
    fail("saving '", display, "': ", msg);
  }
  if (zip_close(za) != 0) {
    std::string msg = zip_strerror(za);
    zip_discard(za);
    fail("saving '", display, "': writing the archive failed: ", msg);
  }
  MPT_CHECK(zip_source_open(buf) == 0, "saving '", display, "': ", zip_error_strerror(zip_source_error(buf)));
  zip_source_seek(buf, 0, SEEK_END);
  const zip_int64_t size = zip_source_tell(buf);
  zip_source_seek(buf, 0, SEEK_SET);
  std::vector<char> out(static_cast<std::size_t>(std::max<zip_int64_t>(size, 0)));
  const zip_int64_t r = out.empty() ? 0 : zip_source_read(buf, out.data(), out.size());
  zip_source_close(buf);
  MPT_CHECK(size > 0 && r == size, "saving '", display, "': reading back the archive failed");
  // The comment ends the archive: fill in the CRC of everything before it.
  MPT_CHECK(out.size() > kStampLen && std::memcmp(out.data() + out.size() - kStampLen, placeholder.data(), kStampLen) == 0,
            "saving '", display, "': the archive does not end with its comment");
  char hex[9];
  std::snprintf(hex, sizeof hex, "%08x", crc32_of(out.data(), out.size() - kStampLen));
  std::memcpy(out.data() + out.size() - 8, hex, 8);
  return out;
}

#else

std::vector<char> zip_entry(const std::vector<char>&, const std::string&, const std::string& display) {
  fail("'", display, "' is a .keras (zip) archive, but this mpt was built without libzip");
}

std::vector<char> make_zip(const std::vector<std::pair<std::string, std::vector<char>>>&, const std::string& display) {
  fail("saving '", display, "': the .keras format needs libzip, which this mpt was built without; save as .h5");
}

#endif

}  // namespace mpt::io
