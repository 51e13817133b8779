#include "io/hdf5_file.hpp"

#include <atomic>
#include <cstring>
#include <mutex>

#include "mpt/error.hpp"

namespace mpt::io::h5 {

namespace {

herr_t collect_error(unsigned n, const H5E_error2_t* e, void* data) {
  auto* out = static_cast<std::string*>(data);
  if (n < 3 && e->desc && *e->desc) *out += std::string(out->empty() ? "" : "; ") + e->desc;
  return 0;
}

std::string hdf5_message() {
  std::string msg;
  H5Ewalk2(H5E_DEFAULT, H5E_WALK_DOWNWARD, collect_error, &msg);
  H5Eclear2(H5E_DEFAULT);
  return msg.empty() ? "HDF5 call failed" : msg;
}

Handle make_handle(hid_t id, Handle::Closer closer, const std::string& what) { return Handle(check(id, what), closer); }

Handle string_type(bool utf8) {
  Handle t = make_handle(H5Tcopy(H5T_C_S1), H5Tclose, "H5Tcopy");
  check(H5Tset_size(t.get(), H5T_VARIABLE), "H5Tset_size");
  check(H5Tset_cset(t.get(), utf8 ? H5T_CSET_UTF8 : H5T_CSET_ASCII), "H5Tset_cset");
  return t;
}

/// IEEE half precision as h5py defines it.
Handle half_type() {
  Handle t = make_handle(H5Tcopy(H5T_IEEE_F32LE), H5Tclose, "H5Tcopy");
  check(H5Tset_fields(t.get(), 15, 10, 5, 0, 10), "H5Tset_fields");
  check(H5Tset_size(t.get(), 2), "H5Tset_size");
  check(H5Tset_ebias(t.get(), 15), "H5Tset_ebias");
  return t;
}

Handle space_of(const Shape& shape) {
  if (shape.empty()) return make_handle(H5Screate(H5S_SCALAR), H5Sclose, "H5Screate");
  std::vector<hsize_t> dims(shape.begin(), shape.end());
  return make_handle(H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr), H5Sclose,
                     "H5Screate_simple");
}

/// Elements of a dataspace; mpt::Error for null spaces and absurd sizes.
Shape shape_of_space(hid_t space, const std::string& where) {
  const H5S_class_t cls = H5Sget_simple_extent_type(space);
  if (cls == H5S_SCALAR) return {};
  MPT_CHECK(cls == H5S_SIMPLE, where, ": unsupported dataspace (null or unknown)");
  const int rank = static_cast<int>(check(H5Sget_simple_extent_ndims(space), where + ": H5Sget_simple_extent_ndims"));
  MPT_CHECK(rank >= 0 && rank <= 32, where, ": unsupported rank ", rank);
  std::vector<hsize_t> dims(static_cast<std::size_t>(rank));
  check(H5Sget_simple_extent_dims(space, dims.data(), nullptr), where + ": H5Sget_simple_extent_dims");
  Shape s;
  std::uint64_t total = 1;
  for (hsize_t d : dims) {
    MPT_CHECK(d <= (std::uint64_t{1} << 40) && (d == 0 || total <= (std::uint64_t{1} << 40) / d), where,
              ": implausible dataset size");
    total *= d;
    s.push_back(static_cast<std::int64_t>(d));
  }
  return s;
}

std::uint64_t points_of_space(hid_t space, const std::string& where) {
  const hssize_t n = H5Sget_simple_extent_npoints(space);
  MPT_CHECK(n >= 0 && n < (hssize_t{1} << 40), where, ": bad dataspace");
  return static_cast<std::uint64_t>(n);
}

std::vector<std::string> read_string_attr(hid_t attr, const std::string& where) {
  Handle type = make_handle(H5Aget_type(attr), H5Tclose, where + ": H5Aget_type");
  Handle space = make_handle(H5Aget_space(attr), H5Sclose, where + ": H5Aget_space");
  const std::uint64_t n = points_of_space(space.get(), where);
  const H5T_class_t cls = H5Tget_class(type.get());
  if (n == 0) return {};
  MPT_CHECK(cls == H5T_STRING, where, ": expected a string attribute");
  MPT_CHECK(n <= (1u << 24), where, ": too many strings");
  std::vector<std::string> out;
  const htri_t vlen = check(H5Tis_variable_str(type.get()), where + ": H5Tis_variable_str");
  if (vlen > 0) {
    Handle mem = string_type(H5Tget_cset(type.get()) == H5T_CSET_UTF8);
    std::vector<char*> ptrs(n, nullptr);
    check(H5Aread(attr, mem.get(), ptrs.data()), where + ": H5Aread");
    for (char* p : ptrs) out.emplace_back(p ? p : "");
    H5Dvlen_reclaim(mem.get(), space.get(), H5P_DEFAULT, ptrs.data());
  } else {
    const std::size_t size = H5Tget_size(type.get());
    MPT_CHECK(size > 0 && size < (1u << 24) && n * size < (1u << 28), where, ": bad string size");
    Handle mem = make_handle(H5Tcopy(type.get()), H5Tclose, where + ": H5Tcopy");
    std::vector<char> buf(n * size + 1, '\0');
    check(H5Aread(attr, mem.get(), buf.data()), where + ": H5Aread");
    for (std::uint64_t i = 0; i < n; ++i) {
      std::string s(buf.data() + i * size, size);
      s = s.substr(0, s.find('\0'));
      while (!s.empty() && s.back() == ' ') s.pop_back();  // space-padded strings
      out.push_back(s);
    }
  }
  return out;
}

}  // namespace

Handle& Handle::operator=(Handle&& o) noexcept {
  if (this != &o) {
    reset();
    id_ = std::exchange(o.id_, H5I_INVALID_HID);
    closer_ = o.closer_;
  }
  return *this;
}

void Handle::reset() {
  if (id_ >= 0 && closer_) {
    if (closer_(id_) < 0) H5Eclear2(H5E_DEFAULT);  // destructors cannot throw; close() reports
  }
  id_ = H5I_INVALID_HID;
}

void Handle::close(const std::string& what) {
  if (id_ < 0) return;
  const hid_t id = std::exchange(id_, H5I_INVALID_HID);
  check(closer_(id), what);
}

namespace {
std::mutex g_process_lock;    // ProcessScope's
thread_local int t_depth = 0;  // ProcessScopes held by this thread
}  // namespace

void init() {
  static std::once_flag once;
  std::call_once(once, [] {
    H5open();
    H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
  });
}

hid_t check(hid_t status, const std::string& what) {
  if (status < 0) fail(what, ": ", hdf5_message());
  return status;
}

// ---- Group --------------------------------------------------------------------------------
std::string Group::child_path(const std::string& name) const { return path_ == "/" ? "/" + name : path_ + "/" + name; }

std::string Group::where(const std::string& name) const {
  return "file '" + file_ + "', " + (name.empty() ? path_ : child_path(name));
}

bool Group::has(const std::string& name) const {
  init();
  MPT_CHECK(!name.empty(), where(), ": empty object name");
  // Check component by component: H5Lexists needs every parent to exist.
  std::string prefix;
  std::size_t start = 0;
  while (start <= name.size()) {
    const std::size_t slash = name.find('/', start);
    const std::string part = name.substr(start, slash == std::string::npos ? std::string::npos : slash - start);
    MPT_CHECK(!part.empty() && part != "." && part != "..", where(name), ": bad object name");
    prefix += (prefix.empty() ? "" : "/") + part;
    const htri_t e = check(H5Lexists(h_.get(), prefix.c_str(), H5P_DEFAULT), where(prefix) + ": H5Lexists");
    if (e <= 0) return false;
    H5L_info_t li;
    check(H5Lget_info(h_.get(), prefix.c_str(), &li, H5P_DEFAULT), where(prefix) + ": H5Lget_info");
    MPT_CHECK(li.type == H5L_TYPE_HARD, where(prefix), ": soft and external links are not allowed");
    if (slash == std::string::npos) return true;
    Handle o = make_handle(H5Oopen(h_.get(), prefix.c_str(), H5P_DEFAULT), H5Oclose, where(prefix) + ": H5Oopen");
    if (H5Iget_type(o.get()) != H5I_GROUP) return false;
    start = slash + 1;
  }
  return false;
}

bool Group::has_group(const std::string& name) const {
  if (!has(name)) return false;
  Handle o = make_handle(H5Oopen(h_.get(), name.c_str(), H5P_DEFAULT), H5Oclose, where(name) + ": H5Oopen");
  return H5Iget_type(o.get()) == H5I_GROUP;
}

bool Group::has_dataset(const std::string& name) const {
  if (!has(name)) return false;
  Handle o = make_handle(H5Oopen(h_.get(), name.c_str(), H5P_DEFAULT), H5Oclose, where(name) + ": H5Oopen");
  return H5Iget_type(o.get()) == H5I_DATASET;
}

Group Group::group(const std::string& name) const {
  MPT_CHECK(has_group(name), where(name), ": group not found");
  return Group(make_handle(H5Gopen2(h_.get(), name.c_str(), H5P_DEFAULT), H5Gclose, where(name) + ": H5Gopen"), file_,
               child_path(name));
}

Group Group::create_group(const std::string& name) const {
  init();
  return Group(make_handle(H5Gcreate2(h_.get(), name.c_str(), H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT), H5Gclose,
                           where(name) + ": H5Gcreate"),
               file_, child_path(name));
}

std::vector<std::string> Group::children() const {
  init();
  std::vector<std::string> names;
  auto cb = [](hid_t, const char* name, const H5L_info_t*, void* data) -> herr_t {
    auto* v = static_cast<std::vector<std::string>*>(data);
    if (v->size() > (1u << 20)) return -1;
    v->emplace_back(name);
    return 0;
  };
  hsize_t idx = 0;
  check(H5Literate(h_.get(), H5_INDEX_NAME, H5_ITER_INC, &idx, cb, &names), where() + ": H5Literate");
  return names;
}

void Group::write(const std::string& name, const Tensor& t) const {
  init();
  const std::string w = where(name);
  Handle space = space_of(t.shape());
  const std::size_t n = static_cast<std::size_t>(t.numel());
  Handle ftype, mtype;
  std::vector<unsigned char> buf(std::max<std::size_t>(1, n * itemsize(t.dtype())));
  hid_t file_type = -1, mem_type = -1;
  switch (t.dtype()) {
    case DType::Float32: file_type = H5T_IEEE_F32LE, mem_type = H5T_NATIVE_FLOAT; break;
    case DType::Float64: file_type = H5T_IEEE_F64LE, mem_type = H5T_NATIVE_DOUBLE; break;
    case DType::Int32: file_type = H5T_STD_I32LE, mem_type = H5T_NATIVE_INT32; break;
    case DType::Int64: file_type = H5T_STD_I64LE, mem_type = H5T_NATIVE_INT64; break;
    case DType::Float16:
      ftype = half_type();
      file_type = mem_type = ftype.get();
      break;
    case DType::BFloat16:
      ftype = make_handle(H5Tcreate(H5T_OPAQUE, 2), H5Tclose, w + ": H5Tcreate");
      file_type = mem_type = ftype.get();
      break;
    default: fail(w, ": cannot store dtype ", to_string(t.dtype()));
  }
  if (n > 0) t.copy_to_host(buf.data(), t.dtype());
  Handle ds = make_handle(H5Dcreate2(h_.get(), name.c_str(), file_type, space.get(), H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT),
                          H5Dclose, w + ": H5Dcreate");
  check(H5Dwrite(ds.get(), mem_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, buf.data()), w + ": H5Dwrite");
  if (t.dtype() == DType::BFloat16) {
    Handle st = string_type(true);
    Handle as = make_handle(H5Screate(H5S_SCALAR), H5Sclose, w + ": H5Screate");
    Handle a = make_handle(H5Acreate2(ds.get(), "dtype", st.get(), as.get(), H5P_DEFAULT, H5P_DEFAULT), H5Aclose,
                           w + ": H5Acreate dtype");
    const char* v = "bfloat16";
    check(H5Awrite(a.get(), st.get(), &v), w + ": H5Awrite dtype");
  }
  ds.close(w + ": H5Dclose");
}

DatasetInfo Group::info(const std::string& name) const {
  const std::string w = where(name);
  MPT_CHECK(has_dataset(name), w, ": dataset not found");
  Handle ds = make_handle(H5Dopen2(h_.get(), name.c_str(), H5P_DEFAULT), H5Dclose, w + ": H5Dopen");
  Handle space = make_handle(H5Dget_space(ds.get()), H5Sclose, w + ": H5Dget_space");
  Handle type = make_handle(H5Dget_type(ds.get()), H5Tclose, w + ": H5Dget_type");
  DatasetInfo info;
  info.shape = shape_of_space(space.get(), w);
  const H5T_class_t cls = H5Tget_class(type.get());
  const std::size_t size = H5Tget_size(type.get());
  bool bf16_attr = false;
  if (H5Aexists(ds.get(), "dtype") > 0) {
    Handle a = make_handle(H5Aopen(ds.get(), "dtype", H5P_DEFAULT), H5Aclose, w + ": H5Aopen dtype");
    auto v = read_string_attr(a.get(), w + " attribute 'dtype'");
    bf16_attr = v.size() == 1 && v[0] == "bfloat16";
  }
  H5Eclear2(H5E_DEFAULT);
  if (bf16_attr && size == 2 && (cls == H5T_OPAQUE || cls == H5T_INTEGER)) info.dtype = bfloat16;
  else if (cls == H5T_FLOAT && size == 4) info.dtype = float32;
  else if (cls == H5T_FLOAT && size == 8) info.dtype = float64;
  else if (cls == H5T_FLOAT && size == 2) info.dtype = float16;
  else if (cls == H5T_INTEGER && size <= 4) info.dtype = int32;
  else if (cls == H5T_INTEGER && size == 8) info.dtype = int64;
  else fail(w, ": unsupported element type (HDF5 class ", static_cast<int>(cls), ", ", size, " bytes)");
  if (info.dtype == float16) {
    std::size_t spos, epos, esize, mpos, msize;
    check(H5Tget_fields(type.get(), &spos, &epos, &esize, &mpos, &msize), w + ": H5Tget_fields");
    MPT_CHECK(spos == 15 && epos == 10 && esize == 5 && mpos == 0 && msize == 10 && H5Tget_ebias(type.get()) == 15 &&
                  H5Tget_order(type.get()) == H5T_ORDER_LE,
              w, ": a 2-byte float that is not IEEE half precision");
  }
  return info;
}

Tensor Group::read(const std::string& name) const {
  const std::string w = where(name);
  const DatasetInfo info = this->info(name);
  Handle ds = make_handle(H5Dopen2(h_.get(), name.c_str(), H5P_DEFAULT), H5Dclose, w + ": H5Dopen");
  const std::size_t n = static_cast<std::size_t>(numel_of(info.shape));
  std::vector<unsigned char> buf(std::max<std::size_t>(1, n * itemsize(info.dtype)));
  Handle mtype;
  hid_t mem_type = -1;
  switch (info.dtype) {
    case DType::Float32: mem_type = H5T_NATIVE_FLOAT; break;
    case DType::Float64: mem_type = H5T_NATIVE_DOUBLE; break;
    case DType::Int32: mem_type = H5T_NATIVE_INT32; break;
    case DType::Int64: mem_type = H5T_NATIVE_INT64; break;
    case DType::Float16:
      mtype = half_type();
      mem_type = mtype.get();
      break;
    default:  // bfloat16: the raw 2-byte patterns, whatever the stored class
      mtype = make_handle(H5Dget_type(ds.get()), H5Tclose, w + ": H5Dget_type");
      mem_type = mtype.get();
      break;
  }
  if (n > 0) check(H5Dread(ds.get(), mem_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, buf.data()), w + ": H5Dread");
  return Tensor::from_host(buf.data(), n, info.dtype, info.shape, Device::cpu());
}

void Group::set_attr(const std::string& name, const std::string& value, bool utf8) const {
  init();
  const std::string w = where() + " attribute '" + name + "'";
  if (H5Aexists(h_.get(), name.c_str()) > 0) check(H5Adelete(h_.get(), name.c_str()), w + ": H5Adelete");
  Handle t = string_type(utf8);
  Handle s = make_handle(H5Screate(H5S_SCALAR), H5Sclose, w + ": H5Screate");
  Handle a = make_handle(H5Acreate2(h_.get(), name.c_str(), t.get(), s.get(), H5P_DEFAULT, H5P_DEFAULT), H5Aclose,
                         w + ": H5Acreate");
  const char* p = value.c_str();
  check(H5Awrite(a.get(), t.get(), &p), w + ": H5Awrite");
  a.close(w + ": H5Aclose");
}

void Group::set_attr(const std::string& name, const std::vector<std::string>& values, bool utf8) const {
  init();
  if (values.empty()) return set_empty_attr(name);
  const std::string w = where() + " attribute '" + name + "'";
  if (H5Aexists(h_.get(), name.c_str()) > 0) check(H5Adelete(h_.get(), name.c_str()), w + ": H5Adelete");
  Handle t = string_type(utf8);
  Handle s = space_of({static_cast<std::int64_t>(values.size())});
  Handle a = make_handle(H5Acreate2(h_.get(), name.c_str(), t.get(), s.get(), H5P_DEFAULT, H5P_DEFAULT), H5Aclose,
                         w + ": H5Acreate");
  std::vector<const char*> ptrs;
  for (const auto& v : values) ptrs.push_back(v.c_str());
  check(H5Awrite(a.get(), t.get(), ptrs.data()), w + ": H5Awrite");
  a.close(w + ": H5Aclose");
}

void Group::set_empty_attr(const std::string& name) const {
  init();
  const std::string w = where() + " attribute '" + name + "'";
  if (H5Aexists(h_.get(), name.c_str()) > 0) check(H5Adelete(h_.get(), name.c_str()), w + ": H5Adelete");
  Handle s = space_of({0});
  Handle a = make_handle(H5Acreate2(h_.get(), name.c_str(), H5T_IEEE_F64LE, s.get(), H5P_DEFAULT, H5P_DEFAULT),
                         H5Aclose, w + ": H5Acreate");
  a.close(w + ": H5Aclose");
}

void Group::set_attr_int(const std::string& name, std::int64_t value) const {
  init();
  const std::string w = where() + " attribute '" + name + "'";
  if (H5Aexists(h_.get(), name.c_str()) > 0) check(H5Adelete(h_.get(), name.c_str()), w + ": H5Adelete");
  Handle s = make_handle(H5Screate(H5S_SCALAR), H5Sclose, w + ": H5Screate");
  Handle a = make_handle(H5Acreate2(h_.get(), name.c_str(), H5T_STD_I64LE, s.get(), H5P_DEFAULT, H5P_DEFAULT),
                         H5Aclose, w + ": H5Acreate");
  check(H5Awrite(a.get(), H5T_NATIVE_INT64, &value), w + ": H5Awrite");
  a.close(w + ": H5Aclose");
}

bool Group::has_attr(const std::string& name) const {
  init();
  return check(H5Aexists(h_.get(), name.c_str()), where() + ": H5Aexists") > 0;
}

std::optional<std::vector<std::string>> Group::attr_strings(const std::string& name) const {
  if (!has_attr(name)) return std::nullopt;
  const std::string w = where() + " attribute '" + name + "'";
  Handle a = make_handle(H5Aopen(h_.get(), name.c_str(), H5P_DEFAULT), H5Aclose, w + ": H5Aopen");
  return read_string_attr(a.get(), w);
}

std::optional<std::string> Group::attr_string(const std::string& name) const {
  auto v = attr_strings(name);
  if (!v) return std::nullopt;
  MPT_CHECK(v->size() == 1, where(), " attribute '", name, "': expected one string, found ", v->size());
  return (*v)[0];
}

std::optional<std::int64_t> Group::attr_int(const std::string& name) const {
  if (!has_attr(name)) return std::nullopt;
  const std::string w = where() + " attribute '" + name + "'";
  Handle a = make_handle(H5Aopen(h_.get(), name.c_str(), H5P_DEFAULT), H5Aclose, w + ": H5Aopen");
  Handle type = make_handle(H5Aget_type(a.get()), H5Tclose, w + ": H5Aget_type");
  Handle space = make_handle(H5Aget_space(a.get()), H5Sclose, w + ": H5Aget_space");
  MPT_CHECK(H5Tget_class(type.get()) == H5T_INTEGER && points_of_space(space.get(), w) == 1, w,
            ": expected one integer");
  std::int64_t v = 0;
  check(H5Aread(a.get(), H5T_NATIVE_INT64, &v), w + ": H5Aread");
  return v;
}

// ---- ProcessScope ---------------------------------------------------------------------------
ProcessScope::ProcessScope() : held_(true) {
  if (t_depth++ == 0) g_process_lock.lock();
}

ProcessScope::~ProcessScope() {
  if (held_ && --t_depth == 0) g_process_lock.unlock();
}

// ---- File ---------------------------------------------------------------------------------
File File::create(const std::string& path, std::size_t userblock, const std::string& display_name) {
  const ProcessScope scope;  // before H5Fcreate; the File's own scope holds it after
  init();
  Handle fcpl = make_handle(H5Pcreate(H5P_FILE_CREATE), H5Pclose, "H5Pcreate");
  if (userblock > 0) check(H5Pset_userblock(fcpl.get(), userblock), "H5Pset_userblock");
  return File(make_handle(H5Fcreate(path.c_str(), H5F_ACC_TRUNC, fcpl.get(), H5P_DEFAULT), H5Fclose,
                          "cannot create '" + display_name + "'"),
              display_name);
}

File File::open_image(const std::vector<char>& bytes, const std::string& display_name) {
  const ProcessScope scope;
  init();
  static std::atomic<std::uint64_t> counter{0};
  Handle fapl = make_handle(H5Pcreate(H5P_FILE_ACCESS), H5Pclose, "H5Pcreate");
  check(H5Pset_fapl_core(fapl.get(), 1 << 16, 0), "H5Pset_fapl_core");
  check(H5Pset_file_image(fapl.get(), const_cast<char*>(bytes.data()), bytes.size()), "H5Pset_file_image");
  // A unique name: the core driver tells open files apart by name.
  const std::string name = display_name + "#mpt-image-" + std::to_string(counter++);
  return File(make_handle(H5Fopen(name.c_str(), H5F_ACC_RDONLY, fapl.get()), H5Fclose,
                          "file '" + display_name + "': not a readable HDF5 file"),
              display_name);
}

void File::close() { h_.close(where() + ": H5Fclose"); }

}  // namespace mpt::io::h5
