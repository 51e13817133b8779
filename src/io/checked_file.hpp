#pragma once
// Crash-safe, verifiable checkpoint files. mpt writes every HDF5 checkpoint with a 512-byte
// HDF5 userblock (which HDF5, h5py and Keras skip) holding a magic string, the payload length
// and a CRC32 of everything after the userblock. Saving writes a temporary file in the target's
// folder, stamps and fsyncs it, renames it over the target and fsyncs the folder, so a crash
// or kill at any point leaves the previous file intact. Loading reads the whole file and checks
// the stamp before HDF5 ever parses a byte, so truncated or bit-flipped mpt files are
// rejected with mpt::Error.
#include <cstddef>
#include <functional>
#include <string>
#include <vector>

namespace mpt::io {

inline constexpr std::size_t kUserblockSize = 512;

/// Calls `write_hdf5(tmp_path)`, which must create an HDF5 file with a kUserblockSize
/// userblock at tmp_path; then stamps, fsyncs and renames it over `path`. `kind` names the
/// content in the userblock's text ("keras3-weights", "legacy-h5-weights", "mpt-checkpoint").
/// On failure the temporary file is removed, `path` is untouched, and mpt::Error is raised.
void save_atomically(const std::string& path, const std::string& kind,
                     const std::function<void(const std::string& tmp_path)>& write_hdf5);

/// The whole file at `path`, verified: when it carries mpt's stamp (even a damaged one), its
/// length and CRC must match; otherwise it must at least look like HDF5. mpt::Error names the
/// file and what is wrong (missing, empty, truncated, corrupt, not HDF5).
std::vector<char> read_verified(const std::string& path);

/// zlib's CRC32 of `n` bytes, for any length.
std::uint32_t crc32_of(const void* data, std::size_t n, std::uint32_t crc = 0);

}  // namespace mpt::io
