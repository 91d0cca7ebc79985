// Checkpoints: named tensors plus string metadata in one safetensors file (so other
// tools can read the weights), guarded by a CRC-32 of the whole file (length field,
// header with its tensor table and metadata, data) and written atomically. Callers put their own state (step, config hash, RNG state, sampler
// position, ...) in the metadata as text.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "nn/module.h"
#include "tensor/tensor.h"

namespace ht::runtime {

// Reserved __metadata__ keys that the writer sets and the reader verifies and removes.
// kCrcKey: 8 lowercase hex digits, the zlib CRC-32 of the file's bytes as written with
// these 8 digits replaced by "00000000". A verifier outside hetrain finds the one
// occurrence of "hetrain.crc32":" in the header text, zeroes the digits after it and
// sums the file. Format "1" summed only the data section; it is refused.
inline constexpr const char* kCrcKey = "hetrain.crc32";
inline constexpr const char* kFormatKey = "hetrain.format";
inline constexpr const char* kFormat = "2";

struct Checkpoint {
  std::string path;                              // where it was read from
  std::map<std::string, Tensor> tensors;         // contiguous, on the CPU backend
  std::map<std::string, std::string> metadata;   // the caller's keys (reserved ones removed)
};

// Writes `tensors` (any backend, any view; stored as dense copies in the given order) and
// `metadata` to `path` atomically (see atomic_file.h). On any failure the temporary file
// is removed, an existing file at `path` is untouched, and an ht::Error names `path` and
// the reason. Duplicate or empty names, undefined tensors and reserved metadata keys are
// errors raised before anything is written.
void write_checkpoint(const std::string& path, const std::vector<nn::NamedTensor>& tensors,
                      const std::map<std::string, std::string>& metadata);

// Reads and verifies a checkpoint: sizes, header, dtypes, shapes against offsets, and the
// checksum. Any problem -> ht::Error "checkpoint <path>: <what is wrong>".
Checkpoint read_checkpoint(const std::string& path);

// Copies the checkpoint's values into `into` (e.g. a model's parameters) in place, so the
// tensors keep their identity and backend. Only checkpoint tensors whose names start
// with `prefix` take part ("model." loads the weights and ignores "optim." state); names
// in `into` are full names. First checks that names, shapes and dtypes match exactly;
// otherwise throws an ht::Error naming every mismatched, missing and unexpected tensor
// ("checkpoint ckpt-00000010.safetensors does not match the model: tensor 'w' has shape
// [512, 784] in the checkpoint and [256, 784] in the model"), and copies nothing. A
// released tensor (Tensor::release: a block outside the rank's stage) is checked, not
// loaded.
void load_into(const std::vector<nn::NamedTensor>& into, const Checkpoint& checkpoint,
               const std::string& prefix = "");

}  // namespace ht::runtime
