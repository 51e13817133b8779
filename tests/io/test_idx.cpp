// The IDX reader: every element type, plain and gzip, and hundreds of corrupt files that must
// each be an mpt::Error naming the file (never a crash or an absurd allocation).
#include <sys/resource.h>
#include <sys/stat.h>

#include <cmath>
#include <limits>

#include "io/idx_writer.hpp"
#include "test_util.hpp"

using namespace mpt;
using mpt::test::Bytes;

namespace {

const mpt::test::TempDir& tmp() {
  static mpt::test::TempDir dir("test_idx");
  return dir;
}

// Writes `bytes` plain or gzip-compressed and reads it back.
Tensor roundtrip(const Bytes& bytes, bool gz, const std::string& name) {
  const std::string path = tmp().file(name + (gz ? ".gz" : ""));
  gz ? mpt::test::write_gz(path, bytes) : mpt::test::write_plain(path, bytes);
  return io::read_idx(path);
}

// "" when read_idx accepts the file; otherwise the mpt::Error's message (anything else fails).
std::string error_of(const std::string& path) {
  try {
    io::read_idx(path);
  } catch (const mpt::Error& e) {
    return e.what();
  }
  return "";
}

Bytes sample_images() {  // uint8 [3, 4, 5]: 0, 1, ..., 59
  Bytes pixels(60);
  for (int i = 0; i < 60; ++i) pixels[i] = static_cast<std::uint8_t>(i * 4);
  return mpt::test::idx_bytes(0x08, {3, 4, 5}, pixels);
}

long max_rss_kb() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return u.ru_maxrss;
}

}  // namespace

TEST_CASE("read_idx: uint8 images and labels, plain and gzip") {
  for (bool gz : {false, true}) {
    CAPTURE(gz);
    Tensor x = roundtrip(sample_images(), gz, "images");
    CHECK(x.shape() == Shape{3, 4, 5});
    CHECK(x.dtype() == uint8);
    CHECK(x.device() == Device::cpu());
    std::vector<std::uint8_t> v = x.to_vector<std::uint8_t>();
    for (int i = 0; i < 60; ++i) CHECK(v[i] == i * 4);

    Tensor y = roundtrip(mpt::test::idx_bytes(0x08, {10}, {9, 8, 7, 6, 5, 4, 3, 2, 1, 0}), gz, "labels");
    CHECK(y.shape() == Shape{10});
    CHECK(y.to_vector<std::uint8_t>() == std::vector<std::uint8_t>{9, 8, 7, 6, 5, 4, 3, 2, 1, 0});
  }
}

TEST_CASE("read_idx: int8, int16, int32, float32, float64 (big-endian; small ints widen to int32)") {
  for (bool gz : {false, true}) {
    CAPTURE(gz);
    const std::vector<std::int8_t> i8{-128, -1, 0, 1, 127, 42};
    Tensor a = roundtrip(mpt::test::idx_bytes(0x09, {2, 3}, mpt::test::be_payload(i8)), gz, "i8");
    CHECK(a.dtype() == int32);
    CHECK(a.shape() == Shape{2, 3});
    CHECK(a.to_vector<std::int32_t>() == std::vector<std::int32_t>{-128, -1, 0, 1, 127, 42});

    const std::vector<std::int16_t> i16{-32768, -2, 0, 300, 32767};
    Tensor b = roundtrip(mpt::test::idx_bytes(0x0B, {5}, mpt::test::be_payload(i16)), gz, "i16");
    CHECK(b.dtype() == int32);
    CHECK(b.to_vector<std::int32_t>() == std::vector<std::int32_t>{-32768, -2, 0, 300, 32767});

    const std::vector<std::int32_t> i32{std::numeric_limits<std::int32_t>::min(), -70000, 0, 65536,
                                        std::numeric_limits<std::int32_t>::max(), 7};
    Tensor c = roundtrip(mpt::test::idx_bytes(0x0C, {3, 1, 2}, mpt::test::be_payload(i32)), gz, "i32");
    CHECK(c.dtype() == int32);
    CHECK(c.shape() == Shape{3, 1, 2});
    CHECK(c.to_vector<std::int32_t>() == i32);

    const std::vector<float> f32{-0.5f, 1e30f, 3.25f, std::numeric_limits<float>::infinity(), 1e-40f, 0.0f};
    Tensor d = roundtrip(mpt::test::idx_bytes(0x0D, {6}, mpt::test::be_payload(f32)), gz, "f32");
    CHECK(d.dtype() == float32);
    CHECK(d.to_vector<float>() == f32);

    const std::vector<double> f64{-1.0 / 3.0, 1e300, 2.5, -0.0};
    Tensor e = roundtrip(mpt::test::idx_bytes(0x0E, {1, 1, 2, 2}, mpt::test::be_payload(f64)), gz, "f64");
    CHECK(e.dtype() == float64);
    CHECK(e.shape() == Shape{1, 1, 2, 2});
    CHECK(e.to_vector<double>() == f64);
  }
}

TEST_CASE("read_idx: a size-0 dimension gives an empty tensor") {
  for (bool gz : {false, true}) {
    Tensor x = roundtrip(mpt::test::idx_bytes(0x08, {0, 28, 28}, {}), gz, "empty");
    CHECK(x.shape() == Shape{0, 28, 28});
    CHECK(x.numel() == 0);
  }
}

TEST_CASE("read_idx: missing, directory, empty and unreadable files name the path") {
  const std::string missing = tmp().file("does_not_exist-idx3-ubyte.gz");
  std::string msg = error_of(missing);
  CHECK(msg.find(missing) != std::string::npos);
  CHECK(msg.find("no such file") != std::string::npos);

  msg = error_of(tmp().path.string());
  CHECK(msg.find("directory") != std::string::npos);

  const std::string empty = tmp().file("empty");
  mpt::test::write_plain(empty, {});
  msg = error_of(empty);
  CHECK(msg.find(empty) != std::string::npos);
  CHECK(msg.find("empty") != std::string::npos);

  const std::string locked = tmp().file("locked");
  mpt::test::write_plain(locked, sample_images());
  ::chmod(locked.c_str(), 0);
  if (::access(locked.c_str(), R_OK) != 0) {  // root reads anything: nothing to test then
    msg = error_of(locked);
    CHECK(msg.find(locked) != std::string::npos);
    CHECK(msg.find("cannot open") != std::string::npos);
  }
  ::chmod(locked.c_str(), 0600);
}

TEST_CASE("read_idx: malformed headers are errors that say what is wrong") {
  struct Case {
    const char* name;
    Bytes bytes;
    const char* expect;
  };
  Bytes ok = sample_images();
  Bytes bad_magic = ok;
  bad_magic[1] = 3;
  Bytes bad_type = ok;
  bad_type[2] = 0x0A;
  Bytes zero_dims = ok;
  zero_dims[3] = 0;
  Bytes many_dims = ok;
  many_dims[3] = 200;
  Bytes trailing = ok;
  trailing.push_back(0);
  const std::vector<Case> cases{
      {"bad_magic", bad_magic, "not an IDX file"},
      {"bad_type", bad_type, "unknown IDX type code 0x0a"},
      {"zero_dims", zero_dims, "0 dimensions"},
      {"many_dims", many_dims, "200 dimensions"},
      {"trailing", trailing, "trailing data"},
      {"short_data", mpt::test::idx_bytes(0x08, {3, 4, 5}, Bytes(59, 1)), "truncated"},
      {"huge_dims", mpt::test::idx_bytes(0x0E, {0xffffffffu, 0xffffffffu, 0xffffffffu}, Bytes(8, 0)), "GiB"},
      {"huge_file_claim", mpt::test::idx_bytes(0x08, {60000, 28, 28}, Bytes(100, 0)), "truncated"},
      {"two_bytes", Bytes{0, 0}, "truncated"},
  };
  for (const auto& c : cases) {
    for (bool gz : {false, true}) {
      CAPTURE(c.name);
      CAPTURE(gz);
      if (gz && std::string(c.name) == "trailing") continue;  // covered below
      const std::string path = tmp().file(std::string("malformed_") + c.name + (gz ? ".gz" : ""));
      gz ? mpt::test::write_gz(path, c.bytes) : mpt::test::write_plain(path, c.bytes);
      const std::string msg = error_of(path);
      CHECK(msg.find(path) != std::string::npos);
      CHECK_MESSAGE(msg.find(c.expect) != std::string::npos, msg);
    }
  }
  // Decompressed bytes past the declared data are trailing data too.
  const std::string path = tmp().file("trailing_decompressed.gz");
  mpt::test::write_gz(path, trailing);
  CHECK(error_of(path).find("trailing data") != std::string::npos);
}

TEST_CASE("read_idx: truncation at every length is an error (plain and gzip)") {
  const Bytes full = sample_images();
  int cases = 0;
  for (std::size_t len = 0; len < full.size(); ++len) {
    const std::string path = tmp().file("cut_plain");
    mpt::test::write_plain(path, Bytes(full.begin(), full.begin() + static_cast<std::ptrdiff_t>(len)));
    const std::string msg = error_of(path);
    CHECK_MESSAGE(!msg.empty(), "plain file cut at ", len, " bytes was accepted");
    CHECK(msg.find(path) != std::string::npos);
    ++cases;
  }
  const std::string gz_path = tmp().file("full.gz");
  mpt::test::write_gz(gz_path, full);
  const Bytes gz = mpt::test::read_all(gz_path);
  for (std::size_t len = 0; len < gz.size(); ++len) {
    const std::string path = tmp().file("cut.gz");
    mpt::test::write_plain(path, Bytes(gz.begin(), gz.begin() + static_cast<std::ptrdiff_t>(len)));
    const std::string msg = error_of(path);
    CHECK_MESSAGE(!msg.empty(), "gzip file cut at ", len, " of ", gz.size(), " bytes was accepted");
    ++cases;
  }
  CHECK(cases > 150);
  // A gzip stream followed by junk reads as the stream alone (zlib ignores what follows it).
  Bytes junk = gz;
  junk.insert(junk.end(), {1, 2, 3, 4, 5});
  const std::string path = tmp().file("junk_after.gz");
  mpt::test::write_plain(path, junk);
  CHECK(io::read_idx(path).shape() == Shape{3, 4, 5});
}

TEST_CASE("read_idx: every single-bit flip in the header is an error unless it names a same-size type") {
  const Bytes full = sample_images();
  const std::string path = tmp().file("flip");
  int errors = 0, accepted = 0;
  for (std::size_t byte = 0; byte < 16; ++byte) {
    for (int bit = 0; bit < 8; ++bit) {
      Bytes b = full;
      b[byte] ^= static_cast<std::uint8_t>(1u << bit);
      mpt::test::write_plain(path, b);
      const std::string msg = error_of(path);
      if (msg.empty()) {
        // 0x08 uint8 -> 0x09 int8 is the one flip that still describes these 60 bytes.
        CHECK_MESSAGE((byte == 2 && b[2] == 0x09), "flip of bit ", bit, " of byte ", byte, " was accepted");
        ++accepted;
      } else {
        CHECK(msg.find(path) != std::string::npos);
        ++errors;
      }
    }
  }
  CHECK(errors == 127);
  CHECK(accepted == 1);
}

TEST_CASE("read_idx: random bit flips in gzip files never crash, and almost all are errors") {
  Bytes payload(3000);
  std::uint64_t s = 12345;
  for (auto& p : payload) p = static_cast<std::uint8_t>((s = s * 6364136223846793005ull + 1442695040888963407ull) >> 56);
  const Bytes full = mpt::test::idx_bytes(0x0D, {750}, payload);
  const std::string gz_path = tmp().file("flip_src.gz");
  mpt::test::write_gz(gz_path, full);
  const Bytes gz = mpt::test::read_all(gz_path);
  const std::string path = tmp().file("flip.gz");
  int errors = 0, accepted = 0;
  for (int k = 0; k < 300; ++k) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    Bytes b = gz;
    const std::size_t pos = 10 + static_cast<std::size_t>((s >> 33) % (gz.size() - 10));  // past the gzip header
    b[pos] ^= static_cast<std::uint8_t>(1u << ((s >> 20) % 8));
    mpt::test::write_plain(path, b);
    try {
      Tensor t = io::read_idx(path);
      CHECK(t.numel() == 750);  // whatever got through still matches its header
      ++accepted;
    } catch (const mpt::Error& e) {
      CHECK(std::string(e.what()).find(path) != std::string::npos);
      ++errors;
    }
  }
  MESSAGE(errors, " of 300 flipped gzip files rejected");
  CHECK(errors >= 290);  // the CRC-32 catches every change to the data
}

TEST_CASE("read_idx: a header claiming far more data than the file holds allocates nothing big") {
  // 1 GB claimed by a 2 MB incompressible gzip file: within deflate's ratio, so the reader
  // has to read to find out, and memory must follow the data actually there.
  Bytes payload(2 << 20);
  std::uint64_t s = 99;
  for (auto& p : payload) p = static_cast<std::uint8_t>((s = s * 6364136223846793005ull + 1442695040888963407ull) >> 56);
  const std::string path = tmp().file("claims_1gb.gz");
  mpt::test::write_gz(path, mpt::test::idx_bytes(0x08, {1000, 1000, 1000}, payload));
  const long before = max_rss_kb();
  const std::string msg = error_of(path);
  CHECK(msg.find("truncated") != std::string::npos);
  CHECK(max_rss_kb() - before < 200 * 1024);

  // The same claim in a small file is refused from the header alone.
  const std::string small = tmp().file("claims_1gb_small.gz");
  mpt::test::write_gz(small, mpt::test::idx_bytes(0x08, {1000, 1000, 1000}, Bytes(100, 7)));
  CHECK(error_of(small).find("can hold") != std::string::npos);
  const std::string plain = tmp().file("claims_1gb_plain");
  mpt::test::write_plain(plain, mpt::test::idx_bytes(0x08, {1000, 1000, 1000}, Bytes(100, 7)));
  CHECK(error_of(plain).find("truncated") != std::string::npos);
}

TEST_CASE("read_idx: a corrupt gzip stream is an error") {
  const std::string path = tmp().file("garbage.gz");
  mpt::test::write_plain(path, Bytes{0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 0, 3, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff});
  const std::string msg = error_of(path);
  CHECK(msg.find(path) != std::string::npos);
  CHECK(msg.find("gzip") != std::string::npos);
}
