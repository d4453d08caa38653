#include "quiver/safetensors.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <limits>
#include <set>
#include <vector>

#include <nlohmann/json.hpp>

namespace quiver {

// Tensor bytes go to and from disk as they lie in memory; the format is little-endian.
static_assert(std::endian::native == std::endian::little,
              "safetensors I/O assumes a little-endian host");

namespace {

using json = nlohmann::json;

// A header larger than this is corruption, not a real checkpoint (real headers are KBs).
constexpr uint64_t kMaxHeaderBytes = 100ull << 20;
// At most this many names are listed in a "missing tensor" message.
constexpr size_t kMaxListedNames = 32;

template <typename... Args>
[[noreturn]] void bad_file(const std::string& path, fmt::format_string<Args...> format,
                           Args&&... args) {
  fail("safetensors file '{}': {}", path, fmt::format(format, std::forward<Args>(args)...));
}

// Owns a file descriptor for the reader.
class Fd {
 public:
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd() {
    if (fd_ >= 0) ::close(fd_);
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  int get() const { return fd_; }

 private:
  int fd_;
};

// Reads exactly `size` bytes at `offset`; a short read means the file shrank under us.
void read_exact(int fd, const std::string& path, void* dst, uint64_t size, uint64_t offset,
                const char* what) {
  char* out = static_cast<char*>(dst);
  while (size > 0) {
    size_t chunk = static_cast<size_t>(std::min<uint64_t>(size, 1ull << 30));
    ssize_t got = ::pread(fd, out, chunk, static_cast<off_t>(offset));
    if (got < 0) {
      if (errno == EINTR) continue;
      bad_file(path, "reading {} failed: {}", what, std::strerror(errno));
    }
    if (got == 0) bad_file(path, "unexpected end of file while reading {} (file truncated?)", what);
    out += got;
    size -= static_cast<uint64_t>(got);
    offset += static_cast<uint64_t>(got);
  }
}

// safetensors dtypes quiver does not read, so that they get a clearer message than typos.
bool is_other_safetensors_dtype(const std::string& name) {
  static const std::set<std::string> names = {"BOOL", "U8",  "I8",  "I16", "U16",
                                              "F16",  "I32", "U32", "I64", "U64",
                                              "F8_E5M2", "F8_E4M3", "F8_E8M0", "F4", "F6_E2M3",
                                              "F6_E3M2", "C64"};
  return names.count(name) != 0;
}

struct Entry {
  std::string name;
  DType dtype = DType::F32;
  Shape shape;
  uint64_t begin = 0, end = 0;
};

// A JSON value that must be a non-negative integer fitting in int64.
int64_t non_negative_integer(const json& v, const std::string& path, const std::string& tensor,
                             const char* field) {
  if (v.is_number_unsigned()) {
    uint64_t u = v.get<uint64_t>();
    if (u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
      bad_file(path, "tensor '{}': {} entry {} is too large", tensor, field, u);
    return static_cast<int64_t>(u);
  }
  if (v.is_number_integer())
    bad_file(path, "tensor '{}': {} entry {} is negative", tensor, field, v.get<int64_t>());
  bad_file(path, "tensor '{}': {} entry {} is not an integer", tensor, field, v.dump());
}

Entry parse_entry(const std::string& name, const json& info, const std::string& path) {
  if (!info.is_object())
    bad_file(path, "tensor '{}': entry must be an object with dtype, shape and data_offsets, got {}",
             name, info.type_name());
  for (const char* key : {"dtype", "shape", "data_offsets"})
    if (!info.contains(key)) bad_file(path, "tensor '{}': entry is missing '{}'", name, key);

  Entry e;
  e.name = name;
  const json& dtype = info["dtype"];
  if (!dtype.is_string()) bad_file(path, "tensor '{}': dtype must be a string, got {}", name, dtype.dump());
  const std::string dtype_str = dtype.get<std::string>();
  if (dtype_str == "F32") {
    e.dtype = DType::F32;
  } else if (dtype_str == "F64") {
    e.dtype = DType::F64;
  } else if (dtype_str == "BF16") {
    e.dtype = DType::BF16;
  } else if (is_other_safetensors_dtype(dtype_str)) {
    bad_file(path, "tensor '{}': unsupported dtype '{}' (quiver reads F32, F64 and BF16)", name,
             dtype_str);
  } else {
    bad_file(path, "tensor '{}': unknown dtype '{}' (quiver reads F32, F64 and BF16)", name,
             dtype_str);
  }

  const json& shape = info["shape"];
  if (!shape.is_array()) bad_file(path, "tensor '{}': shape must be an array, got {}", name, shape.dump());
  uint64_t numel = 1;
  for (const json& d : shape) {
    int64_t size = non_negative_integer(d, path, name, "shape");
    e.shape.push_back(size);
    if (__builtin_mul_overflow(numel, static_cast<uint64_t>(size), &numel))
      bad_file(path, "tensor '{}': shape {} has too many elements", name, shape.dump());
  }
  uint64_t nbytes = 0;
  if (__builtin_mul_overflow(numel, static_cast<uint64_t>(dtype_size(e.dtype)), &nbytes))
    bad_file(path, "tensor '{}': shape {} has too many bytes", name, shape.dump());

  const json& offsets = info["data_offsets"];
  if (!offsets.is_array() || offsets.size() != 2)
    bad_file(path, "tensor '{}': data_offsets must be [begin, end], got {}", name, offsets.dump());
  e.begin = static_cast<uint64_t>(non_negative_integer(offsets[0], path, name, "data_offsets"));
  e.end = static_cast<uint64_t>(non_negative_integer(offsets[1], path, name, "data_offsets"));
  if (e.begin > e.end)
    bad_file(path, "tensor '{}': data_offsets [{}, {}] end before they begin", name, e.begin, e.end);
  if (e.end - e.begin != nbytes)
    bad_file(path,
             "tensor '{}': data_offsets [{}, {}] span {} bytes, but shape {} of {} needs {} bytes "
             "(wrong size)",
             name, e.begin, e.end, e.end - e.begin, shape_str(e.shape), dtype_str, nbytes);
  return e;
}

std::map<std::string, std::string> parse_metadata(const json& meta, const std::string& path) {
  if (!meta.is_object())
    bad_file(path, "__metadata__ must be an object mapping strings to strings, got {}",
             meta.type_name());
  std::map<std::string, std::string> out;
  for (const auto& [key, value] : meta.items()) {
    if (!value.is_string())
      bad_file(path, "__metadata__ value for '{}' must be a string, got {}", key, value.dump());
    out[key] = value.get<std::string>();
  }
  return out;
}

// Writes the whole buffer or reports why not.
void write_all(std::FILE* f, const void* data, size_t size, const std::string& tmp) {
  if (size == 0) return;
  if (std::fwrite(data, 1, size, f) != size)
    fail("writing temporary file '{}' failed: {}", tmp, std::strerror(errno));
}

// Removes the temporary file unless the write committed (rename succeeded).
class TempFile {
 public:
  TempFile(std::string path, std::FILE* f) : path_(std::move(path)), f_(f) {}
  ~TempFile() {
    if (f_) std::fclose(f_);
    if (!committed_) ::unlink(path_.c_str());
  }
  TempFile(const TempFile&) = delete;
  TempFile& operator=(const TempFile&) = delete;
  std::FILE* file() const { return f_; }
  // Closes and reports the error a delayed write may only show at close.
  void close() {
    std::FILE* f = f_;
    f_ = nullptr;
    if (std::fclose(f) != 0) fail("closing temporary file '{}' failed: {}", path_, std::strerror(errno));
  }
  void commit() { committed_ = true; }

 private:
  std::string path_;
  std::FILE* f_;
  bool committed_ = false;
};

// Makes the rename durable; best effort, since some file systems refuse to fsync a directory.
void sync_parent_directory(const std::string& path) {
  std::filesystem::path dir = std::filesystem::path(path).parent_path();
  if (dir.empty()) dir = ".";
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return;
  ::fsync(fd);
  ::close(fd);
}

}  // namespace

const Tensor& TensorFile::get(const std::string& name) const {
  auto it = tensors.find(name);
  if (it != tensors.end()) return it->second;
  std::string listed;
  size_t n = 0;
  for (const auto& [present, t] : tensors) {
    if (n == kMaxListedNames) {
      listed += fmt::format(", ... ({} more)", tensors.size() - n);
      break;
    }
    listed += (n++ ? ", " : "") + present;
  }
  fail("no tensor named '{}' in {}; it holds {} tensors: [{}]", name,
       path.empty() ? std::string("the tensor file") : "'" + path + "'", tensors.size(), listed);
}

TensorFile read_safetensors(const std::string& path) {
  Fd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (fd.get() < 0) fail("cannot open safetensors file '{}': {}", path, std::strerror(errno));
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) bad_file(path, "cannot stat: {}", std::strerror(errno));
  if (!S_ISREG(st.st_mode)) bad_file(path, "not a regular file");
  const uint64_t file_size = static_cast<uint64_t>(st.st_size);
  if (file_size < 8)
    bad_file(path, "file is {} bytes, shorter than the 8-byte header length (truncated?)", file_size);

  unsigned char len_bytes[8];
  read_exact(fd.get(), path, len_bytes, 8, 0, "the header length");
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | len_bytes[i];
  if (header_len > kMaxHeaderBytes)
    bad_file(path, "header length {} bytes is absurdly large (limit {} bytes); not a safetensors file?",
             header_len, kMaxHeaderBytes);
  if (header_len > file_size - 8)
    bad_file(path, "header length {} bytes exceeds the {} bytes after the length field (truncated?)",
             header_len, file_size - 8);

  std::string text(static_cast<size_t>(header_len), '\0');
  read_exact(fd.get(), path, text.data(), header_len, 8, "the header");

  // Duplicate names would silently keep only the last entry; find them while parsing.
  std::string duplicate;
  std::set<std::string> seen;
  json::parser_callback_t on_event = [&](int depth, json::parse_event_t event, json& parsed) {
    if (event == json::parse_event_t::key && depth == 1 && duplicate.empty()) {
      const std::string& key = parsed.get_ref<const std::string&>();
      if (!seen.insert(key).second) duplicate = key;
    }
    return true;
  };
  json header;
  try {
    header = json::parse(text, on_event);
  } catch (const json::exception& e) {
    bad_file(path, "header is not valid JSON ({})", e.what());
  }
  if (!header.is_object()) bad_file(path, "header must be a JSON object, got {}", header.type_name());
  if (!duplicate.empty()) bad_file(path, "header names '{}' twice (duplicate entry)", duplicate);

  TensorFile out;
  out.path = path;
  std::vector<Entry> entries;
  for (const auto& [name, info] : header.items()) {
    if (name == "__metadata__") {
      out.metadata = parse_metadata(info, path);
      continue;
    }
    entries.push_back(parse_entry(name, info, path));
  }

  // The data section must be exactly tiled by the entries: no overlap, gap or trailing bytes.
  const uint64_t data_begin = 8 + header_len;
  const uint64_t data_size = file_size - data_begin;
  std::sort(entries.begin(), entries.end(), [](const Entry& a, const Entry& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  uint64_t cursor = 0;
  const Entry* previous = nullptr;
  for (const Entry& e : entries) {
    if (e.end > data_size)
      bad_file(path, "tensor '{}': data_offsets [{}, {}] lie outside the {}-byte data section (out of range)",
               e.name, e.begin, e.end, data_size);
    if (e.begin < cursor)
      bad_file(path, "tensor '{}' at bytes [{}, {}) overlaps tensor '{}' ending at byte {}", e.name,
               e.begin, e.end, previous->name, cursor);
    if (e.begin > cursor)
      bad_file(path, "bytes [{}, {}) of the data section belong to no tensor (gap before '{}')",
               cursor, e.begin, e.name);
    cursor = e.end;
    previous = &e;
  }
  if (cursor != data_size)
    bad_file(path, "{} trailing bytes after the last tensor are not covered by any entry",
             data_size - cursor);

  for (const Entry& e : entries) {
    Tensor t = Tensor::empty(e.shape, e.dtype);
    read_exact(fd.get(), path, t.raw(), e.end - e.begin, data_begin + e.begin,
               ("tensor '" + e.name + "'").c_str());
    out.tensors.emplace(e.name, std::move(t));
  }
  return out;
}

void write_safetensors(const std::string& path, const std::map<std::string, Tensor>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  json header = json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  uint64_t offset = 0;
  for (const auto& [name, t] : tensors) {
    QV_CHECK(name != "__metadata__", "writing '{}': '__metadata__' is reserved, not a tensor name",
             path);
    QV_CHECK(t.defined(), "writing '{}': tensor '{}' is undefined", path, name);
    QV_CHECK(t.device() == Device::CPU, "writing '{}': tensor '{}' is on {}; copy it to the CPU first",
             path, name, device_name(t.device()));
    const uint64_t nbytes = t.nbytes();
    header[name] = {{"dtype", dtype_name(t.dtype())},
                    {"shape", t.shape()},
                    {"data_offsets", {offset, offset + nbytes}}};
    offset += nbytes;
  }
  std::string text;
  try {
    text = header.dump();
  } catch (const json::exception& e) {
    fail("writing '{}': a tensor name or metadata entry is not valid UTF-8 ({})", path, e.what());
  }
  // Pad so that the data section starts 8-byte aligned, as the reference writer does.
  text.append((8 - text.size() % 8) % 8, ' ');

  const std::string tmp = fmt::format("{}.tmp.{}", path, static_cast<long>(::getpid()));
  std::FILE* f = std::fopen(tmp.c_str(), "wb");
  if (!f)
    fail("cannot write safetensors file '{}': creating '{}' failed: {}", path, tmp,
         std::strerror(errno));
  TempFile guard(tmp, f);

  unsigned char len_bytes[8];
  uint64_t header_len = text.size();
  for (int i = 0; i < 8; ++i) len_bytes[i] = static_cast<unsigned char>(header_len >> (8 * i));
  write_all(f, len_bytes, 8, tmp);
  write_all(f, text.data(), text.size(), tmp);
  for (const auto& [name, t] : tensors) {
    if (t.numel() == 0) continue;
    if (t.is_contiguous()) {
      write_all(f, t.raw(), t.nbytes(), tmp);
    } else {
      Tensor c = t.clone();
      write_all(f, c.raw(), c.nbytes(), tmp);
    }
  }
  if (std::fflush(f) != 0) fail("flushing '{}' failed: {}", tmp, std::strerror(errno));
  if (::fsync(::fileno(f)) != 0) fail("fsync of '{}' failed: {}", tmp, std::strerror(errno));
  guard.close();
  if (std::rename(tmp.c_str(), path.c_str()) != 0)
    fail("cannot write safetensors file '{}': renaming '{}' over it failed: {}", path, tmp,
         std::strerror(errno));
  guard.commit();
  sync_parent_directory(path);
}

}  // namespace quiver
