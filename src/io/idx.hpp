#pragma once
// The raw side of the IDX reader, shared by read_idx and the dataset loaders (which convert
// uint8 pixels straight to float32 without an intermediate tensor).
#include <cstdint>
#include <string>
#include <vector>

#include "mpt/tensor.hpp"

namespace mpt::io::detail {

struct IdxFile {
  std::uint8_t type = 0;              ///< IDX type code: 0x08 uint8 ... 0x0E float64
  Shape dims;
  std::vector<std::uint8_t> payload;  ///< the elements as stored: big-endian, exactly as declared
};

/// Reads and validates a whole IDX file (plain or gzip); mpt::Error naming the file otherwise.
IdxFile read_idx_file(const std::string& path);

/// "uint8", "int8", "int16", "int32", "float32", "float64" for a valid type code.
const char* idx_type_name(std::uint8_t type);

}  // namespace mpt::io::detail
