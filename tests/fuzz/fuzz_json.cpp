// The JSON configs of checkpoints: the parser, then the model a config describes.
#include <string_view>

#include "fuzz_util.hpp"
#include "io/model_config.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  mpt::fuzz::expect_clean([&] {
    const mpt::io::Json v = mpt::io::parse_json(text, "fuzz");
    (void)mpt::io::dump_json(v, "fuzz");
    mpt::io::model_from_config(v, "fuzz");
  });
  return 0;
}
