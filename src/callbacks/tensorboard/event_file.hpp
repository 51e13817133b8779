#pragma once
// TensorBoard event files: TFRecord framing (CRC-32C checked), the Event protocol buffers of
// event.proto, and the histograms TensorFlow's summaries compute.
#include <cstddef>
#include <cstdint>
#include <fstream>
#include <string>
#include <vector>

namespace mpt::tensorboard {

/// CRC-32C (Castagnoli), as TFRecord uses; `crc` continues an earlier value.
std::uint32_t crc32c(const void* data, std::size_t n, std::uint32_t crc = 0);
/// TFRecord's masked CRC: ((crc >> 15) | (crc << 17)) + 0xa282ead8.
std::uint32_t masked_crc32c(const void* data, std::size_t n);

/// One TFRecord: uint64 length, masked CRC of the length, the bytes, masked CRC of the bytes.
std::string tfrecord(const std::string& data);
/// The records of a TFRecord file; mpt::Error names the file and the record whose framing or
/// CRC is wrong.
std::vector<std::string> read_tfrecords(const std::string& path);

/// A histogram of `values` in TensorFlow's layout (tf.summary.histogram): `buckets` buckets of
/// equal width from the smallest to the largest finite value; NaN and inf are left out.
struct Histogram {
  double min = 0, max = 0, num = 0, sum = 0, sum_squares = 0;
  std::vector<double> bucket_limit, bucket;
};
Histogram histogram(const std::vector<double>& values, int buckets = 30);

/// An events.out.tfevents.* file in `dir` (created), opened with its file_version event.
class EventFileWriter {
 public:
  /// `owner` names the component in error messages ("TensorBoard").
  EventFileWriter(const std::string& dir, const std::string& owner);
  void add_scalar(const std::string& tag, double value, std::int64_t step);
  void add_histogram(const std::string& tag, const Histogram& h, std::int64_t step);
  void flush();
  const std::string& path() const { return path_; }

 private:
  void write_event(const std::string& event_bytes);
  std::string path_, owner_;
  std::ofstream out_;
};

}  // namespace mpt::tensorboard
