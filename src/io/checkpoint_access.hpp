#pragma once
// The private Model state that checkpoints save and restore (a friend of Model).
#include <memory>
#include <vector>

#include "mpt/model.hpp"

namespace mpt::detail {

struct CheckpointAccess {
  static std::uint64_t& seed(Model& m) { return m.seed_; }
  static std::uint64_t seed(const Model& m) { return m.seed_; }
  static int& epoch(Model& m) { return m.epoch_; }
  /// BackupAndRestore: where the coming fit starts (epoch, batch), read by fit after on_train_begin.
  static void set_resume_point(Model& m, int epoch, std::int64_t step) { m.resume_epoch_ = epoch, m.resume_step_ = step; }
  static mixed_precision::Policy& policy(Model& m) { return m.policy_; }
  static const std::vector<metrics::MetricArg>& metric_args(const Model& m) { return m.metric_args_; }
  static const std::vector<metrics::MetricArg>& weighted_metric_args(const Model& m) { return m.weighted_metric_args_; }
  /// compile's per-output settings: each output's loss, loss weight, metrics and weighted metrics.
  static const std::vector<std::shared_ptr<losses::Loss>>& losses(const Model& m) { return m.losses_; }
  static const std::vector<double>& loss_weights(const Model& m) { return m.loss_weights_; }
  static const std::vector<std::vector<metrics::MetricArg>>& output_metric_args(const Model& m) {
    return m.output_metric_args_;
  }
  static const std::vector<std::vector<metrics::MetricArg>>& output_weighted_metric_args(const Model& m) {
    return m.output_weighted_metric_args_;
  }
  static const std::vector<KerasTensor>& inputs(const Model& m) { return m.inputs_; }
  static const std::vector<KerasTensor>& outputs(const Model& m) { return m.outputs_; }
  static const std::vector<std::shared_ptr<FunctionalNode>>& nodes(const Model& m) { return m.nodes_; }
};

}  // namespace mpt::detail
