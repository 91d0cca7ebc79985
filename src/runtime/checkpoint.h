// Checkpoints: named tensors plus string metadata in one safetensors file (so other
// tools can read the weights), guarded by a CRC-32 of the whole file (length field,
// header with its tensor table and metadata, data) and written atomically. Callers put their own state (step, config hash, RNG state, sampler
// position, ...) in the metadata as text.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <utility>
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

class AtomicFile;

// One tensor of a checkpoint's table, before its values exist.
struct CheckpointSlot {
  std::string name;
  DType dtype = DType::f32;
  Shape shape;
};

// A checkpoint that cannot be read on demand any more (Checkpoint::get: changed since it
// was verified, or unreadable): about the file, not about what the caller loads into.
class CheckpointReadError : public Error {
 public:
  using Error::Error;
};

// A verified checkpoint file held open, for reading its tensors one at a time.
struct CheckpointSource {
  int fd = -1;
  uint64_t size = 0;
  int64_t mtime_ns = 0;  // as verified: a file changed since is refused
  std::map<std::string, std::pair<uint64_t, uint64_t>> ranges;  // name -> (file offset, bytes)
  ~CheckpointSource();
};

struct Checkpoint {
  std::string path;                              // where it was read from
  std::map<std::string, Tensor> tensors;         // its values, when read with them (CPU, contiguous)
  std::map<std::string, CheckpointSlot> table;   // every tensor in the file
  std::map<std::string, std::string> metadata;   // the caller's keys (reserved ones removed)
  std::shared_ptr<const CheckpointSource> source;  // the open file, when read without the values

  // A tensor's values: from `tensors`, or read from the verified file now (a fresh CPU
  // tensor, held only as long as the caller holds it). An unknown name is an ht::Error; a
  // file changed or unreadable since it was verified a CheckpointReadError.
  Tensor get(const std::string& name) const;
};

// A checkpoint written as its tensors come, one at a time, so that the writer need not
// hold them all: rank 0 receives a pipeline's optimiser state tensor by tensor from the
// ranks that own it (runtime/stage_gather.h). The table (`slots`, in file order) and the
// metadata are fixed first; the file is the atomic write of atomic_file.h. Duplicate or
// empty names and reserved metadata keys are errors raised before anything is written.
class CheckpointWriter {
 public:
  CheckpointWriter(const std::string& path, std::vector<CheckpointSlot> slots,
                   const std::map<std::string, std::string>& metadata);
  // The next slot's values (any backend, any view). A tensor of another shape or dtype,
  // or with a non-finite value, is an ht::Error, and the temporary file is removed.
  void write(const Tensor& t);
  // After the last slot: the checksum goes into the header and the file takes `path`.
  void commit();
  // Not committed: the temporary file is removed, an existing file at `path` untouched.
  ~CheckpointWriter();
  CheckpointWriter(const CheckpointWriter&) = delete;
  CheckpointWriter& operator=(const CheckpointWriter&) = delete;

 private:
  std::string path_;
  std::vector<CheckpointSlot> slots_;
  std::map<std::string, std::string> metadata_;
  std::string zeroed_header_;
  std::unique_ptr<AtomicFile> out_;
  uint32_t crc_ = 0;
  size_t next_ = 0;
};

// Writes `tensors` (any backend, any view; stored as dense copies in the given order) and
// `metadata` to `path` atomically (see atomic_file.h). On any failure the temporary file
// is removed, an existing file at `path` is untouched, and an ht::Error names `path` and
// the reason. Duplicate or empty names, undefined tensors, non-finite values and reserved
// metadata keys are errors raised before anything is written.
void write_checkpoint(const std::string& path, const std::vector<nn::NamedTensor>& tensors,
                      const std::map<std::string, std::string>& metadata);

// Reads and verifies a checkpoint: sizes, header, dtypes, shapes against offsets, the
// checksum and finite floats, over the whole file as it streams through a buffer of a few
// MiB. Any problem -> ht::Error "checkpoint <path>: <what is wrong>". With keep_values the
// tensors are kept in `tensors`; without, none is, the file stays open and get() reads
// each when asked, so that a rank resuming its stage of a model larger than its host's
// memory holds what it loads, a tensor at a time.
Checkpoint read_checkpoint(const std::string& path, bool keep_values = true);

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
