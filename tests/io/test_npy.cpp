// NumPy .npy files: round trips of every dtype on every device, files numpy.save wrote (byte for
// byte both ways), and every malformed file, FIFO and failed save as an mpt::Error.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <bit>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <future>
#include <iterator>

#include "idx_writer.hpp"
#include "test_util.hpp"

using namespace mpt;
using mpt::test::contains;
using mpt::test::error_of;

namespace {

// ---- golden files --------------------------------------------------------------------------
// Made once with numpy 2.4.6 and ml_dtypes 0.6.0 (pip, in a venv): numpy.save(f, a) into an
// io.BytesIO f unless noted, the bytes printed as C string literals (the header's text as text).
// a = np.arange(6, dtype='<f4').reshape(2, 3) * 0.5 - 1
constexpr char kF4[] =
    "\x93NUMPY\x01\x00v\x00{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }                       "
    "                                   \n"
    "\x00\x00\x80\xbf\x00\x00\x00\xbf\x00\x00\x00\x00\x00\x00\x00\x3f\x00\x00\x80\x3f\x00\x00\xc0\x3f";
// a = np.array([1.5, -2.25, 1e300], dtype='<f8')
constexpr char kF8[] =
    "\x93NUMPY\x01\x00v\x00{'descr': '<f8', 'fortran_order': False, 'shape': (3,), }                         "
    "                                   \n"
    "\x00\x00\x00\x00\x00\x00\xf8\x3f\x00\x00\x00\x00\x00\x00\x02\xc0\x9c\x75\x00\x88\x3c\xe4\x37\x7e";
// a = np.array([1, -2, 0.5, 65504], dtype='<f2')
constexpr char kF2[] =
    "\x93NUMPY\x01\x00v\x00{'descr': '<f2', 'fortran_order': False, 'shape': (4,), }                         "
    "                                   \n"
    "\x00\x3c\x00\xc0\x00\x38\xff\x7b";
// a = np.array([1, -2, 300000], dtype='<i4')
constexpr char kI4[] =
    "\x93NUMPY\x01\x00v\x00{'descr': '<i4', 'fortran_order': False, 'shape': (3,), }                         "
    "                                   \n"
    "\x01\x00\x00\x00\xfe\xff\xff\xff\xe0\x93\x04\x00";
// a = np.int64(-7)  (a 0-d array)
constexpr char kI8Scalar[] =
    "\x93NUMPY\x01\x00v\x00{'descr': '<i8', 'fortran_order': False, 'shape': (), }                           "
    "                                   \n"
    "\xf9\xff\xff\xff\xff\xff\xff\xff";
// a = np.arange(24, dtype=np.uint8).reshape(2, 3, 4)
constexpr char kU1[] =
    "\x93NUMPY\x01\x00v\x00{'descr': '|u1', 'fortran_order': False, 'shape': (2, 3, 4), }                    "
    "                                   \n"
    "\x00\x01\x02\x03\x04\x05\x06\x07\x08\x09\n\x0b\x0c\x0d\x0e\x0f\x10\x11\x12\x13\x14\x15\x16\x17";
// a = np.array([[True, False, False], [True, True, False]])
constexpr char kB1[] =
    "\x93NUMPY\x01\x00v\x00{'descr': '|b1', 'fortran_order': False, 'shape': (2, 3), }                       "
    "                                   \n"
    "\x01\x00\x00\x01\x01\x00";
// a = np.zeros((0, 3), dtype='<f4')
constexpr char kEmpty[] =
    "\x93NUMPY\x01\x00v\x00{'descr': '<f4', 'fortran_order': False, 'shape': (0, 3), }                       "
    "                                   \n";
// a = np.asfortranarray(np.arange(24, dtype='<i4').reshape(2, 3, 4))
constexpr char kFortran[] =
    "\x93NUMPY\x01\x00v\x00{'descr': '<i4', 'fortran_order': True, 'shape': (2, 3, 4), }                     "
    "                                   \n"
    "\x00\x00\x00\x00\x0c\x00\x00\x00\x04\x00\x00\x00\x10\x00\x00\x00\x08\x00\x00\x00\x14\x00\x00\x00\x01\x00"
    "\x00\x00\x0d\x00\x00\x00\x05\x00\x00\x00\x11\x00\x00\x00\x09\x00\x00\x00\x15\x00\x00\x00\x02\x00\x00\x00"
    "\x0e\x00\x00\x00\x06\x00\x00\x00\x12\x00\x00\x00\n\x00\x00\x00\x16\x00\x00\x00\x03\x00\x00\x00\x0f\x00"
    "\x00\x00\x07\x00\x00\x00\x13\x00\x00\x00\x0b\x00\x00\x00\x17\x00\x00\x00";
// a = np.array([1, -2, 300000], dtype='>i4')
constexpr char kBigI4[] =
    "\x93NUMPY\x01\x00v\x00{'descr': '>i4', 'fortran_order': False, 'shape': (3,), }                         "
    "                                   \n"
    "\x00\x00\x00\x01\xff\xff\xff\xfe\x00\x04\x93\xe0";
// a = np.array([[1.5, -2.25], [3.0, 1e-300]], dtype='>f8')
constexpr char kBigF8[] =
    "\x93NUMPY\x01\x00v\x00{'descr': '>f8', 'fortran_order': False, 'shape': (2, 2), }                       "
    "                                   \n"
    "\x3f\xf8\x00\x00\x00\x00\x00\x00\xc0\x02\x00\x00\x00\x00\x00\x00\x40\x08\x00\x00\x00\x00\x00\x00\x01\xa5"
    "\x6e\x1f\xc2\xf8\xf3\x59";
// a = np.lib.format.write_array(f, np.array([5, -6], dtype='<i8'), version=(2, 0))
constexpr char kV2[] =
    "\x93NUMPY\x02\x00t\x00\x00\x00{'descr': '<i8', 'fortran_order': False, 'shape': (2,), }                 "
    "                                         \n"
    "\x05\x00\x00\x00\x00\x00\x00\x00\xfa\xff\xff\xff\xff\xff\xff\xff";
// a = np.lib.format.write_array(f, np.array([1, -2, 0.5], dtype='<f2'), version=(3, 0))
constexpr char kV3[] =
    "\x93NUMPY\x03\x00t\x00\x00\x00{'descr': '<f2', 'fortran_order': False, 'shape': (3,), }                 "
    "                                         \n"
    "\x00\x3c\x00\xc0\x00\x38";
// a = np.array([1, 2.5, -3], dtype=ml_dtypes.bfloat16)
constexpr char kBF16[] =
    "\x93NUMPY\x01\x00v\x00{'descr': '<V2', 'fortran_order': False, 'shape': (3,), }                         "
    "                                   \n"
    "\x80\x3f\x20\x40\x40\xc0";

template <std::size_t N>
std::string bytes_of(const char (&s)[N]) {
  return std::string(s, N - 1);
}

const mpt::test::TempDir& tmp() {
  static mpt::test::TempDir dir("test_npy");
  return dir;
}

std::string write_file(const std::string& name, const std::string& bytes) {
  const std::string path = tmp().file(name);
  std::ofstream(path, std::ios::binary) << bytes;
  return path;
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

/// An .npy file around a header dict, as numpy lays it out (padded to `align` with ' ', then '\n').
std::string npy(const std::string& dict, const std::string& data = "", int major = 1, std::size_t align = 64) {
  const std::size_t prefix = major == 1 ? 10 : 12;
  std::string header = dict + std::string(align - 1 - (prefix + dict.size()) % align, ' ') + "\n";
  std::string out = std::string("\x93NUMPY") + char(major) + '\0';
  for (std::size_t i = 0; i < prefix - 8; ++i) out += char((header.size() >> (8 * i)) & 0xff);
  return out + header + data;
}

std::string load_error(const std::string& bytes) {
  const std::string path = write_file("bad.npy", bytes);
  const std::string msg = error_of([&] { io::load_npy(path, Device::cpu()); });
  CHECK_MESSAGE(contains(msg, "load_npy: '" + path + "': "), msg);
  return msg;
}

std::vector<double> values_of(const Tensor& t) { return t.to_vector<double>(); }

// Values every dtype holds exactly (uint8 and bool take them modulo their range).
std::vector<double> sample(DType dtype, std::size_t n) {
  std::vector<double> v(n);
  for (std::size_t i = 0; i < n; ++i) {
    const double x = static_cast<double>(i % 7) - 3 + (i % 2 ? 0.5 : 0);
    v[i] = dtype == bool_ ? i % 3 == 0 : dtype == uint8 ? (i * 37) % 256 : is_floating(dtype) ? x : std::floor(x);
  }
  return v;
}

}  // namespace

TEST_CASE("npy: every dtype and shape round-trips through save_npy and load_npy") {
  mpt::test::for_each_device([](Device device) {
    const DType dtypes[] = {float32, float64, float16, bfloat16, int32, int64, uint8, bool_};
    const Shape shapes[] = {{}, {0}, {2, 0, 3}, {5}, {2, 3, 4}};
    for (DType dtype : dtypes) {
      for (const Shape& shape : shapes) {
        CAPTURE(to_string(dtype));
        CAPTURE(to_string(shape));
        const std::vector<double> v = sample(dtype, static_cast<std::size_t>(numel_of(shape)));
        Tensor t = shape.empty() ? Tensor::scalar(v[0], dtype, device)
                                 : Tensor::from_vector(v, shape, device).to(dtype);
        const std::string path = tmp().file("roundtrip.npy");
        io::save_npy(path, t);
        Tensor back = io::load_npy(path, device);
        CHECK(back.device() == device);
        CHECK(back.shape() == shape);
        // NumPy has no bfloat16: it is saved as its exact float32 values.
        CHECK(back.dtype() == (dtype == bfloat16 ? float32 : dtype));
        CHECK(values_of(back) == v);
        CHECK(values_of(back.to(dtype)) == values_of(t));
      }
    }
  });
}

TEST_CASE("npy: float specials keep their bits") {
  const std::vector<float> v{0.0f, -0.0f, INFINITY, -INFINITY, NAN, 1e-45f, 3.4028235e38f, -1.17549435e-38f};
  const std::string path = tmp().file("specials.npy");
  io::save_npy(path, Tensor::from_vector(v, {2, 4}, Device::cpu()));
  const std::vector<float> back = io::load_npy(path, Device::cpu()).to_vector<float>();
  REQUIRE(back.size() == v.size());
  for (std::size_t i = 0; i < v.size(); ++i) CHECK(std::bit_cast<std::uint32_t>(back[i]) == std::bit_cast<std::uint32_t>(v[i]));
}

TEST_CASE("npy: save_npy writes the bytes numpy.save writes") {
  mpt::test::for_each_device([](Device device) {
    auto check = [&](const std::string& golden, const Tensor& t) {
      const std::string path = tmp().file("golden.npy");
      io::save_npy(path, t);
      CHECK(read_file(path) == golden);
    };
    check(bytes_of(kF4), Tensor::from_vector(std::vector<float>{-1, -0.5, 0, 0.5, 1, 1.5}, {2, 3}, device));
    check(bytes_of(kF8), Tensor::from_vector(std::vector<double>{1.5, -2.25, 1e300}, {3}, device));
    check(bytes_of(kF2), Tensor::from_vector(std::vector<double>{1, -2, 0.5, 65504}, {4}, device).to(float16));
    check(bytes_of(kI4), Tensor::from_vector(std::vector<std::int32_t>{1, -2, 300000}, {3}, device));
    check(bytes_of(kI8Scalar), Tensor::scalar(-7, int64, device));
    check(bytes_of(kU1), Tensor::arange(0, 24, 1, uint8, device).reshape({2, 3, 4}));
    check(bytes_of(kB1), Tensor::from_vector(std::vector<bool>{true, false, false, true, true, false}, {2, 3}, device));
    check(bytes_of(kEmpty), Tensor::zeros({0, 3}, float32, device));
  });
}

TEST_CASE("npy: load_npy reads numpy's files: Fortran order, big-endian, bool, versions 2.0 and 3.0, bfloat16") {
  mpt::test::for_each_device([](Device device) {
    auto load = [&](const std::string& bytes, DType dtype, const Shape& shape) {
      Tensor t = io::load_npy(write_file("golden.npy", bytes), device);
      CHECK(t.device() == device);
      CHECK(t.dtype() == dtype);
      CHECK(t.shape() == shape);
      return values_of(t);
    };
    CHECK(load(bytes_of(kF4), float32, {2, 3}) == std::vector<double>{-1, -0.5, 0, 0.5, 1, 1.5});
    CHECK(load(bytes_of(kF8), float64, {3}) == std::vector<double>{1.5, -2.25, 1e300});
    CHECK(load(bytes_of(kF2), float16, {4}) == std::vector<double>{1, -2, 0.5, 65504});
    CHECK(load(bytes_of(kI4), int32, {3}) == std::vector<double>{1, -2, 300000});
    CHECK(load(bytes_of(kI8Scalar), int64, {}) == std::vector<double>{-7});
    CHECK(load(bytes_of(kB1), bool_, {2, 3}) == std::vector<double>{1, 0, 0, 1, 1, 0});
    CHECK(load(bytes_of(kEmpty), float32, {0, 3}).empty());
    std::vector<double> iota(24);
    for (int i = 0; i < 24; ++i) iota[i] = i;
    CHECK(load(bytes_of(kU1), uint8, {2, 3, 4}) == iota);
    CHECK(load(bytes_of(kFortran), int32, {2, 3, 4}) == iota);  // transposed into row-major
    CHECK(load(bytes_of(kBigI4), int32, {3}) == std::vector<double>{1, -2, 300000});
    CHECK(load(bytes_of(kBigF8), float64, {2, 2}) == std::vector<double>{1.5, -2.25, 3.0, 1e-300});
    CHECK(load(bytes_of(kV2), int64, {2}) == std::vector<double>{5, -6});
    CHECK(load(bytes_of(kV3), float16, {3}) == std::vector<double>{1, -2, 0.5});
    CHECK(load(bytes_of(kBF16), bfloat16, {3}) == std::vector<double>{1, 2.5, -3});
  });
}

TEST_CASE("npy: headers other writers produce") {
  const std::string one_f4("\x00\x00\x80\x3f", 4), two_f4 = one_f4 + std::string("\x00\x00\x00\xc0", 4);
  auto load = [](const std::string& bytes) { return values_of(io::load_npy(write_file("x.npy", bytes), Device::cpu())); };
  // Old numpy aligned to 16; numpy.load requires neither the final '\n' nor the trailing comma.
  const std::string dict = "{'descr': '<f4', 'fortran_order': False, 'shape': (1,)}";
  CHECK(load(npy(dict, one_f4, 1, 16)) == std::vector<double>{1});
  CHECK(load(std::string("\x93NUMPY\x01\x00", 8) + char(dict.size()) + '\0' + dict + one_f4) == std::vector<double>{1});
  CHECK(load(npy(dict, one_f4, 2, 16)) == std::vector<double>{1});
  CHECK(load(npy("{\"shape\": (2L,), \"fortran_order\": False, \"descr\": \"<f4\"}", two_f4)) ==
        std::vector<double>{1, -2});                                                       // Python 2, any key order
  CHECK(load(npy("{'descr': '=f4', 'fortran_order': False, 'shape': (2,), }", two_f4)) == std::vector<double>{1, -2});
  CHECK(load(npy("{'descr': 'f4', 'fortran_order': False, 'shape': (1,), }", one_f4)) == std::vector<double>{1});
  CHECK(load(npy("{'descr': '>f2', 'fortran_order': False, 'shape': (1,), }", std::string("\x3c\x00", 2))) == std::vector<double>{1});
  CHECK(load(npy("{'descr': '>V2', 'fortran_order': False, 'shape': (1,), }", "\x3f\x80")) == std::vector<double>{1});
  // Bytes after the data are ignored, as numpy.load ignores them; bool bytes other than 0/1 read as true.
  CHECK(load(npy("{'descr': '<f4', 'fortran_order': False, 'shape': (1,), }", one_f4 + "more")) == std::vector<double>{1});
  Tensor b = io::load_npy(write_file("b.npy", npy("{'descr': '|b1', 'fortran_order': False, 'shape': (3,), }",
                                                  std::string("\x00\x02\xff", 3))), Device::cpu());
  CHECK(b.to_vector<std::uint8_t>() == std::vector<std::uint8_t>{0, 1, 1});
  // Fortran order: [[1, 3], [2, 4]] is stored 1 2 3 4; also big-endian at once.
  CHECK(load(npy("{'descr': '|u1', 'fortran_order': True, 'shape': (2, 2), }", "\x01\x02\x03\x04")) ==
        std::vector<double>{1, 3, 2, 4});
  const std::string be = std::string("\0\0\0\x01\0\0\0\x02\0\0\0\x03\0\0\0\x04", 16);
  CHECK(load(npy("{'descr': '>i4', 'fortran_order': True, 'shape': (2, 2), }", be)) == std::vector<double>{1, 3, 2, 4});
}

TEST_CASE("npy: load_npy errors name the file and what is wrong") {
  const std::string missing = tmp().file("missing.npy");
  CHECK(error_of([&] { io::load_npy(missing); }) == "load_npy: '" + missing + "': cannot open: No such file or directory");
  CHECK(error_of([&] { io::load_npy(tmp().path.string()); }) ==
        "load_npy: '" + tmp().path.string() + "': not a regular file (a directory)");

  const std::string ok_dict = "{'descr': '<f4', 'fortran_order': False, 'shape': (1,), }";
  auto with_dict = [](const std::string& dict) { return load_error(npy(dict, std::string(64, '\0'))); };
  auto with_descr = [&](const std::string& descr) {
    return with_dict("{'descr': " + descr + ", 'fortran_order': False, 'shape': (1,), }");
  };
  auto with_shape = [&](const std::string& shape) {
    return with_dict("{'descr': '<f4', 'fortran_order': False, 'shape': " + shape + ", }");
  };
  CHECK(contains(load_error(""), "not an NPY file (bad magic: expected \\x93NUMPY, got '', 0 bytes in all)"));
  CHECK(contains(load_error("PK\x03\x04 a zip"), "not an NPY file (bad magic"));
  CHECK(contains(load_error("\x93NUMPY"), "header is truncated: the file ends after 6 bytes, inside the NPY prefix"));
  CHECK(contains(load_error(std::string("\x93NUMPY\x04\x00", 8)), "unsupported NPY format version 4.0 (this reader knows 1.0, 2.0 and 3.0)"));
  CHECK(contains(load_error(std::string("\x93NUMPY\x01\x01", 8)), "unsupported NPY format version 1.1"));
  CHECK(contains(load_error(std::string("\x93NUMPY\x02\x00\x10\x00", 10)), "header is truncated: the file ends after 10 bytes"));
  CHECK(contains(load_error(npy(ok_dict).substr(0, 40)), "header is truncated: it announces 118 bytes, the file holds 30"));
  CHECK(contains(with_dict("{'descr': '<f4', 'fortran_order': False, 'shape': (1,), "), "header is not terminated"));
  CHECK(contains(with_dict("{'descr': '<f4', 'fortran_order': False, 'shape': (1,"), "header is not terminated"));
  CHECK(contains(with_dict("['descr', '<f4']"), "malformed header (expected a '{' opening the header dict at byte 0)"));
  CHECK(contains(with_dict("{'descr' '<f4'}"), "malformed header (expected ':' after key 'descr' at byte 9)"));
  CHECK(contains(with_dict("{descr: '<f4'}"), "malformed header (expected a quoted key"));
  CHECK(contains(with_dict(ok_dict + " x"), "malformed header (text after the closing '}'"));
  CHECK(contains(with_dict("{'descr': '<f4' 'fortran_order': False}"), "expected ',' or '}' after the value of 'descr'"));
  CHECK(contains(with_dict("{'descr': '<f4', 'fortran_order': 0, 'shape': (1,)}"), "expected True or False for 'fortran_order'"));
  CHECK(contains(with_dict("{'descr': '<f4', 'fortran_order': False}"), "header lacks the key 'shape'"));
  CHECK(contains(with_dict("{'fortran_order': False, 'shape': (1,)}"), "header lacks the key 'descr'"));
  CHECK(contains(with_dict("{'descr': '<f4', 'shape': (1,)}"), "header lacks the key 'fortran_order'"));
  CHECK(contains(with_dict("{'descr': '<f4', 'fortran_order': False, 'shape': (1,), 'x': 1}"), "unexpected key 'x'"));
  CHECK(contains(with_shape("(3)"), "'shape' is a parenthesized int, not a tuple"));
  CHECK(contains(with_shape("[3]"), "expected a tuple '(' for 'shape'"));
  CHECK(contains(with_shape("(3, x)"), "expected an integer in 'shape'"));
  CHECK(contains(with_shape("(2, -3)"), "negative size -3 in shape"));
  CHECK(contains(with_shape("(99999999999999999999,)"), "shape entry 99999999999999999999 does not fit in int64"));
  CHECK(contains(with_shape("(4294967296, 4294967296)"), "shape (4294967296, 4294967296) has more than 2^63 elements"));
  CHECK(contains(with_shape("(3037000499, 3037000499)"), "shape (3037000499, 3037000499) of float32 needs more than 2^63 bytes"));
  CHECK(contains(with_shape("(1000000, 1000000)"),
                 "file is shorter than its data: shape (1000000, 1000000) of '<f4' needs 4000000000000 bytes after the "
                 "128-byte header, 64 are present"));
  CHECK(contains(with_shape("(17,)"), "needs 68 bytes after the 128-byte header, 64 are present"));
  const char* supported = "(supported: '<f4' float32, '<f8' float64, '<f2' float16, '<i4' int32, '<i8' int64, '|u1' "
                          "uint8, '|b1' bool, '<V2' bfloat16, in byte order '<', '>' or '=')";
  for (const char* descr : {"'<c8'", "'<U3'", "'|O'", "'<i2'", "'|V2'", "'<f16'", "'|S5'", "''"}) {
    CAPTURE(descr);
    const std::string msg = with_descr(descr);
    CHECK(contains(msg, std::string("unsupported dtype descr ") + descr));
    CHECK(contains(msg, supported));
  }
  CHECK(contains(with_descr("[('a', '<f4'), ('b', '<i4')]"),
                 "unsupported dtype descr [('a', '<f4'), ('b', '<i4')] (not a string: a list is a structured array) (supported:"));
}

TEST_CASE("npy: a FIFO is an error at once, not a hang") {
  const std::string fifo = tmp().file("fifo.npy");
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  auto result = std::async(std::launch::async, [&] { return error_of([&] { io::load_npy(fifo); }); });
  if (result.wait_for(std::chrono::seconds(10)) != std::future_status::ready) {
    FAIL_CHECK("load_npy blocked on a FIFO");
    const int fd = ::open(fifo.c_str(), O_WRONLY | O_NONBLOCK);  // releases a reader blocked in open()
    if (fd >= 0) ::close(fd);
  }
  CHECK(result.get() == "load_npy: '" + fifo + "': not a regular file (a FIFO)");
}

TEST_CASE("npy: save_npy replaces files atomically and names the system's reason when it cannot") {
  const std::string path = tmp().file("atomic.npy");
  io::save_npy(path, Tensor::ones({3}, float32, Device::cpu()));
  io::save_npy(path, Tensor::zeros({2, 2}, int64, Device::cpu()));
  CHECK(io::load_npy(path, Device::cpu()).shape() == Shape{2, 2});

  const std::string in_missing = tmp().file("no/such/folder/x.npy");
  const std::string msg = error_of([&] { io::save_npy(in_missing, Tensor::ones({3})); });
  CHECK(contains(msg, "save_npy: "));
  CHECK(contains(msg, in_missing));
  CHECK(contains(msg, "No such file or directory"));

  std::filesystem::create_directories(tmp().file("a_folder"));
  CHECK(contains(error_of([&] { io::save_npy(tmp().file("a_folder"), Tensor::ones({3})); }), "Is a directory"));
  CHECK(contains(error_of([&] { io::save_npy(tmp().file("undefined.npy"), Tensor()); }), "the tensor is undefined"));

  // No temporary file is left behind by the saves above, failed or not.
  for (const auto& entry : std::filesystem::directory_iterator(tmp().path))
    CHECK_MESSAGE(!contains(entry.path().filename().string(), ".tmp-"), entry.path());
}

TEST_CASE("npy: a header over 64 KiB is written as format 2.0") {
  const Shape shape(22000, 1);  // "1, " per axis: the header no longer fits a uint16 length
  const std::string path = tmp().file("v2.npy");
  io::save_npy(path, Tensor::full(shape, 3, int32, Device::cpu()));
  const std::string bytes = read_file(path);
  REQUIRE(bytes.size() > 12);
  CHECK(bytes[6] == 2);
  const std::size_t hlen = std::uint8_t(bytes[8]) | std::uint8_t(bytes[9]) << 8 | std::uint8_t(bytes[10]) << 16;
  CHECK((12 + hlen) % 64 == 0);
  CHECK(bytes.size() == 12 + hlen + 4);
  Tensor back = io::load_npy(path, Device::cpu());
  CHECK(back.shape() == shape);
  CHECK(back.item() == 3);
}
