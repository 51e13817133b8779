// The tape: recording (record) and reverse traversal (GradientTape::gradient).
#include <algorithm>
#include <map>
#include <unordered_map>
#include <unordered_set>

#include "mpt/autograd.hpp"
#include "mpt/ops.hpp"
#include "backend/backend.hpp"

namespace mpt {
namespace {
thread_local int t_active_tapes = 0;
thread_local bool t_no_grad = false;
}  // namespace

namespace autograd {

bool is_recording() { return t_active_tapes > 0 && !t_no_grad; }

bool any_requires_grad(std::initializer_list<const Tensor*> inputs) {
  for (const Tensor* t : inputs)
    if (t->defined() && t->requires_grad()) return true;
  return false;
}

void record(const char* name, const std::vector<Tensor>& inputs, std::vector<Tensor*> outputs,
            BackwardFn backward) {
  if (!is_recording()) return;
  bool needed = false;
  for (const Tensor& t : inputs) needed = needed || (t.defined() && t.requires_grad());
  if (!needed) return;
  auto node = std::make_shared<Node>();
  node->name = name;
  for (const Tensor& t : inputs) {
    Edge e;
    if (t.defined()) {
      TensorImpl* impl = t.impl();
      if (impl->grad_fn) e.fn = impl->grad_fn, e.output_nr = impl->output_nr;
      else if (impl->requires_grad) e.leaf_id = impl->id;
      node->input_meta.push_back({t.shape(), t.dtype(), t.device()});
    } else {
      node->input_meta.push_back({});
    }
    node->inputs.push_back(std::move(e));
  }
  node->backward = std::move(backward);
  for (std::uint32_t i = 0; i < outputs.size(); ++i) {
    Tensor& out = *outputs[i];
    node->output_meta.push_back({out.shape(), out.dtype(), out.device()});
    out.impl()->grad_fn = node;
    out.impl()->output_nr = i;
  }
}

}  // namespace autograd

NoGradGuard::NoGradGuard() : previous_(t_no_grad) { t_no_grad = true; }
NoGradGuard::~NoGradGuard() { t_no_grad = previous_; }

GradientTape::GradientTape(GradientTapeOptions options) : options_(options) { ++t_active_tapes; }
GradientTape::~GradientTape() { --t_active_tapes; }

void GradientTape::watch(Tensor& t) {
  MPT_CHECK(t.defined(), "GradientTape::watch: undefined tensor");
  MPT_CHECK(is_floating(t.dtype()), "GradientTape::watch: only floating tensors have gradients, got ",
            to_string(t.dtype()));
  if (!t.impl()->grad_fn) t.set_requires_grad(true);
}

namespace {
using autograd::Node;
using NodeKey = std::pair<const Node*, std::uint32_t>;

/// slot += g. A slot that no other tensor shares (neither its handle nor its memory: not a view,
/// not handed to another slot, to the caller or to a node) takes the sum in place: a pass over
/// memory less than a fresh sum (a transformer block adds four activation-sized gradients a
/// step, where one tensor feeds several ops).
void accumulate(Tensor& slot, const Tensor& g) {
  if (!slot.defined()) {
    slot = g;
    return;
  }
  const TensorImpl* s = slot.impl();
  if (slot.impl_ptr().use_count() == 1 && s->storage.use_count() == 1 && s->storage != g.impl()->storage &&
      slot.shape() == g.shape() && slot.dtype() == g.dtype() && slot.device() == g.device() &&
      is_floating(slot.dtype())) {
    detail::backend(slot.device()).binary(BinaryOp::Add, slot, g, slot);
    return;
  }
  slot = ops::add(slot, g);
}
}  // namespace

std::vector<Tensor> GradientTape::gradient(const Tensor& target, const std::vector<Tensor>& sources,
                                          const GradientReady& on_ready) {
  MPT_CHECK(target.defined(), "GradientTape::gradient: undefined target");
  MPT_CHECK(!used_ || options_.persistent,
            "GradientTape::gradient: a non-persistent tape can compute gradients only once; "
            "use GradientTape({.persistent = true})");
  used_ = true;
  NoGradGuard no_grad;

  // Where each source's gradient will be found.
  std::map<NodeKey, std::vector<std::size_t>> source_at_node;
  std::unordered_map<std::uint64_t, std::vector<std::size_t>> source_at_leaf;
  std::vector<Tensor> result(sources.size());
  for (std::size_t i = 0; i < sources.size(); ++i) {
    const Tensor& s = sources[i];
    MPT_CHECK(s.defined(), "GradientTape::gradient: source ", i, " is undefined");
    if (s.impl() == target.impl()) {
      result[i] = Tensor::ones(s.shape(), s.dtype(), s.device());
      if (on_ready) on_ready(i, result[i]);
      continue;
    }
    if (s.impl()->grad_fn) source_at_node[{s.impl()->grad_fn.get(), s.impl()->output_nr}].push_back(i);
    else source_at_leaf[s.impl()->id].push_back(i);
  }
  const auto& root = target.impl()->grad_fn;
  if (!root) return result;

  // Topological order of the nodes reachable from the target, and which of them lead to a
  // source (only those run their backward).
  std::vector<Node*> order;
  std::unordered_map<Node*, int> state;  // 1 = visiting, 2 = done
  std::unordered_set<Node*> useful;
  std::vector<std::pair<Node*, std::size_t>> stack{{root.get(), 0}};
  state[root.get()] = 1;
  while (!stack.empty()) {
    auto& [node, next] = stack.back();
    if (next < node->inputs.size()) {
      const auto& e = node->inputs[next++];
      if (e.fn && !state.count(e.fn.get())) {
        state[e.fn.get()] = 1;
        stack.push_back({e.fn.get(), 0});
      }
      continue;
    }
    bool leads = false;
    for (std::uint32_t o = 0; o < node->output_meta.size() && !leads; ++o)
      leads = source_at_node.count({node, o}) > 0;
    for (const auto& e : node->inputs)
      leads = leads || (e.fn && useful.count(e.fn.get())) || (e.leaf_id && source_at_leaf.count(e.leaf_id));
    if (leads) useful.insert(node);
    state[node] = 2;
    order.push_back(node);
    stack.pop_back();
  }
  std::reverse(order.begin(), order.end());  // target first

  // For on_ready: how many edges from nodes that will run still lead into each source leaf; a
  // leaf's gradient is final when the last of them has run.
  std::unordered_map<std::uint64_t, int> leaf_edges_left;
  if (on_ready)
    for (Node* node : order)
      if (useful.count(node))
        for (const auto& e : node->inputs)
          if (!e.fn && e.leaf_id && source_at_leaf.count(e.leaf_id)) ++leaf_edges_left[e.leaf_id];

  std::map<NodeKey, Tensor> grads;
  grads[{root.get(), target.impl()->output_nr}] =
      Tensor::ones(target.shape(), target.dtype(), target.device());
  std::unordered_map<std::uint64_t, Tensor> leaf_grads;

  // After `node` ran (or had no gradient to pass on): the source leaves it was the last to feed.
  auto settle = [&](const Node* node) {
    if (!on_ready) return;
    for (const auto& e : node->inputs)
      if (!e.fn && e.leaf_id && source_at_leaf.count(e.leaf_id) && --leaf_edges_left[e.leaf_id] == 0 &&
          leaf_grads.count(e.leaf_id))
        for (auto i : source_at_leaf[e.leaf_id]) on_ready(i, leaf_grads[e.leaf_id]);
  };
  for (Node* node : order) {
    if (!useful.count(node)) continue;
    std::vector<Tensor> gout(node->output_meta.size());
    bool any = false;
    for (std::uint32_t o = 0; o < gout.size(); ++o) {
      auto it = grads.find({node, o});
      if (it != grads.end()) {
        gout[o] = it->second;
        any = true;
        grads.erase(it);
        if (auto s = source_at_node.find({node, o}); s != source_at_node.end())
          for (auto i : s->second) {
            result[i] = gout[o];
            if (on_ready) on_ready(i, result[i]);
          }
      }
    }
    if (!any) {
      settle(node);
      continue;
    }
    for (std::uint32_t o = 0; o < gout.size(); ++o)
      if (!gout[o].defined()) {
        const auto& m = node->output_meta[o];
        gout[o] = Tensor::zeros(m.shape, m.dtype, m.device);
      }
    MPT_CHECK(node->backward != nullptr, "GradientTape::gradient: the graph through '", node->name,
              "' was already freed by an earlier gradient() call");
    std::vector<Tensor> gin = node->backward(gout);
    // Frees what the op saved, unless an enclosing tape, which recorded the same node, may
    // still need it.
    if (!options_.persistent && t_active_tapes == 1) node->backward = nullptr;
    for (std::size_t i = 0; i < node->inputs.size() && i < gin.size(); ++i) {
      const auto& e = node->inputs[i];
      if (!gin[i].defined() || !e.needed()) continue;
      const auto& meta = node->input_meta[i];
      const bool source_leaf = !e.fn && source_at_leaf.count(e.leaf_id) > 0;
      const bool keep = source_leaf && options_.keep_source_gradient_dtype && is_floating(gin[i].dtype()) &&
                        !leaf_grads.count(e.leaf_id);
      Tensor g = gin[i].dtype() == meta.dtype || keep ? gin[i] : gin[i].to(meta.dtype);
      MPT_CHECK(g.shape() == meta.shape, "autograd: backward of '", node->name, "' gave shape ",
                to_string(g.shape()), " for input ", i, " of shape ", to_string(meta.shape));
      if (e.fn) {
        if (useful.count(e.fn.get())) accumulate(grads[{e.fn.get(), e.output_nr}], g);
      } else if (source_leaf) {
        Tensor& slot = leaf_grads[e.leaf_id];
        if (slot.defined() && slot.dtype() != meta.dtype) slot = slot.to(meta.dtype);  // a kept first one
        accumulate(slot, g);
      }
    }
    settle(node);
  }
  for (auto& [id, g] : leaf_grads)
    for (auto i : source_at_leaf[id]) result[i] = g;
  return result;
}

}  // namespace mpt
