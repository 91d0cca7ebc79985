// Batch tensors for lists of samples (as the samplers produce them), and sequential
// evaluation iterators over a whole split. Each is made on the backend given (the
// task's device): the samples are gathered on the host and copied there once.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "backend/backend.h"
#include "data/image_dataset.h"
#include "data/sampler.h"
#include "tensor/tensor.h"

namespace ht::data {

struct ImageBatch {
  Tensor inputs;  // (n, C, H, W) float32
  Tensor labels;  // (n) int32
  int64_t size() const { return inputs.defined() ? inputs.size(0) : 0; }
};

struct TextBatch {
  Tensor inputs;   // (n, context) int32: tokens [start, start + context)
  Tensor targets;  // (n, context) int32: tokens [start + 1, start + context + 1)
  int64_t size() const { return inputs.defined() ? inputs.size(0) : 0; }
};

// Gathers samples `indices` (e.g. ShuffledSampler output) into one batch.
ImageBatch make_image_batch(const ImageDataset& ds, std::span<const int64_t> indices,
                            Backend& be);

// Windows of context + 1 tokens starting at `starts` (e.g. WindowSampler output); the
// targets are the inputs shifted by one token.
TextBatch make_text_batch(std::span<const uint8_t> tokens, std::span<const int64_t> starts,
                          int64_t context, Backend& be);

// The same for the contiguous stream positions [first_position, first_position + count)
// of `sampler` (a consumer's slice of a global batch).
ImageBatch make_image_batch(const ImageDataset& ds, Sampler& sampler, int64_t first_position,
                            int64_t count, Backend& be);
TextBatch make_text_batch(std::span<const uint8_t> tokens, Sampler& sampler,
                          int64_t first_position, int64_t count, int64_t context,
                          Backend& be);

// In-order evaluation over a dataset in chunks of `batch_size`, covering the first
// min(N, max_samples) samples (max_samples = 0: all N). The last chunk may be short.
// Holds a reference: `ds` must outlive the iterator.
class ImageEvalIterator {
 public:
  ImageEvalIterator(const ImageDataset& ds, int64_t batch_size, int64_t max_samples, Backend& be);
  // Fills `out` with the next chunk; false once the split is exhausted.
  bool next(ImageBatch& out);
  void reset() { pos_ = 0; }
  // From chunk `chunk` on (0-based, as next() numbers them; past the last: none left).
  void seek_chunk(int64_t chunk);
  int64_t total() const { return total_; }
  int64_t chunks() const { return (total_ + batch_size_ - 1) / batch_size_; }

 private:
  const ImageDataset& ds_;
  int64_t batch_size_, total_, pos_ = 0;
  Backend& be_;
};

// In-order evaluation over a token split as non-overlapping consecutive windows of
// context + 1 tokens with stride context (window w starts at w * context), so every
// token after the first is predicted exactly once: (T - 1) / context windows, capped at
// max_samples (0: all). Chunks of `batch_size` windows; the last chunk may be short.
// Holds a view: the tokens must outlive the iterator.
class TextEvalIterator {
 public:
  TextEvalIterator(std::span<const uint8_t> tokens, int64_t context, int64_t batch_size,
                   int64_t max_samples, Backend& be);
  bool next(TextBatch& out);
  void reset() { pos_ = 0; }
  void seek_chunk(int64_t chunk);  // as ImageEvalIterator's
  int64_t total() const { return total_; }  // windows
  int64_t chunks() const { return (total_ + batch_size_ - 1) / batch_size_; }

 private:
  std::span<const uint8_t> tokens_;
  int64_t context_, batch_size_, total_, pos_ = 0;
  Backend& be_;
};

}  // namespace ht::data
