// A byte-level text corpus: files read and concatenated, mapped one token per byte to
// a 96-symbol vocabulary, and split into train and validation parts.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace ht::data {

// Byte tokenizer, vocabulary 96:
//   '\n'            -> 0
//   ' ' .. '~'      -> 1 .. 95 (byte - 31)
//   '\t'            -> 1 (as ' ')
//   any other byte  -> the id of '?' (32): other control bytes and every byte >= 0x80,
//                      so UTF-8 text degrades to one '?' per byte of each non-ASCII
//                      character.
// Exactly one token per input byte, so a loss per token in nats divided by ln 2 is
// bits per byte of the original file. decode() is the inverse on '\n' and ' '..'~'.
inline constexpr int64_t kByteVocab = 96;
uint8_t byte_to_token(unsigned char c);
char token_to_char(int64_t id);  // throws ht::Error unless 0 <= id < 96
std::vector<uint8_t> encode(std::string_view text);
std::string decode(std::span<const int32_t> ids);
std::string decode(std::span<const uint8_t> ids);

struct TextCorpus {
  std::vector<std::string> files;   // in reading order
  int64_t total_tokens = 0;
  std::vector<uint8_t> train;       // (T_train) token ids
  std::vector<uint8_t> validation;  // (T_val) token ids, spread over the corpus
};

// Validation is taken in segments of about this many tokens, evenly spread.
inline constexpr int64_t kValidationSegment = 4096;

// The files named by `paths` in order: a file as is, a directory as all regular files
// directly in it, sorted by name, skipping names ending in any of `skip_suffixes`.
// floor(validation_fraction * T) tokens are validation (0 <= fraction < 1; 0 means no
// validation split): the corpus is cut into K = max(1, T_val / kValidationSegment) equal
// chunks and the tail of each is held out, so validation samples the whole corpus (a
// small corpus, K = 1, holds out its tail). Throws ht::Error on a missing path, an empty corpus, or a train
// split (or non-empty-requested validation split) shorter than `min_split_tokens`
// (context + 1 for a model that reads windows of context + 1 tokens).
TextCorpus load_text_corpus(const std::vector<std::string>& paths,
                            const std::vector<std::string>& skip_suffixes,
                            double validation_fraction, int64_t min_split_tokens);

// The file list load_text_corpus would read, without reading them.
std::vector<std::string> list_corpus_files(const std::vector<std::string>& paths,
                                           const std::vector<std::string>& skip_suffixes);

}  // namespace ht::data
