// Model checkpoints: one safetensors file that Python's safetensors and PyTorch read.
//
// Every parameter is its own F32 tensor, named as in Model::param_table() ("tok_emb",
// "layers.3.ffn.up", ...). Metadata (all strings):
//   "quiver.format"    = "quiver-checkpoint-1"
//   "quiver.config"    = config_to_json(cfg).dump()
//   "quiver.tokenizer" = the tokenizer path of the training data (may be empty)
//   "quiver.step"      = optimizer steps done
// plus whatever the caller adds. Files are written atomically (temporary file, fsync, rename),
// so a failed write (a full disk) leaves the previous checkpoint intact.
#pragma once
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "model/config.h"
#include "model/model.h"

namespace quiver::train {

inline constexpr const char* kCheckpointFormat = "quiver-checkpoint-1";
inline constexpr const char* kMetaFormat = "quiver.format";
inline constexpr const char* kMetaConfig = "quiver.config";
inline constexpr const char* kMetaTokenizer = "quiver.tokenizer";
inline constexpr const char* kMetaStep = "quiver.step";

// Writes the model's parameters (converted to F32) and the metadata above. extra_metadata
// may set "quiver.tokenizer" and "quiver.step" (default "" and "0") and any other key, but
// not "quiver.format" or "quiver.config".
void save_checkpoint(const std::string& path, const model::Model& model,
                     const std::map<std::string, std::string>& extra_metadata);

// Reads a checkpoint into a new F32 model. Validates the format tag, the config, that every
// parameter is present as F32 with its recorded shape, and that no other tensor is there.
// Errors name the checkpoint path and the problem. `metadata`, when given, receives the
// file's metadata.
std::unique_ptr<model::Model> load_checkpoint(const std::string& path,
                                              std::map<std::string, std::string>* metadata = nullptr);

// The config stored in a checkpoint, without loading its parameters' values into a model.
model::ModelConfig read_checkpoint_config(const std::string& path);

// The fields in which two configs differ, as "n_layers: 4 vs 6" (dotted names for nested
// fields, values as JSON); empty when equal.
std::vector<std::string> config_differences(const model::ModelConfig& a, const model::ModelConfig& b);

// Writes a text file atomically (temporary beside it, fsync, rename); a failure names the path
// and leaves the previous file untouched.
void write_text_atomic(const std::string& path, const std::string& content);

}  // namespace quiver::train
