#pragma once
// The .keras format: a zip (entries stored, as Keras writes them) of config.json,
// metadata.json and model.weights.h5. Needs libzip (MPT_WITH_LIBZIP); without it these raise
// mpt::Error saying so.
#include <string>
#include <vector>

namespace mpt::io {

/// Whether `bytes` start like a zip archive.
bool is_zip(const std::vector<char>& bytes);
/// The entry `name` of an in-memory zip (its CRC checked); mpt::Error naming `display` on a
/// damaged archive or a missing entry.
std::vector<char> zip_entry(const std::vector<char>& zip, const std::string& name, const std::string& display);
/// An in-memory zip of (name, content) entries, stored uncompressed. Its archive comment
/// "mpt-crc32:<8 hex digits>" holds the CRC32 of every byte before it: zip headers have no
/// checksum of their own, so this is what lets a damaged header be told apart.
std::vector<char> make_zip(const std::vector<std::pair<std::string, std::vector<char>>>& entries,
                           const std::string& display);
/// Checks mpt's archive stamp when the archive carries one (even a damaged one); archives
/// written by others pass unchecked. mpt::Error naming `display` on a mismatch.
void verify_zip_stamp(const std::vector<char>& zip, const std::string& display);

}  // namespace mpt::io
