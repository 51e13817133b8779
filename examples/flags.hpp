// The examples' command-line flags, through CLI11: every flag is typed and checked, `--help`
// lists each with its default, and a bad value prints CLI11's message and exits with code 2.
//
//   CLI::App app{"Model C on Fashion-MNIST"};
//   int epochs = 3;
//   app.add_option("--epochs", epochs, "epochs to train")->check(examples::kPositive)->capture_default_str();
//   if (int rc = examples::parse(app, argc, argv); rc >= 0) return rc;
#pragma once

#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include <mpt/distributed.hpp>

namespace examples {

/// Keras's dtype policy names, as mpt::mixed_precision::Policy accepts them.
inline const std::vector<std::string> kPolicies{"float32",       "float64",       "float16", "bfloat16",
                                                "mixed_float16", "mixed_bfloat16"};

/// `--policy NAME`, checked against `names`.
inline CLI::Option* add_policy(CLI::App& app, std::string& policy, const std::vector<std::string>& names = kPolicies) {
  return app.add_option("--policy", policy, "global dtype policy")->check(CLI::IsMember(names))->capture_default_str();
}

/// A whole number > 0 (epochs, batch sizes, steps).
inline const CLI::Validator kPositive(
    [](std::string& s) -> std::string {
      long long v = 0;
      if (!CLI::detail::lexical_cast(s, v) || v <= 0) return "a whole number > 0 is expected, not '" + s + "'";
      return {};
    },
    "POSITIVE");

/// A fraction in [0, 1), as Keras's validation_split.
inline const CLI::Validator kFraction(
    [](std::string& s) -> std::string {
      double v = 0;
      if (!CLI::detail::lexical_cast(s, v) || !(v >= 0.0 && v < 1.0)) return "a fraction in [0, 1) is expected, not '" + s + "'";
      return {};
    },
    "FRACTION in [0, 1)");

/// Parses argv; returns -1 to go on, or the code to exit with (0 after --help, 2 after a bad flag).
inline int parse(CLI::App& app, int argc, char** argv) {
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  return -1;
}

/// `--distributed`: data parallelism over the processes mpirun started,
///   mpirun -np 2 ./fashion_mnist_cnn --distributed
inline CLI::Option* add_distributed(CLI::App& app, bool& on) {
  return app.add_flag("--distributed", on,
                      "data parallel over the ranks of an MPI job (mpirun -np N ...); --batch-size stays global");
}

/// With `on`: joins the MPI job and makes DataParallel the process-wide strategy, so every
/// compile/fit/evaluate/predict that follows shares the work; rank 0 alone prints and writes.
inline void start_distributed(bool on) {
  if (!on) return;
  mpt::distributed::initialize();
  mpt::distributed::set_strategy(mpt::distributed::DataParallel());
}

}  // namespace examples
