#pragma once
// RAII wrappers over the HDF5 C API for checkpoints. Every status is checked: a failed call
// raises mpt::Error with the operation, the object path and HDF5's own message. HDF5's
// automatic error printing is turned off once, on first use.
#include <hdf5.h>

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "mpt/tensor.hpp"

namespace mpt::io::h5 {

/// Holds the process's HDF5 lock for its lifetime: mpt's HDF5 work (every File, from before it
/// opens to after it closes, and a guarded parse with its fork) runs one thread at a time, so
/// no thread is inside libhdf5 when io::parse_guarded forks (a child forked then would inherit
/// libhdf5's lock taken and hang). Reentrant on one thread (a depth count); movable.
class ProcessScope {
 public:
  ProcessScope();
  ProcessScope(ProcessScope&& o) noexcept : held_(std::exchange(o.held_, false)) {}
  ProcessScope& operator=(ProcessScope&&) = delete;
  ProcessScope(const ProcessScope&) = delete;
  ~ProcessScope();

 private:
  bool held_ = false;
};

/// An owned hid_t, closed with the matching H5*close when it goes out of scope.
class Handle {
 public:
  using Closer = herr_t (*)(hid_t);
  Handle() = default;
  Handle(hid_t id, Closer closer) : id_(id), closer_(closer) {}
  Handle(Handle&& o) noexcept : id_(std::exchange(o.id_, H5I_INVALID_HID)), closer_(o.closer_) {}
  Handle& operator=(Handle&& o) noexcept;
  Handle(const Handle&) = delete;
  Handle& operator=(const Handle&) = delete;
  ~Handle() { reset(); }
  hid_t get() const { return id_; }
  bool valid() const { return id_ >= 0; }
  /// Closes now, raising mpt::Error when HDF5 reports a failure (a flush on close).
  void close(const std::string& what);

 private:
  void reset();
  hid_t id_ = H5I_INVALID_HID;
  Closer closer_ = nullptr;
};

/// Turns HDF5's automatic error printing off (once) before any call.
void init();
/// Raises mpt::Error "<what>: <HDF5 message>" when status < 0; returns status otherwise.
hid_t check(hid_t status, const std::string& what);

/// How a dataset's values are stored.
struct DatasetInfo {
  Shape shape;
  DType dtype = float32;  ///< float32/float64/float16/bfloat16/int32/int64 (others: mpt::Error)
};

/// A group (the file root included) at `path` within file `file_name` (for messages).
class Group {
 public:
  Group(Handle h, std::string file_name, std::string path)
      : h_(std::move(h)), file_(std::move(file_name)), path_(std::move(path)) {}
  const std::string& path() const { return path_; }
  const std::string& file_name() const { return file_; }
  hid_t id() const { return h_.get(); }

  /// Whether a hard link `name` exists here (soft and external links raise mpt::Error).
  bool has(const std::string& name) const;
  bool has_group(const std::string& name) const;
  bool has_dataset(const std::string& name) const;
  Group group(const std::string& name) const;
  Group create_group(const std::string& name) const;
  /// Names of the links in this group, in name order.
  std::vector<std::string> children() const;

  /// Writes `t` (on any device) as dataset `name`: float32/float64/int32/int64 natively,
  /// float16 as HDF5's IEEE half (as h5py does), bfloat16 as 2-byte opaque values with a
  /// "dtype" attribute "bfloat16" (as Keras does).
  void write(const std::string& name, const Tensor& t) const;
  DatasetInfo info(const std::string& name) const;
  /// Reads dataset `name` into a CPU tensor of its stored dtype.
  Tensor read(const std::string& name) const;

  void set_attr(const std::string& name, const std::string& value, bool utf8 = true) const;
  void set_attr(const std::string& name, const std::vector<std::string>& values, bool utf8 = true) const;
  /// An empty list attribute, as h5py writes [] (a float64 array of length 0).
  void set_empty_attr(const std::string& name) const;
  void set_attr_int(const std::string& name, std::int64_t value) const;
  bool has_attr(const std::string& name) const;
  /// A string attribute (fixed or variable length, scalar or one element); nullopt when absent.
  std::optional<std::string> attr_string(const std::string& name) const;
  /// A list of strings (fixed or variable length); empty for an empty list; nullopt when absent.
  std::optional<std::vector<std::string>> attr_strings(const std::string& name) const;
  std::optional<std::int64_t> attr_int(const std::string& name) const;

  /// "file 'x.weights.h5', /layers/dense/vars/0" for messages.
  std::string where(const std::string& name = "") const;

 protected:
  std::string child_path(const std::string& name) const;
  Handle h_;
  std::string file_, path_;
};

// ProcessScope first: taken before the file's handle exists, released after it is closed.
class File : private ProcessScope, public Group {
 public:
  /// Creates (truncates) `path` with a `userblock` bytes userblock (0 or a power of 2 >= 512).
  static File create(const std::string& path, std::size_t userblock, const std::string& display_name);
  /// Opens an in-memory image of a whole file read-only (the bytes that were verified).
  static File open_image(const std::vector<char>& bytes, const std::string& display_name);
  /// Flushes and closes, raising mpt::Error on failure.
  void close();

 private:
  File(Handle h, std::string name) : ProcessScope(), Group(std::move(h), std::move(name), "/") {}
};

}  // namespace mpt::io::h5
