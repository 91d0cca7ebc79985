#include "data/batch.h"

#include <algorithm>
#include <cstring>

#include "core/error.h"

namespace ht::data {

namespace {

int64_t capped(int64_t available, int64_t max_samples, const char* what) {
  HT_CHECK(max_samples >= 0, what, ": max_samples ", max_samples, "; expected >= 0 (0 = all)");
  return max_samples == 0 ? available : std::min(available, max_samples);
}

// Where chunk `chunk` of `batch` items starts among `total` (0-based; past the last: the
// end, none left).
int64_t chunk_start(int64_t chunk, int64_t batch, int64_t total, const char* what) {
  HT_CHECK(chunk >= 0, what, ": chunk ", chunk, "; expected >= 0");
  return chunk > total / batch ? total : std::min(total, chunk * batch);
}

}  // namespace

ImageBatch make_image_batch(const ImageDataset& ds, std::span<const int64_t> indices,
                            Backend& be) {
  const int64_t n = static_cast<int64_t>(indices.size());
  const int64_t per = ds.sample_numel();
  // Scratch kept per thread (from_vector copies it): where a rank's heap grows, a fresh
  // vector every step lands on new pages and page-faults through all of them.
  thread_local std::vector<float> x;
  thread_local std::vector<int32_t> y;
  x.resize(static_cast<size_t>(n * per));  // (n, C, H, W), every element written below
  y.resize(static_cast<size_t>(n));        // (n)
  for (int64_t i = 0; i < n; ++i) {
    const int64_t idx = indices[static_cast<size_t>(i)];
    HT_CHECK(idx >= 0 && idx < ds.size(), "make_image_batch: sample index ", idx, " at position ",
             i, " is out of range; expected 0 <= index < ", ds.size());
    std::memcpy(x.data() + i * per, ds.image(idx), static_cast<size_t>(per) * sizeof(float));
    y[static_cast<size_t>(i)] = ds.labels[static_cast<size_t>(idx)];
  }
  return {Tensor::from_vector(x, {n, ds.channels, ds.height, ds.width}, be),
          Tensor::from_ints(y, {n}, be)};
}

TextBatch make_text_batch(std::span<const uint8_t> tokens, std::span<const int64_t> starts,
                          int64_t context, Backend& be) {
  HT_CHECK(context > 0, "make_text_batch: context ", context, "; expected > 0");
  const int64_t n = static_cast<int64_t>(starts.size());
  const int64_t num_tokens = static_cast<int64_t>(tokens.size());
  thread_local std::vector<int32_t> x, y;  // scratch, as in make_image_batch
  x.resize(static_cast<size_t>(n * context));  // (n, context), every element written below
  y.resize(static_cast<size_t>(n * context));
  for (int64_t i = 0; i < n; ++i) {
    const int64_t s = starts[static_cast<size_t>(i)];
    HT_CHECK(s >= 0 && s + context + 1 <= num_tokens, "make_text_batch: window start ", s,
             " at position ", i, " is out of range; expected 0 <= start <= ",
             num_tokens - context - 1, " (", num_tokens, " tokens, window ", context + 1, ")");
    const uint8_t* src = tokens.data() + s;
    int32_t* xi = x.data() + i * context;
    int32_t* yi = y.data() + i * context;
    for (int64_t t = 0; t < context; ++t) {
      xi[t] = src[t];
      yi[t] = src[t + 1];
    }
  }
  return {Tensor::from_ints(x, {n, context}, be), Tensor::from_ints(y, {n, context}, be)};
}

ImageBatch make_image_batch(const ImageDataset& ds, Sampler& sampler, int64_t first_position,
                            int64_t count, Backend& be) {
  return make_image_batch(ds, sampler.at_range(first_position, count), be);
}

TextBatch make_text_batch(std::span<const uint8_t> tokens, Sampler& sampler,
                          int64_t first_position, int64_t count, int64_t context, Backend& be) {
  return make_text_batch(tokens, sampler.at_range(first_position, count), context, be);
}

ImageEvalIterator::ImageEvalIterator(const ImageDataset& ds, int64_t batch_size,
                                     int64_t max_samples, Backend& be)
    : ds_(ds), batch_size_(batch_size), total_(capped(ds.size(), max_samples, "ImageEvalIterator")),
      be_(be) {
  HT_CHECK(batch_size > 0, "ImageEvalIterator: batch size ", batch_size, "; expected > 0");
}

bool ImageEvalIterator::next(ImageBatch& out) {
  if (pos_ >= total_) return false;
  const int64_t n = std::min(batch_size_, total_ - pos_);
  std::vector<int64_t> idx(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) idx[static_cast<size_t>(i)] = pos_ + i;
  out = make_image_batch(ds_, idx, be_);
  pos_ += n;
  return true;
}

void ImageEvalIterator::seek_chunk(int64_t chunk) { pos_ = chunk_start(chunk, batch_size_, total_, "ImageEvalIterator"); }

TextEvalIterator::TextEvalIterator(std::span<const uint8_t> tokens, int64_t context,
                                   int64_t batch_size, int64_t max_samples, Backend& be)
    : tokens_(tokens), context_(context), batch_size_(batch_size), total_(0), be_(be) {
  HT_CHECK(context > 0, "TextEvalIterator: context ", context, "; expected > 0");
  HT_CHECK(batch_size > 0, "TextEvalIterator: batch size ", batch_size, "; expected > 0");
  const int64_t t = static_cast<int64_t>(tokens.size());
  HT_CHECK(t >= context + 1, "TextEvalIterator: ", t, " tokens cannot hold one window of ",
           context + 1, " (context + 1)");
  total_ = capped((t - 1) / context, max_samples, "TextEvalIterator");
}

void TextEvalIterator::seek_chunk(int64_t chunk) { pos_ = chunk_start(chunk, batch_size_, total_, "TextEvalIterator"); }

bool TextEvalIterator::next(TextBatch& out) {
  if (pos_ >= total_) return false;
  const int64_t n = std::min(batch_size_, total_ - pos_);
  std::vector<int64_t> starts(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) starts[static_cast<size_t>(i)] = (pos_ + i) * context_;
  out = make_text_batch(tokens_, starts, context_, be_);
  pos_ += n;
  return true;
}

}  // namespace ht::data
