#pragma once
/// The built-in optimizers. Options are declared in Keras's argument order, then the clip
/// options shared by all.
///
///   mpt::optimizers::Adam adam({.learning_rate = 1e-3});
///   mpt::optimizers::SGD sgd({.learning_rate = 0.01, .momentum = 0.9, .nesterov = true});
#include "mpt/optimizers/optimizer.hpp"

namespace mpt::optimizers {

struct SGDOptions {
  LearningRate learning_rate = 0.01;
  double momentum = 0.0;
  bool nesterov = false;
  std::optional<double> clipnorm, clipvalue, global_clipnorm;
};
class SGD : public Optimizer {
 public:
  explicit SGD(SGDOptions o = {});
  std::shared_ptr<Optimizer> clone() const override;
  const SGDOptions& options() const { return o_; }

 protected:
  void update_step(const Tensor& grad, const Variable& var, double lr) override;

 private:
  SGDOptions o_;
};

struct AdamOptions {
  LearningRate learning_rate = 0.001;
  double beta_1 = 0.9;
  double beta_2 = 0.999;
  double epsilon = 1e-7;
  bool amsgrad = false;
  std::optional<double> clipnorm, clipvalue, global_clipnorm;
};
class Adam : public Optimizer {
 public:
  explicit Adam(AdamOptions o = {});
  std::shared_ptr<Optimizer> clone() const override;
  const AdamOptions& options() const { return o_; }

 protected:
  void update_step(const Tensor& grad, const Variable& var, double lr) override;

 private:
  AdamOptions o_;
};

struct AdamWOptions {
  LearningRate learning_rate = 0.001;
  double weight_decay = 0.004;
  double beta_1 = 0.9;
  double beta_2 = 0.999;
  double epsilon = 1e-7;
  bool amsgrad = false;
  std::optional<double> clipnorm, clipvalue, global_clipnorm;
};
class AdamW : public Optimizer {
 public:
  explicit AdamW(AdamWOptions o = {});
  std::shared_ptr<Optimizer> clone() const override;
  const AdamWOptions& options() const { return o_; }

 protected:
  void update_step(const Tensor& grad, const Variable& var, double lr) override;

 private:
  AdamWOptions o_;
};

struct RMSpropOptions {
  LearningRate learning_rate = 0.001;
  double rho = 0.9;
  double momentum = 0.0;
  double epsilon = 1e-7;
  bool centered = false;
  std::optional<double> clipnorm, clipvalue, global_clipnorm;
};
class RMSprop : public Optimizer {
 public:
  explicit RMSprop(RMSpropOptions o = {});
  std::shared_ptr<Optimizer> clone() const override;
  const RMSpropOptions& options() const { return o_; }

 protected:
  void update_step(const Tensor& grad, const Variable& var, double lr) override;

 private:
  RMSpropOptions o_;
};

}  // namespace mpt::optimizers
