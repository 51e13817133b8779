// ops::embedding: rows of a table by integer ids (Keras's Embedding lookup, PyTorch's
// F.embedding), differentiable in the table through a deterministic float32 scatter-add.
#include "ops/ops_common.hpp"

namespace mpt::ops {
using namespace detail;

Tensor embedding(const Tensor& ids, const Tensor& table, std::optional<DType> dtype) {
  const char* name = "embedding";
  check_defined(name, ids, "ids");
  check_defined(name, table, "table");
  check_floating(name, table);
  MPT_CHECK(table.dim() >= 1, name, ": the table needs at least one dimension [rows, ...], got ", describe(table));
  MPT_CHECK(ids.device() == table.device(), name, ": ids on ", ids.device().str(), ", table on ",
            table.device().str());
  MPT_CHECK(ids.dtype() != bool_, name, ": ids must be integers (or integral floats, as Keras casts them), got ",
            describe(ids));
  const DType out_dtype = dtype.value_or(table.dtype());
  MPT_CHECK(is_floating(out_dtype), name, ": output dtype must be floating, got ", to_string(out_dtype));
  const std::int64_t rows = table.shape()[0];
  // Flat int64 ids (Keras casts floating ids to integers, truncating).
  Tensor flat = Tensor(ids.impl_ptr()).detach().reshape({ids.numel()});
  if (flat.dtype() != int64) flat = flat.to(int64);
  if (flat.numel() > 0) {
    // One host read of two scalars: out-of-range ids are an error, never a read outside the table.
    NoGradGuard no_grad;
    const auto range = ops::concat({ops::min(flat, {}, true), ops::max(flat, {}, true)}).to_vector<std::int64_t>();
    const std::int64_t lo = range[0], hi = range[1];
    MPT_CHECK(lo >= 0 && hi < rows, name, ": ids must be in [0, ", rows, ") for a table of ", rows,
              " rows, got ids from ", lo, " to ", hi, " (", describe(ids), ")");
  }
  Tensor rows_out = ops::gather_rows(table.detach(), flat);
  if (rows_out.dtype() != out_dtype) rows_out = ops::cast(rows_out, out_dtype);
  Shape out_shape = ids.shape();
  for (std::size_t d = 1; d < table.shape().size(); ++d) out_shape.push_back(table.shape()[d]);
  Tensor out = Tensor(rows_out.impl_ptr()).reshape(out_shape);
  autograd::record(name, {table}, {&out}, [flat, table_shape = table.shape(), table_dtype = table.dtype(),
                                           device = table.device()](const std::vector<Tensor>& g) {
    // Repeated ids add up in float32 (float64 for a float64 table), k ascending: deterministic.
    const DType acc = table_dtype == float64 ? float64 : float32;
    Tensor d = Tensor::zeros(table_shape, acc, device);
    Shape src_shape = table_shape;
    src_shape[0] = flat.numel();
    Tensor dy = g[0].reshape(src_shape);
    if (flat.numel() > 0) backend_of(d).scatter_add_rows(dy, flat, d);
    return std::vector<Tensor>{acc == table_dtype ? d : d.to(table_dtype)};
  });
  return out;
}

}  // namespace mpt::ops
