// load_weights of Keras 3 .weights.h5 and legacy Keras 2 .h5 files (told apart by content).
#include "fuzz_util.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static auto* model = [] {
    mpt::set_random_seed(1);
    auto* m = new mpt::Sequential({mpt::layers::Input({8}), mpt::layers::Dense(16, {.activation = "relu"}),
                                   mpt::layers::Dense(4), mpt::layers::Activation("softmax")});
    m->compile({.optimizer = "adam", .loss = "sparse_categorical_crossentropy"});
    return m;
  }();
  const std::string path = mpt::fuzz::as_file(data, size, ".weights.h5");
  mpt::fuzz::expect_clean([&] { model->load_weights(path); });
  return 0;
}
