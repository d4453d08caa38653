// safetensors files (https://huggingface.co/docs/safetensors): an 8-byte little-endian
// header length, a JSON header {name: {dtype, shape, data_offsets}, "__metadata__": {..}},
// then the raw little-endian tensor bytes. quiver reads and writes F32, F64 and BF16.
#pragma once
#include <map>
#include <string>

#include "quiver/tensor.h"

namespace quiver {

struct TensorFile {
  std::map<std::string, Tensor> tensors;            // CPU, contiguous
  std::map<std::string, std::string> metadata;      // the "__metadata__" string map
  std::string path;                                 // the file read; empty when built in memory

  // The named tensor, or an Error that names the file's tensors when it is missing.
  const Tensor& get(const std::string& name) const;
  bool has(const std::string& name) const { return tensors.count(name) != 0; }
};

// Reads and validates a whole file: header length within the file, JSON well formed,
// every entry with a known dtype, a shape of non-negative sizes, offsets in order, inside
// the data section, matching dtype size × element count, not overlapping, and together
// covering the data section with no gap or trailing bytes; no name twice; "__metadata__"
// a string→string map. Errors name the file and the problem.
TensorFile read_safetensors(const std::string& path);

// Writes atomically: a temporary file beside the target, flushed and fsynced, then
// renamed over it, so a crash never leaves a half-written file under the final name.
// The temporary is `path + ".tmp.<pid>"` and is removed on failure. Entries are sorted
// by name, the data laid out in the same order, the header padded with spaces to a
// multiple of 8 bytes. Tensors must be on the CPU; they may be strided or of any dtype
// quiver knows and are written contiguous.
void write_safetensors(const std::string& path, const std::map<std::string, Tensor>& tensors,
                       const std::map<std::string, std::string>& metadata = {});

}  // namespace quiver
