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

/// Like save_atomically, but returns the stamped HDF5 file's bytes instead of keeping the file
/// (a temporary file next to `path` is written and removed).
std::vector<char> stamped_image(const std::string& path, const std::string& kind,
                                const std::function<void(const std::string& tmp_path)>& write_hdf5);
/// Writes `bytes` to a temporary file next to `path`, fsyncs it and renames it over `path`.
void write_atomically(const std::string& path, const std::vector<char>& bytes);

/// The HDF5 bytes of the checkpoint at `path`, verified: when they carry mpt's stamp (even a
/// damaged one), length and CRC must match; otherwise they must at least look like HDF5. A
/// .keras zip is opened and its model.weights.h5 verified. mpt::Error names the file and what
/// is wrong (missing, empty, truncated, corrupt, not HDF5). For a .keras archive,
/// `keras_config` (when given) receives its config.json.
std::vector<char> read_verified(const std::string& path, std::string* keras_config = nullptr);
/// The same checks on bytes already in memory; `display` names them in messages.
void verify_image(const std::vector<char>& bytes, const std::string& display);

/// mpt::Error "<component>: '<path>' ..." unless path is an existing regular file: missing (with
/// the OS reason), a directory, or a FIFO, socket or device (which would block or never end a
/// read). Checked with stat, before any open.
void check_regular_file(const std::string& component, const std::string& path);
/// The same for a file about to be written: fine when missing; an error when it exists and is not
/// a regular file.
void check_writable_file(const std::string& component, const std::string& path);

/// Runs `parse` (which reads the HDF5 image `bytes`; what it changes in the child is lost) so that a
/// malformed file cannot hang or crash the program: an image with mpt's verified stamp is parsed
/// directly; any other (written by Keras, h5py, or damaged) is first parsed in a child process
/// with a time limit, because libhdf5 itself loops forever or crashes on some malformed files.
/// A child that times out or dies is an mpt::Error naming the file; then `parse` runs here.
void parse_guarded(const std::vector<char>& bytes, const std::string& path, const std::function<void()>& parse);

/// zlib's CRC32 of `n` bytes, for any length.
std::uint32_t crc32_of(const void* data, std::size_t n, std::uint32_t crc = 0);

}  // namespace mpt::io
