// The functional API: symbolic calls record FunctionalNodes (computing a one-example value to
// build layers and learn shapes); Model(inputs, outputs) orders them and replays them on data.
#include <algorithm>
#include <functional>
#include <map>
#include <set>

#include "mpt/autograd.hpp"
#include "mpt/model.hpp"
#include "mpt/ops.hpp"

namespace mpt {

Shape KerasTensor::shape() const {
  MPT_CHECK(defined(), "KerasTensor: undefined symbolic tensor");
  return Shape(example_.shape().begin() + 1, example_.shape().end());
}

KerasTensor Input(const Shape& shape, FunctionalInputOptions options) {
  for (auto d : shape) MPT_CHECK(d > 0, "Input: dimensions must be positive, got ", to_string(shape));
  auto node = std::make_shared<FunctionalNode>();
  node->input_shape = shape;
  node->input_name = options.name.empty() ? "input_layer" : options.name;
  Shape s = shape;
  s.insert(s.begin(), 1);
  return KerasTensor(node, Tensor::zeros(s, options.dtype));
}

namespace {
std::vector<std::pair<LayerRef, const FunctionalNode*>> keras_order(const std::vector<KerasTensor>& outputs);
}  // namespace

KerasTensor LayerRef::operator()(const KerasTensor& x) const { return (*this)(std::vector<KerasTensor>{x}); }

KerasTensor LayerRef::operator()(const std::vector<KerasTensor>& xs) const {
  MPT_CHECK(ptr_ != nullptr, "functional call on a null layer");
  MPT_CHECK(!xs.empty(), ptr_->class_name(), " '", ptr_->name(), "': called with no inputs");
  std::vector<Tensor> examples;
  for (const auto& x : xs) {
    MPT_CHECK(x.defined(), ptr_->class_name(), " '", ptr_->name(), "': undefined symbolic input");
    examples.push_back(x.example());
  }
  Tensor y;
  {
    NoGradGuard no_grad;
    y = examples.size() == 1 ? (*ptr_)(examples[0]) : (*ptr_)(examples);
  }
  auto node = std::make_shared<FunctionalNode>();
  node->layer = ptr_;
  node->inputs = xs;
  return KerasTensor(node, y.detach());
}

Model::Model(const KerasTensor& inputs, const KerasTensor& outputs, const std::string& name)
    : Model(std::vector<KerasTensor>{inputs}, std::vector<KerasTensor>{outputs}, name) {}

Model::Model(const std::vector<KerasTensor>& inputs, const std::vector<KerasTensor>& outputs, const std::string& name)
    : Model() {
  name_ = name;
  MPT_CHECK(!inputs.empty() && !outputs.empty(), "Model '", name, "': needs at least one input and one output");
  std::set<const FunctionalNode*> input_set;
  for (const auto& in : inputs) {
    MPT_CHECK(in.defined() && !in.node()->layer, "Model '", name, "': inputs must come from mpt::Input(...)");
    input_set.insert(in.node().get());
  }
  inputs_ = inputs, outputs_ = outputs;
  // Depth-first from the outputs; every path must end at one of the given inputs.
  std::set<const FunctionalNode*> done;
  std::function<void(const std::shared_ptr<FunctionalNode>&)> visit = [&](const std::shared_ptr<FunctionalNode>& n) {
    if (done.count(n.get())) return;
    if (!n->layer) {
      MPT_CHECK(input_set.count(n.get()), "Model '", name, "': output depends on an Input (shape ",
                to_string(n->input_shape), ") that is not among the model's inputs");
      done.insert(n.get());
      return;
    }
    for (const auto& in : n->inputs) visit(in.node());
    done.insert(n.get());
    nodes_.push_back(n);
  };
  for (const auto& out : outputs) {
    MPT_CHECK(out.defined(), "Model '", name, "': undefined output");
    visit(out.node());
  }
  keras_layers_ = keras_order(outputs);
  for (const auto& op : keras_layers_)
    if (op.first) layer_order_.push_back(op.first);
  assign_layer_names();
}

namespace {

/// The layers in the order of Keras's Functional.layers (keras/src/ops/function.py map_graph):
/// by depth from the outputs, deepest first, ties in first-visit order of a depth-first walk
/// from the outputs. Keras names a model's weights by class and position in this list
/// (layers/dense, layers/dense_1, ...), and lists its trainable variables, hence the optimizer's
/// slots, in it: mpt keeps the same order so that .keras and .weights.h5 files match either way.
/// Each entry is a layer, or (null layer) the Input node Keras has an InputLayer for.
std::vector<std::pair<LayerRef, const FunctionalNode*>> keras_order(const std::vector<KerasTensor>& outputs) {
  // An "operation" is a layer, or the InputLayer of one Input node.
  auto op_of = [](const FunctionalNode* n) -> const void* {
    return n->layer ? static_cast<const void*>(n->layer.get()) : n;
  };
  std::map<const void*, std::size_t> op_index;
  std::set<const FunctionalNode*> finished;
  std::vector<const FunctionalNode*> by_decreasing_depth;
  std::function<void(const FunctionalNode*)> walk = [&](const FunctionalNode* n) {
    if (finished.count(n)) return;
    op_index.emplace(op_of(n), op_index.size());
    for (const auto& in : n->inputs) walk(in.node().get());
    finished.insert(n);
    by_decreasing_depth.push_back(n);
  };
  for (const auto& out : outputs) walk(out.node().get());
  std::map<const FunctionalNode*, std::size_t> node_depth;
  std::map<const void*, std::size_t> op_depth;
  for (auto it = by_decreasing_depth.rbegin(); it != by_decreasing_depth.rend(); ++it) {
    const FunctionalNode* n = *it;
    std::size_t depth = std::max(node_depth[n], op_depth[op_of(n)]);
    op_depth[op_of(n)] = depth;
    node_depth[n] = depth;
    for (const auto& in : n->inputs) {
      std::size_t& d = node_depth[in.node().get()];
      d = std::max(d, depth + 1);
    }
  }
  std::map<const void*, std::pair<LayerRef, const FunctionalNode*>> entry_of;
  for (const FunctionalNode* n : by_decreasing_depth)
    entry_of.emplace(op_of(n), n->layer ? std::pair{LayerRef(n->layer), static_cast<const FunctionalNode*>(nullptr)}
                                        : std::pair{LayerRef(), n});
  std::vector<std::pair<const void*, std::pair<LayerRef, const FunctionalNode*>>> ops(entry_of.begin(), entry_of.end());
  std::sort(ops.begin(), ops.end(), [&](const auto& a, const auto& b) {
    const std::size_t da = op_depth.at(a.first), db = op_depth.at(b.first);
    return da != db ? da > db : op_index.at(a.first) < op_index.at(b.first);
  });
  std::vector<std::pair<LayerRef, const FunctionalNode*>> out;
  for (const auto& op : ops) out.push_back(op.second);
  return out;
}

}  // namespace

std::vector<LayerRef> Model::layers() const { return layer_order_; }

void Model::check_input(const Tensor& x) const {
  MPT_CHECK(x.defined(), "Model '", name_, "': undefined input");
  if (inputs_.size() != 1) return;
  const Shape& want = inputs_[0].node()->input_shape;
  Shape per(x.shape().begin() + (x.dim() > 0 ? 1 : 0), x.shape().end());
  MPT_CHECK(x.dim() > 0 && per == want, "Model '", name_, "': expected inputs of shape ", batch_shape_string(want),
            ", got ", to_string(x.shape()));
}

std::vector<Tensor> Model::call(const std::vector<Tensor>& xs, bool training) {
  MPT_CHECK(!nodes_.empty() || !inputs_.empty(), "Model '", name_, "': not a functional model; use call(x)");
  MPT_CHECK(xs.size() == inputs_.size(), "Model '", name_, "': expected ", inputs_.size(), " inputs, got ", xs.size());
  clear_activity_losses();
  std::map<const FunctionalNode*, Tensor> values;
  for (std::size_t i = 0; i < xs.size(); ++i) {
    const Shape& want = inputs_[i].node()->input_shape;
    Shape per(xs[i].shape().begin() + (xs[i].dim() > 0 ? 1 : 0), xs[i].shape().end());
    MPT_CHECK(xs[i].dim() > 0 && per == want, "Model '", name_, "': input ", i, " should have shape ",
              batch_shape_string(want), ", got ", to_string(xs[i].shape()));
    values[inputs_[i].node().get()] = xs[i];
  }
  for (const auto& n : nodes_) {
    std::vector<Tensor> args;
    for (const auto& in : n->inputs) args.push_back(values.at(in.node().get()));
    values[n.get()] = args.size() == 1 ? (*n->layer)(args[0], {.training = training})
                                       : (*n->layer)(args, {.training = training});
  }
  std::vector<Tensor> out;
  for (const auto& o : outputs_) out.push_back(values.at(o.node().get()));
  return out;
}

Tensor Model::call(const Tensor& x, bool training) {
  MPT_CHECK(outputs_.size() == 1 && inputs_.size() == 1, "Model '", name_, "': has ", inputs_.size(), " inputs and ",
            outputs_.size(), " outputs; call it with a vector of tensors");
  return call(std::vector<Tensor>{x}, training)[0];
}

void Model::build(const Shape&) {}  // a functional model is built when it is created

void Model::summary_functional(std::ostream& os) const {
  // Keras's functional summary: one row per layer call with its inbound layers.
  std::map<const FunctionalNode*, std::string> label;
  for (const auto& in : inputs_) label[in.node().get()] = in.node()->input_name;
  std::map<const Layer*, int> calls;
  for (const auto& n : nodes_) label[n.get()] = n->layer->name() + "[" + std::to_string(calls[n->layer.get()]++) + "][0]";
  os << "Model: \"" << name_ << "\"\n";
  char line[512];
  std::snprintf(line, sizeof line, "%-32s %-22s %12s  %-16s %s\n", "Layer (type)", "Output Shape", "Param #", "Policy",
                "Connected to");
  os << line << std::string(110, '=') << "\n";
  for (const auto& in : inputs_) {
    std::snprintf(line, sizeof line, "%-32s %-22s %12d  %-16s %s\n", (in.node()->input_name + " (InputLayer)").c_str(),
                  batch_shape_string(in.node()->input_shape).c_str(), 0, "-", "-");
    os << line;
  }
  std::set<const Layer*> counted;
  for (const auto& n : nodes_) {
    std::string connected;
    for (const auto& in : n->inputs) connected += (connected.empty() ? "" : ", ") + label[in.node().get()];
    Shape out = n->layer->output_shape();
    std::int64_t params = counted.insert(n->layer.get()).second ? n->layer->count_params() : 0;
    std::snprintf(line, sizeof line, "%-32s %-22s %12lld  %-16s %s\n",
                  (n->layer->name() + " (" + n->layer->class_name() + ")").c_str(),
                  out.empty() ? "?" : batch_shape_string(Shape(out.begin() + 1, out.end())).c_str(),
                  static_cast<long long>(params), n->layer->dtype_policy().name().c_str(), connected.c_str());
    os << line;
  }
  os << std::string(110, '=') << "\n";
}

}  // namespace mpt
