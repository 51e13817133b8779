// Image resampling: kernels/image.hpp's body, a thread per output pixel.
#include <cstdint>

#include "backend/cuda/cuda_backend.hpp"
#include "backend/cuda/kernels/image.hpp"
#include "mpt/error.hpp"

namespace mpt::cuda {
namespace {
using namespace mpt::kernels;

constexpr unsigned kThreads = 256;

template <class T, class C>
__global__ void affine_transform_kernel(const T* images, const C* transform, T* out, ImageGeom g,
                                        common::Interpolation interpolation, common::FillMode mode, C fill) {
  affine_transform_body<T, C>(this_thread(), images, transform, out, g, interpolation, mode, fill);
}
}  // namespace

void CudaBackend::affine_transform(const Tensor& images, const Tensor& transform, const common::ImageTransform& how,
                                   Tensor& out) {
  const Shape& is = images.shape();
  const Shape& os = out.shape();
  const ImageGeom g{is[0], is[1], is[2], is[3], os[1], os[2]};
  const std::int64_t pixels = g.batch * g.oh * g.ow;
  if (pixels == 0 || g.channels == 0) return;
  DeviceGuard guard(out.device().index);
  dispatch_float(images.dtype(), "affine_transform", [&](auto tag) {
    using T = typename decltype(tag)::type;
    using C = compute_t<T>;
    affine_transform_kernel<T, C><<<blocks_for(pixels, kThreads), kThreads, 0, stream(guard.index())>>>(
        static_cast<const T*>(images.data_ptr()), transform.data<C>(), static_cast<T*>(out.data_ptr()), g,
        how.interpolation, how.fill_mode, static_cast<C>(how.fill_value));
  });
  check_launch("affine_transform");
}

}  // namespace mpt::cuda
