// Fuzz-style robustness of loading: hundreds of truncated, bit-flipped, overwritten and
// extended copies of mpt's files (deterministic seeds). Each one must raise mpt::Error naming
// the file, never crash or hang, and leave the model exactly as it was. Damaged architecture
// JSON inside otherwise valid files must fail just as cleanly.
#include <hdf5.h>

#include <map>
#include <random>

#include "io/checkpoint_util.hpp"

using namespace mpt;
using namespace mpt::test;
namespace layers = mpt::layers;

namespace {

constexpr int kCasesPerFile = 160;

/// One deterministic mutation of `bytes`; always differs from the original.
std::vector<char> mutate(const std::vector<char>& bytes, std::uint64_t seed, std::string& what) {
  std::mt19937_64 rng(seed);
  auto pick = [&](std::size_t n) { return static_cast<std::size_t>(rng() % std::max<std::size_t>(n, 1)); };
  std::vector<char> out = bytes;
  const std::size_t n = bytes.size();
  auto flip_bits = [&](std::size_t lo, std::size_t hi, int count) {
    for (int i = 0; i < count; ++i) {
      const std::size_t pos = lo + pick(hi - lo);
      out[pos] = static_cast<char>(out[pos] ^ (1 << pick(8)));
    }
    if (out == bytes) out[lo] = static_cast<char>(out[lo] ^ 1);  // flips that cancelled out
  };
  switch (rng() % 8) {
    case 0: {
      const std::size_t special[] = {0, 1, 8, 15, 16, 100, 511, 512, 513, 600, n / 2, n - 1};
      const std::size_t len = rng() % 3 == 0 ? special[pick(std::size(special))] : pick(n);
      out.resize(std::min(len, n - 1));
      what = "truncated to " + std::to_string(out.size());
      break;
    }
    case 1: {
      const int k = 1 + static_cast<int>(pick(8));
      flip_bits(0, n, k);
      what = std::to_string(k) + " bits flipped anywhere";
      break;
    }
    case 2:
      flip_bits(0, 512, 1 + static_cast<int>(pick(4)));
      what = "bits flipped in the userblock";
      break;
    case 3:
      flip_bits(512, std::min<std::size_t>(n, 512 + 2048), 1 + static_cast<int>(pick(4)));
      what = "bits flipped in the HDF5 superblock and headers";
      break;
    case 4: {
      const std::size_t at = pick(n), len = 1 + pick(64);
      for (std::size_t i = at; i < std::min(n, at + len); ++i) out[i] = static_cast<char>(rng());
      if (out == bytes) out[at] = static_cast<char>(out[at] ^ 0x40);
      what = "random bytes over [" + std::to_string(at) + ", +" + std::to_string(len) + ")";
      break;
    }
    case 5: {
      const std::size_t at = pick(n), len = 1 + pick(4096);
      bool changed = false;
      for (std::size_t i = at; i < std::min(n, at + len); ++i) changed |= out[i] != 0, out[i] = 0;
      if (!changed) out[at] = 1;
      what = "zeroed [" + std::to_string(at) + ", +" + std::to_string(len) + ")";
      break;
    }
    case 6: {
      const std::size_t len = 1 + pick(1024);
      for (std::size_t i = 0; i < len; ++i) out.push_back(static_cast<char>(rng()));
      what = "extended by " + std::to_string(len) + " bytes";
      break;
    }
    default: {
      out.resize(512 + pick(n - 512));
      flip_bits(0, out.size(), 1 + static_cast<int>(pick(3)));
      what = "truncated to " + std::to_string(out.size()) + " and bits flipped";
      break;
    }
  }
  return out;
}

bool same_bits(const std::vector<Tensor>& a, const std::vector<Tensor>& b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i)
    if (bits_of(a[i]) != bits_of(b[i])) return false;
  return true;
}

std::string attr_text(hid_t file, const char* name) {
  hid_t a = H5Aopen(file, name, H5P_DEFAULT);
  REQUIRE(a >= 0);
  hid_t t = H5Aget_type(a);
  char* p = nullptr;
  REQUIRE(H5Aread(a, t, &p) >= 0);
  std::string s = p;
  hid_t s_space = H5Screate(H5S_SCALAR);
  H5Dvlen_reclaim(t, s_space, H5P_DEFAULT, &p);
  H5Sclose(s_space), H5Tclose(t), H5Aclose(a);
  return s;
}

void set_attr_text(hid_t file, const char* name, const std::string& value) {
  if (H5Aexists(file, name) > 0) H5Adelete(file, name);
  hid_t t = H5Tcopy(H5T_C_S1);
  H5Tset_size(t, H5T_VARIABLE);
  hid_t s = H5Screate(H5S_SCALAR);
  hid_t a = H5Acreate2(file, name, t, s, H5P_DEFAULT, H5P_DEFAULT);
  const char* p = value.c_str();
  REQUIRE(H5Awrite(a, t, &p) >= 0);
  H5Aclose(a), H5Sclose(s), H5Tclose(t);
}

}  // namespace

TEST_CASE("truncated, bit-flipped and extended mpt files raise mpt::Error and leave the model untouched") {
  ScratchDir dir("fuzz");
  set_random_seed(31);
  PolicyScope policy("mixed_float16");  // the full checkpoint then carries loss-scale state too
  auto m = small_mlp();
  m->compile({.optimizer = optimizers::Adam(), .loss = "sparse_categorical_crossentropy"});
  auto [x, y] = quadrant_data(64, 2);
  m->fit(x, y, {.batch_size = 32, .epochs = 1, .verbose = 0});
  m->save_weights(dir / "k3.weights.h5");
  m->save_weights(dir / "legacy.h5");
  m->save_weights(dir / "half.weights.h5", {.dtype = bfloat16});
  m->save(dir / "full.h5");
  std::vector<std::string> files = {"k3.weights.h5", "legacy.h5", "half.weights.h5", "full.h5"};
  try {
    m->save(dir / "full.keras");
    files.push_back("full.keras");
  } catch (const Error& e) {
    MESSAGE(".keras not fuzzed: ", e.what());
  }

  set_random_seed(32);
  auto target = small_mlp();
  target->compile({.optimizer = optimizers::Adam(), .loss = "sparse_categorical_crossentropy"});
  const auto weights_before = target->get_weights();

  int cases = 0;
  std::map<std::string, int> kinds;
  for (const std::string& name : files) {
    const std::vector<char> original = read_bytes(dir / name);
    REQUIRE(original.size() > 1024);
    const bool full = name.rfind("full", 0) == 0;
    for (int i = 0; i < kCasesPerFile; ++i) {
      std::string what;
      const std::uint64_t seed = 0x5eedull * 1000 + static_cast<std::uint64_t>(i) * 7919 + name.size();
      const std::vector<char> bytes = mutate(original, seed, what);
      REQUIRE(bytes != original);
      const std::string path = dir / ("case-" + name);
      write_bytes(path, bytes);
      CAPTURE(name);
      CAPTURE(i);
      CAPTURE(what);
      std::string message;
      try {
        if (full) load_model(path);
        else target->load_weights(path);
      } catch (const Error& e) {
        message = e.what();
      }
      CHECK_MESSAGE(!message.empty(), "a damaged file loaded without an error");
      CHECK(message.find(path) != std::string::npos);
      ++kinds[what.substr(0, what.find(' '))];
      ++cases;
    }
    // The undamaged file still loads.
    if (full) CHECK(same_weights(*m, *load_model(dir / name)));
  }
  CHECK(same_bits(target->get_weights(), weights_before));
  CHECK(target->optimizer().iterations() == 0);
  MESSAGE(cases, " damaged files rejected");
  CHECK(cases == static_cast<int>(files.size()) * kCasesPerFile);
}

TEST_CASE("every truncation of a small weights file is rejected") {
  ScratchDir dir("trunc");
  set_random_seed(1);
  Sequential tiny({layers::Input({3}), layers::Dense(2)});
  tiny.save_weights(dir / "t.weights.h5");
  const auto original = read_bytes(dir / "t.weights.h5");
  const auto before = tiny.get_weights();
  int rejected = 0;
  for (std::size_t len = 0; len < original.size(); len += (len < 1100 ? 1 : 7)) {
    write_bytes(dir / "cut.weights.h5", std::vector<char>(original.begin(), original.begin() + static_cast<long>(len)));
    CAPTURE(len);
    CHECK_THROWS_AS(tiny.load_weights(dir / "cut.weights.h5"), Error);
    ++rejected;
  }
  CHECK(same_bits(tiny.get_weights(), before));
  MESSAGE(rejected, " truncations rejected");
}

TEST_CASE("damaged architecture JSON in an otherwise valid file fails cleanly") {
  ScratchDir dir("json");
  set_random_seed(5);
  auto m = all_core_layers_model();
  m->compile({.optimizer = optimizers::RMSprop({.momentum = 0.1}), .loss = "sparse_categorical_crossentropy"});
  auto [x, y] = quadrant_data(32, 2);
  m->fit(x, y, {.batch_size = 16, .epochs = 1, .verbose = 0});
  m->save(dir / "full.h5");
  // A plain HDF5 copy (no mpt userblock, so no CRC): what a foreign tool might hand us.
  H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
  hid_t src = H5Fopen((dir / "full.h5").c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  REQUIRE(src >= 0);
  const std::string config = attr_text(src, "model_config");
  const std::string compile = attr_text(src, "compile_config");
  const std::string state = attr_text(src, "mpt_state");
  const std::string base = dir / "base.h5";
  {
    hid_t dst = H5Fcreate(base.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
    REQUIRE(dst >= 0);
    for (const char* g : {"layers", "optimizer", "vars"}) REQUIRE(H5Ocopy(src, g, dst, g, H5P_DEFAULT, H5P_DEFAULT) >= 0);
    set_attr_text(dst, "mpt_format", "mpt-checkpoint");
    hid_t s = H5Screate(H5S_SCALAR);
    hid_t a = H5Acreate2(dst, "mpt_format_version", H5T_STD_I64LE, s, H5P_DEFAULT, H5P_DEFAULT);
    std::int64_t one = 1;
    H5Awrite(a, H5T_NATIVE_INT64, &one);
    H5Aclose(a), H5Sclose(s);
    H5Fclose(dst);
  }
  H5Fclose(src);
  const std::vector<char> base_bytes = read_bytes(base);

  int errors = 0, loaded = 0;
  std::mt19937_64 rng(2024);
  for (int i = 0; i < 240; ++i) {
    std::string c = config, k = compile, s = state;
    std::string* target = i % 3 == 0 ? &c : i % 3 == 1 ? &k : &s;
    switch (rng() % 5) {
      case 0: target->resize(rng() % target->size()); break;
      case 1:
        for (int j = 0; j < 3; ++j) (*target)[rng() % target->size()] = static_cast<char>(rng() % 128);
        break;
      case 2: (*target)[rng() % target->size()] = "{}[]\",:0-e"[rng() % 10]; break;
      case 3: *target = std::string(100000, '[') + std::string(100000, ']'); break;  // deep nesting
      default: target->insert(rng() % target->size(), "\"\\u12"); break;
    }
    const std::string path = dir / "case.h5";
    write_bytes(path, base_bytes);
    hid_t f = H5Fopen(path.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
    REQUIRE(f >= 0);
    set_attr_text(f, "model_config", c);
    set_attr_text(f, "compile_config", k);
    set_attr_text(f, "mpt_state", s);
    H5Fclose(f);
    CAPTURE(i);
    try {
      load_model(path);
      ++loaded;  // a harmless change (a digit of a seed, say) may still load
    } catch (const Error& e) {
      CHECK(std::string(e.what()).find("load_model") != std::string::npos);
      ++errors;
    }
  }
  MESSAGE(errors, " damaged configs rejected, ", loaded, " harmless ones loaded");
  CHECK(errors > 150);
}
