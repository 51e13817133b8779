#pragma once
/// NumPy `.npy` files: what numpy.save writes and numpy.load reads.
///
///   mpt::io::save_npy("x.npy", x);                      // then in Python: np.load("x.npy")
///   mpt::Tensor y = mpt::io::load_npy("labels.npy");    // np.save("labels.npy", labels)
///   mpt::Tensor z = mpt::io::load_npy("x.npy", mpt::Device::cpu());
///   mpt::Tensor t = mpt::io::load_npy("tokens.npy", {.mmap = true});   // np.load(..., mmap_mode='c')
///
/// dtypes: float32 '<f4', float64 '<f8', float16 '<f2', int32 '<i4', int64 '<i8', uint8 '|u1',
/// bool '|b1'. NumPy has no bfloat16: save_npy writes a bfloat16 tensor as float32 '<f4' (exact:
/// every bfloat16 value is a float32 value), so np.load reads it without ml_dtypes and load_npy
/// gives back float32 (`.to(mpt::bfloat16)` restores the same bits). load_npy also reads what
/// numpy.save writes for an ml_dtypes.bfloat16 array (descr '<V2', which plain NumPy itself only
/// reads as raw bytes) as bfloat16.
#include <string>

#include "mpt/device.hpp"
#include "mpt/tensor.hpp"

namespace mpt::io {

/// Reads an .npy file (format versions 1.0, 2.0 and 3.0) onto `device`. Any byte order ('<', '>',
/// '=') is accepted and converted; Fortran-order arrays come back in mpt's row-major layout; 0-d
/// and empty arrays keep their shape. Bytes after the data are ignored, as numpy.load does. A
/// missing file, a directory or FIFO, a bad magic, an unknown version, a malformed header, a
/// dtype outside the list above (complex, strings, objects, structured arrays) or a file shorter
/// than its data is an mpt::Error "load_npy: '<path>': ..."; the data size is checked against
/// the file's size before anything is allocated.
Tensor load_npy(const std::string& path, Device device = default_device());

struct NpyLoadOptions {
  /// NumPy's mmap_mode: the tensor (on the CPU) is the file's bytes, mapped, not read: pages are
  /// read as they are touched and may be dropped again, so an array larger than memory can be
  /// trained on with bounded resident memory. Copy-on-write (NumPy's mode 'c'): writing to the
  /// tensor changes this process's copy of the page, never the file. The array must be C-order,
  /// little-endian and its data aligned to its item size (np.save's files are); an mpt::Error
  /// says which of these a file is not.
  bool mmap = false;
};
/// load_npy with options: `load_npy("tokens.npy", {.mmap = true})`. Without mmap, as
/// load_npy(path, Device::cpu()).
Tensor load_npy(const std::string& path, NpyLoadOptions options);

/// Writes `t` (from any device) as numpy.save would: format 1.0 (2.0 for a header over 64 KiB),
/// C order, little-endian, the header padded so the data starts at a multiple of 64 bytes. The
/// file is written to a temporary file in the same folder and renamed over `path`, so a failed
/// save leaves any previous file intact; failures are an mpt::Error "save_npy: ..." with the
/// system's reason (No such file or directory, Permission denied, No space left on device).
void save_npy(const std::string& path, const Tensor& t);

}  // namespace mpt::io
