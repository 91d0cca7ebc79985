// Checkpoints: the safetensors layout, integrity checks, atomic writes under failure,
// retention, resume from the newest valid file, loading into existing tensors, and
// writing and reading them a tensor at a time.
#include <doctest/doctest.h>

#include <fcntl.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <set>
#include <string>

#include "backend/registry.h"
#include "core/error.h"
#include "models/models.h"
#include "ops/ops.h"
#include "optim/make_optimizer.h"
#include "runtime/atomic_file.h"
#include "runtime/checkpoint.h"
#include "runtime/checkpoint_dir.h"
#include "runtime/run_dir.h"
#include "runtime/stage_gather.h"
#include "tests/unit/temp_dir.h"

using namespace ht;
using namespace ht::runtime;
namespace fs = std::filesystem;

namespace {

using test_fixtures::TempDir;

std::string slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

void spit(const std::string& path, const std::string& bytes) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

std::vector<float> iota(int n, float from = 0.f) {
  std::vector<float> v(n);
  for (int i = 0; i < n; ++i) v[i] = from + static_cast<float>(i);
  return v;
}

std::vector<nn::NamedTensor> small_model(float from = 0.f) {
  return {{"w", Tensor::from_vector(iota(6, from), {2, 3}, cpu_backend())},
          {"ids", Tensor::from_ints({1, 2, 3}, {3}, cpu_backend())}};
}

// A safetensors file from raw header text and data, for malformed-header cases.
std::string raw_file(std::string header, const std::string& data) {
  while (header.size() % 8) header += ' ';
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((header.size() >> (8 * i)) & 0xff);
  return out + header + data;
}

// doctest::Contains takes only its own string type.
doctest::Contains contains(const std::string& s) { return doctest::Contains(s.c_str()); }

uint64_t header_length(const std::string& file) {
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= static_cast<uint64_t>(static_cast<unsigned char>(file[i])) << (8 * i);
  return n;
}

}  // namespace

TEST_CASE("checkpoint: f32 and i32 tensors of several shapes and metadata round-trip") {
  TempDir tmp;
  const std::string path = tmp / "a.safetensors";
  Tensor cube = Tensor::from_vector(iota(24, -5.f), {2, 3, 4}, cpu_backend());
  std::vector<nn::NamedTensor> tensors = {
      {"layers.0.weight", Tensor::from_vector(iota(6, 0.5f), {2, 3}, cpu_backend())},
      {"labels", Tensor::from_ints({-7, 0, 2147483647, 3}, {4}, cpu_backend())},
      {"scalar", Tensor::from_vector({3.25f}, {}, cpu_backend())},
      {"empty", Tensor::from_vector({}, {0, 3}, cpu_backend())},
      {"empty_ids", Tensor::from_ints({}, {0}, cpu_backend())},
      {"transposed", transpose(cube, 0, 2)},  // a strided view is stored densely
  };
  std::map<std::string, std::string> meta = {
      {"step", "42"}, {"rng", "state 1 2 3\nline two"}, {"note", "gr\u00fc\u00dfe \"quoted\""}};
  write_checkpoint(path, tensors, meta);
  CHECK_FALSE(fs::exists(path + ".tmp"));

  Checkpoint c = read_checkpoint(path);
  CHECK(c.path == path);
  CHECK(c.metadata == meta);  // reserved hetrain.* keys are verified and removed
  REQUIRE(c.tensors.size() == tensors.size());
  for (const auto& [name, t] : tensors) {
    CAPTURE(name);
    const Tensor& r = c.tensors.at(name);
    CHECK(r.shape() == t.shape());
    CHECK(r.dtype() == t.dtype());
    if (t.dtype() == DType::f32) CHECK(r.to_vector() == t.to_vector());
    else CHECK(r.to_ints() == t.to_ints());
  }
  CHECK(c.tensors.at("scalar").item() == 3.25f);

  // An independent reader of the safetensors layout: length, JSON, offsets, bytes.
  const std::string file = slurp(path);
  const uint64_t n = header_length(file);
  CHECK(n % 8 == 0);
  REQUIRE(8 + n <= file.size());
  const std::string data = file.substr(8 + n);
  nlohmann::json h = nlohmann::json::parse(file.substr(8, n));
  REQUIRE(h.is_object());
  CHECK(h["__metadata__"]["step"] == "42");
  CHECK(h["__metadata__"]["hetrain.format"] == "2");
  // The checksum as an outside verifier computes it: zlib's CRC-32 of the whole file
  // with the recorded digits replaced by zeros.
  const std::string recorded = h["__metadata__"]["hetrain.crc32"];
  const size_t at = file.find("\"hetrain.crc32\":\"" + recorded + "\"");
  REQUIRE(at != std::string::npos);
  std::string zeroed = file;
  zeroed.replace(at + 17, 8, "00000000");
  char crc[9];
  std::snprintf(crc, sizeof crc, "%08lx",
                ::crc32(0, reinterpret_cast<const Bytef*>(zeroed.data()), static_cast<uInt>(zeroed.size())));
  CHECK(recorded == crc);
  uint64_t expect_begin = 0;
  for (const auto& [name, t] : tensors) {  // stored in the given order, back to back
    CAPTURE(name);
    const nlohmann::json& e = h.at(name);
    CHECK(e["dtype"] == (t.dtype() == DType::f32 ? "F32" : "I32"));
    CHECK(e["shape"].get<std::vector<int64_t>>() == t.shape());
    const uint64_t begin = e["data_offsets"][0], end = e["data_offsets"][1];
    CHECK(begin == expect_begin);
    CHECK(end - begin == static_cast<uint64_t>(t.numel()) * 4);
    if (t.dtype() == DType::f32) {
      std::vector<float> v(t.numel());
      if (!v.empty()) std::memcpy(v.data(), data.data() + begin, end - begin);
      CHECK(v == t.to_vector());
    }
    expect_begin = end;
  }
  CHECK(expect_begin == data.size());
}

TEST_CASE("checkpoint: bad writes are refused before any file is created") {
  TempDir tmp;
  const std::string path = tmp / "bad.safetensors";
  Tensor t = Tensor::from_vector({1.f}, {1}, cpu_backend());
  CHECK_THROWS_WITH_AS(write_checkpoint(path, {{"a", t}, {"a", t}}, {}),
                       contains("duplicate tensor name 'a'"), Error);
  CHECK_THROWS_WITH_AS(write_checkpoint(path, {{"a", t}}, {{"hetrain.crc32", "0"}}),
                       contains("reserved"), Error);
  CHECK_THROWS_WITH_AS(write_checkpoint(path, {{"a", Tensor()}}, {}),
                       contains("tensor 'a' is undefined"), Error);
  CHECK_THROWS_WITH_AS(write_checkpoint(path, {{"__metadata__", t}}, {}),
                       contains("invalid tensor name"), Error);
  CHECK(fs::is_empty(tmp.path));
}

TEST_CASE("atomic file: a link is written through; a pipe is refused and left a pipe") {
  TempDir tmp;
  const std::string target = tmp / "target.json", link = tmp / "link.json", pipe = tmp / "pipe";
  { std::ofstream(target) << "old"; }
  fs::create_symlink(target, link);
  runtime::write_file_atomically(link, "new", "plan");
  CHECK(fs::is_symlink(fs::symlink_status(link)));  // the link stays a link
  std::ifstream in(target);
  CHECK(std::string(std::istreambuf_iterator<char>(in), {}) == "new");
  REQUIRE(::mkfifo(pipe.c_str(), 0600) == 0);
  CHECK_THROWS_WITH_AS(runtime::write_file_atomically(pipe, "x", "plan"),
                       contains("is not a regular file"), Error);
  CHECK(fs::is_fifo(fs::symlink_status(pipe)));
  CHECK_THROWS_WITH_AS(runtime::write_file_atomically(tmp.path, "x", "plan"), contains("is not a regular file"), Error);
  CHECK(!fs::exists(pipe + ".tmp"));
}

TEST_CASE("run dir: one hetrain process at a time; a refused run's cleanup leaves the holder's files") {
  TempDir tmp;
  const std::string dir = tmp / "run";
  {
    RunDir held = RunDir::open(dir, false);
    { std::ofstream(held.file("config.json")) << "{}"; }
    // flock conflicts between two opens even within one process, as between two processes.
    CHECK_THROWS_WITH_AS(RunDir::open(dir, true), contains("is in use by another hetrain process (pid "), Error);
    CHECK_THROWS_WITH_AS(RunDir::open(dir, false), contains("is in use by another hetrain process"), Error);
    RunDir::discard_unused(dir, true);  // as the refused run's failure path calls it
    CHECK(fs::exists(held.file("config.json")));
  }
  // Released with its holder: a failed new run's cleanup takes the files, and the directory.
  RunDir::discard_unused(dir, true);
  CHECK(!fs::exists(dir));
}

TEST_CASE("checkpoint: a non-finite value is never written; the error names the tensor and where") {
  TempDir tmp;
  const std::string path = tmp / "poisoned.safetensors";
  const Tensor good = Tensor::from_vector({1.f, 2.f}, {2}, cpu_backend());
  for (const float bad : {std::nanf(""), INFINITY, -INFINITY}) {
    CAPTURE(bad);
    const Tensor t = Tensor::from_vector({0.5f, 1.5f, bad}, {3}, cpu_backend());
    CHECK_THROWS_WITH_AS(write_checkpoint(path, {{"model.w", good}, {"optim.m", t}}, {}),
                         contains("not writing checkpoint " + path + ": tensor 'optim.m' holds " +
                                  (std::isnan(bad) ? std::string(std::signbit(bad) ? "-nan" : "nan")
                                                   : std::string(bad > 0 ? "inf" : "-inf")) +
                                  " at element 2 of 3; a non-finite model is never written"),
                         Error);
  }
  CHECK(fs::is_empty(tmp.path));
}

TEST_CASE("checkpoint writer: a file written tensor by tensor is byte for byte write_checkpoint's") {
  TempDir tmp;
  const std::vector<nn::NamedTensor> tensors = small_model(2.f);
  const std::map<std::string, std::string> meta = {{"step", "7"}};
  write_checkpoint(tmp / "whole.safetensors", tensors, meta);
  std::vector<CheckpointSlot> slots;
  for (const auto& [name, t] : tensors) slots.push_back({name, t.dtype(), t.shape()});
  {
    CheckpointWriter out(tmp / "streamed.safetensors", slots, meta);
    // A strided view is written densely, as write_checkpoint writes it.
    const Tensor view = transpose(Tensor::from_vector({2, 5, 3, 6, 4, 7}, {3, 2}, cpu_backend()), 0, 1);
    REQUIRE(!view.is_contiguous());
    out.write(view);
    out.write(tensors[1].second);
    out.commit();
  }
  CHECK(slurp(tmp / "streamed.safetensors") == slurp(tmp / "whole.safetensors"));
  CHECK(read_checkpoint(tmp / "streamed.safetensors").metadata.at("step") == "7");
}

TEST_CASE("checkpoint writer: a tensor unlike its slot, a non-finite one, or a short table leaves no file") {
  TempDir tmp;
  const std::string path = tmp / "c.safetensors";
  write_checkpoint(path, small_model(1.f), {});
  const std::string before = slurp(path);
  const std::vector<CheckpointSlot> slots = {{"w", DType::f32, {2, 3}}, {"ids", DType::i32, {3}}};
  {
    CheckpointWriter out(path, slots, {});
    CHECK_THROWS_WITH_AS(out.write(Tensor::from_vector(iota(6), {3, 2}, cpu_backend())),
                         contains("tensor 'w' is float32 [3, 2]; its table entry says float32 [2, 3]"), Error);
  }
  {
    CheckpointWriter out(path, slots, {});
    out.write(small_model()[0].second);
    CHECK_THROWS_WITH_AS(out.write(Tensor::from_vector({1.f, 2.f, 3.f}, {3}, cpu_backend())),
                         contains("tensor 'ids' is float32 [3]; its table entry says int32 [3]"), Error);
    CHECK_THROWS_WITH_AS(out.commit(), contains("1 of the table's 2 tensors written"), Error);
  }
  {
    CheckpointWriter out(path, {{"w", DType::f32, {2, 3}}}, {});
    CHECK_THROWS_WITH_AS(out.write(Tensor::from_vector({0, 1, 2, NAN, 4, 5}, {2, 3}, cpu_backend())),
                         contains("tensor 'w' holds nan at element 3 of 6"), Error);
    CHECK(!fs::exists(path + ".tmp"));  // gone with the error, before the writer is
  }
  CHECK_THROWS_WITH_AS(CheckpointWriter(path, {{"w", DType::f32, {1}}, {"w", DType::f32, {1}}}, {}),
                       contains("duplicate tensor name 'w'"), Error);
  CHECK(slurp(path) == before);
  CHECK(!fs::exists(path + ".tmp"));
}

TEST_CASE("checkpoint: the streamed optimizer state's slots are each stage's optimizer's, without allocating them") {
  models::MlpSpec spec;
  spec.input = 5;
  spec.hidden = {4, 3};
  spec.classes = 2;
  nn::Sequential model = models::build_mlp(spec, 3);
  REQUIRE(model.size() >= 3);
  plan::Plan p;
  p.stage_ranges = {{0, 1}, {1, static_cast<int>(model.size())}};
  config::OptimizerConfig sgd, momentum, adamw;
  sgd.type = momentum.type = "sgd";
  momentum.momentum = 0.9f;
  for (const config::OptimizerConfig& opt : {adamw, sgd, momentum}) {
    CAPTURE(opt.type);
    CAPTURE(opt.momentum);
    // What gather_to_root gave: each stage's optimiser's list in turn, "step" once.
    std::vector<std::pair<std::string, Tensor>> want;
    std::set<std::string> seen;
    for (const auto& [begin, end] : p.stage_ranges)
      for (const auto& nt : optim::make_optimizer(opt, model.named_parameters(begin, end))->state())
        if (seen.insert(nt.first).second) want.push_back(nt);
    const size_t live = cpu_backend().allocator().live_bytes();
    const std::vector<CheckpointSlot> got = optimizer_state_slots(p, model, opt);
    CHECK(cpu_backend().allocator().live_bytes() == live);
    REQUIRE(got.size() == want.size());
    for (size_t i = 0; i < got.size(); ++i) {
      CAPTURE(want[i].first);
      CHECK(got[i].name == want[i].first);
      CHECK(got[i].dtype == want[i].second.dtype());
      CHECK(got[i].shape == want[i].second.shape());
    }
  }
}

TEST_CASE("checkpoint: read without its values, it verifies every byte and then gives each tensor when asked") {
  TempDir tmp;
  const std::string path = tmp / "c.safetensors";
  std::vector<float> big(3 << 20);  // 12 MiB: more than the reader's chunk
  for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<float>(i % 1000);
  write_checkpoint(path,
                   {{"model.w", Tensor::from_vector(iota(6), {2, 3}, cpu_backend())},
                    {"optim.m", Tensor::from_vector(big, {static_cast<int64_t>(big.size())}, cpu_backend())},
                    {"model.b", Tensor::from_vector({7.f, 8.f}, {2}, cpu_backend())}},
                   {});
  const size_t live = cpu_backend().allocator().live_bytes();
  {
    const Checkpoint c = read_checkpoint(path, false);
    CHECK(c.tensors.empty());
    REQUIRE(c.table.size() == 3);
    CHECK(c.table.at("optim.m").shape == Shape{static_cast<int64_t>(big.size())});
    CHECK(cpu_backend().allocator().live_bytes() == live);  // no tensor held
    // Loading checks the names and shapes against the whole table, and reads each value.
    const Tensor w = Tensor::zeros({2, 3}, cpu_backend()), b = Tensor::zeros({2}, cpu_backend());
    load_into({{"model.w", w}, {"model.b", b}}, c, "model.");
    CHECK(w.to_vector() == iota(6));
    CHECK(b.to_vector() == std::vector<float>{7.f, 8.f});
    CHECK_THROWS_WITH_AS(load_into({{"model.w", w}}, c, "model."),
                         contains("tensor 'model.b' of shape [2] is in the checkpoint but not in the model"), Error);
    CHECK(c.get("optim.m").to_vector() == big);
    CHECK_THROWS_WITH_AS(c.get("optim.v"), contains("holds no tensor 'optim.v'"), Error);
    // The file rewritten in place after it was verified: refused, not read.
    {
      std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
      f.seekp(-4, std::ios::end);
      f.write("\0\0\0\0", 4);
    }
    struct timespec later[2] = {{0, UTIME_OMIT}, {2'000'000'000, 0}};  // a changed mtime, whatever the clock's grain
    REQUIRE(::utimensat(AT_FDCWD, path.c_str(), later, 0) == 0);
    CHECK_THROWS_WITH_AS(c.get("model.b"), contains("changed after it was verified"), Error);
  }
  CHECK(cpu_backend().allocator().live_bytes() == live);
  // A byte changed in a tensor that a caller would never ask for still fails the read.
  write_checkpoint(path, {{"model.w", Tensor::from_vector(iota(6), {2, 3}, cpu_backend())},
                          {"optim.m", Tensor::from_vector(big, {static_cast<int64_t>(big.size())}, cpu_backend())}},
                   {});
  std::string bytes = slurp(path);
  bytes[bytes.size() - 5 * sizeof(float)] ^= 1;  // within optim.m
  spit(path, bytes);
  CHECK_THROWS_WITH_AS(read_checkpoint(path, false), contains("checksum mismatch"), Error);
}

TEST_CASE("checkpoint: corrupt files fail with an error naming the file and the problem") {
  TempDir tmp;
  const std::string good = tmp / "good.safetensors";
  write_checkpoint(good, small_model(), {{"step", "1"}});
  const std::string bytes = slurp(good);
  const uint64_t n = header_length(bytes);
  const std::string bad = tmp / "bad.safetensors";
  auto check_bad = [&](const std::string& content, const std::string& problem) {
    CAPTURE(problem);
    spit(bad, content);
    CHECK_THROWS_WITH_AS(read_checkpoint(bad), contains("checkpoint " + bad + ": " + problem),
                         Error);
  };

  const size_t data_bytes = bytes.size() - 8 - n;
  check_bad(bytes.substr(0, bytes.size() - 10),
            "truncated: header promises " + std::to_string(data_bytes) + " data bytes, file has " +
                std::to_string(data_bytes - 10));
  check_bad(bytes.substr(0, 5), "truncated: the file has 5 bytes");
  check_bad(bytes.substr(0, 8 + n / 2), "truncated: header length field says " + std::to_string(n));

  std::string flipped = bytes;
  flipped[bytes.size() - 3] ^= 0x10;
  check_bad(flipped, "checksum mismatch");

  std::string json_broken = bytes;
  json_broken[8] = '[';
  check_bad(json_broken, "header: invalid JSON at byte");
  // A byte outside ASCII in the header is quoted as \xNN: the message stays text.
  std::string binary = bytes;
  binary[9] = static_cast<char>(0xff);
  check_bad(binary, "header: invalid JSON at byte");
  try {
    (void)read_checkpoint(bad);
  } catch (const Error& e) {
    const std::string m = e.what();
    CHECK(m.find("\\xff") != std::string::npos);
    CHECK(std::none_of(m.begin(), m.end(), [](char c) { return static_cast<unsigned char>(c) >= 0x80; }));
  }

  std::string too_long = bytes;
  too_long[0] = static_cast<char>(0xff);  // N grows by 255 - (N & 0xff): past the file end
  too_long[1] = static_cast<char>(0x10);
  check_bad(too_long, "truncated: header length field says");
  std::string absurd = bytes;
  absurd[5] = 1;  // 2^40 bytes of header
  check_bad(absurd, "header length field says " + std::to_string(n + (uint64_t{1} << 40)) +
                        " bytes, over the limit");

  std::string f16 = bytes;
  f16.replace(f16.find("\"F32\""), 5, "\"F16\"");
  check_bad(f16, "tensor 'w' has dtype 'F16'");

  const std::string data(24, '\0');
  check_bad(raw_file(R"({"w":{"dtype":"F32","shape":[2,2],"data_offsets":[0,24]}})", data),
            "tensor 'w' has shape [2, 2] (16 bytes of F32) but data_offsets [0, 24] span 24 bytes");
  check_bad(raw_file(R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]},)"
                     R"("b":{"dtype":"F32","shape":[4],"data_offsets":[8,24]}})", data),
            "tensors 'a' [0, 16) and 'b' [8, 24) overlap");
  check_bad(raw_file(R"({"w":{"dtype":"F32","shape":[-1],"data_offsets":[0,24]}})", data),
            "tensor 'w' has shape entry -1");
  check_bad(raw_file(R"({"w":{"dtype":"F32","shape":[6],"data_offsets":[0,24]}})", data),
            "no \"hetrain.format\"");  // valid safetensors, but no checksum to verify
  check_bad(raw_file(R"({"w":{"dtype":"F32","shape":[6],"data_offsets":[0,24]},"w":{}})", data),
            "header: w: duplicate key");
  check_bad(raw_file(std::string(100'000, '[') + std::string(100'000, ']'), data),
            "header: JSON nesting reaches level 65; expected at most 64 levels");
  check_bad(raw_file(R"({"w":{"dtype":"F32","shape":[)" + std::string(5000, '9') +
                         R"(],"data_offsets":[0,24]}})", data),
            "header: invalid JSON: number overflow");
  // Zero elements, but a product of the other dimensions past int64.
  check_bad(raw_file(R"({"w":{"dtype":"F32","shape":[0,4294967296,4294967296],"data_offsets":[0,0]}})", ""),
            "tensor 'w' has shape [0, 4294967296, 4294967296] whose size overflows");
  check_bad(raw_file(R"({"w":{"dtype":"F32","shape":[6],"data_offsets":[0,24]},)"
                     R"("__metadata__":{"hetrain.format":"1","hetrain.crc32":"00000000"}})", data),
            "hetrain.format is '1': written by an older hetrain");

  CHECK_THROWS_WITH_AS(read_checkpoint(tmp / "missing.safetensors"),
                       contains("missing.safetensors: cannot open: No such file"), Error);
}

TEST_CASE("checkpoint dir: keeps the newest K and never touches other files") {
  TempDir tmp;
  CheckpointDir dir(tmp / "checkpoints", 2);
  CHECK(dir.list().empty());  // the directory does not exist yet
  std::vector<std::string> skipped;
  CHECK_FALSE(dir.load_newest_valid(skipped).has_value());

  fs::create_directories(dir.dir());
  // (<checkpoint>.tmp of a step being saved is the writer's own scratch name; a leftover
  // from a crash at another step must survive retention.)
  const std::vector<std::string> others = {"notes.txt", "ckpt-1.safetensors",
                                           "ckpt-00000099.safetensors.tmp",
                                           "ckpt-00000003.safetensors.bak", "ckpt-0000000x.safetensors"};
  for (const std::string& o : others) spit(dir.dir() + "/" + o, "mine: " + o);
  fs::create_directory(dir.dir() + "/ckpt-00000009.safetensors");  // a directory, not a file

  for (int64_t step : {1, 2, 3, 4, 5})
    CHECK(dir.save(step, small_model(static_cast<float>(step))) == dir.path_for(step));
  std::vector<CheckpointFile> files = dir.list();
  REQUIRE(files.size() == 2);
  CHECK(files[0].step == 4);
  CHECK(files[1].step == 5);
  CHECK(fs::path(files[1].path).filename() == "ckpt-00000005.safetensors");
  for (const std::string& o : others) CHECK(slurp(dir.dir() + "/" + o) == "mine: " + o);
  CHECK(fs::is_directory(dir.dir() + "/ckpt-00000009.safetensors"));

  // Saving a lower step (a run resumed from an older checkpoint) never deletes itself,
  // nor the higher steps, which are not of its line.
  dir.save(3, small_model());
  files = dir.list();
  REQUIRE(files.size() == 3);
  CHECK(files[0].step == 3);
  CHECK(files[1].step == 4);
  CHECK(files[2].step == 5);
  CHECK_THROWS_WITH_AS(CheckpointDir(tmp.path, 0), contains("expected at least 1"), Error);
}

TEST_CASE("checkpoint dir: a resume past unreadable newer checkpoints keeps its own newest K and leaves those be") {
  TempDir tmp;
  {
    CheckpointDir first(tmp / "checkpoints", 3);
    for (int64_t step : {10, 20, 30}) first.save(step, small_model(static_cast<float>(step)), {{"step", std::to_string(step)}});
  }
  spit(tmp / "checkpoints/ckpt-00000035.safetensors", "");         // empty
  spit(tmp / "checkpoints/ckpt-00000098.safetensors", "garbage");  // a future left corrupt
  spit(tmp / "checkpoints/ckpt-00000099.safetensors", "garbage");
  CheckpointDir dir(tmp / "checkpoints", 2);
  std::vector<std::string> skipped;
  REQUIRE(dir.load_newest_valid(skipped).has_value());
  CHECK(skipped.size() == 3);
  dir.save(40, small_model(40.f), {{"step", "40"}});
  dir.save(50, small_model(50.f), {{"step", "50"}});
  std::vector<int64_t> steps;
  for (const CheckpointFile& f : dir.list()) steps.push_back(f.step);
  // 10, 20 and 30 went as 40 and 50 came: two readable ones remain, and the three it could
  // not read were neither counted nor deleted.
  CHECK(steps == std::vector<int64_t>{35, 40, 50, 98, 99});
  CHECK(slurp(tmp / "checkpoints/ckpt-00000098.safetensors") == "garbage");
  // Reaching the step of one it passed over: that file moves aside, kept, and the new
  // checkpoint of the step counts (it had replaced the file and stayed uncounted, keep + 1
  // readable checkpoints left).
  dir.save(98, small_model(98.f), {{"step", "98"}});
  steps.clear();
  for (const CheckpointFile& f : dir.list()) steps.push_back(f.step);
  CHECK(steps == std::vector<int64_t>{35, 50, 98, 99});
  CHECK(slurp(tmp / "checkpoints/ckpt-00000098.safetensors.unreadable") == "garbage");
  CHECK(read_checkpoint(tmp / "checkpoints/ckpt-00000098.safetensors").metadata.at("step") == "98");
}

TEST_CASE("checkpoint dir: a resume passes over a directory of a checkpoint's name and a copy of another step, and sets them aside") {
  TempDir tmp;
  {
    CheckpointDir first(tmp / "checkpoints", 3);
    for (int64_t step : {10, 20}) first.save(step, small_model(static_cast<float>(step)), {{"step", std::to_string(step)}});
  }
  std::filesystem::create_directory(tmp / "checkpoints/ckpt-00000030.safetensors");
  // Step 10's checkpoint copied by hand to a later name: resumed, it trained steps 11-20
  // again past step 20's checkpoint and wrote over it.
  std::filesystem::copy_file(tmp / "checkpoints/ckpt-00000010.safetensors", tmp / "checkpoints/ckpt-00000040.safetensors");
  CheckpointDir dir(tmp / "checkpoints", 3);
  std::vector<std::string> skipped;
  const std::optional<Checkpoint> c = dir.load_newest_valid(skipped);
  REQUIRE(c.has_value());
  CHECK(c->metadata.at("step") == "20");
  REQUIRE(skipped.size() == 2);
  CHECK(skipped[0].find("its metadata is of step 10, its name of step 40; expected the step of its name") != std::string::npos);
  CHECK(skipped[1].find("a directory; expected a checkpoint file") != std::string::npos);
  // Reaching their steps, the run moves both aside and writes its own (the directory
  // blocked every save of its step).
  dir.save(30, small_model(30.f), {{"step", "30"}});
  dir.save(40, small_model(40.f), {{"step", "40"}});
  CHECK(std::filesystem::is_directory(tmp / "checkpoints/ckpt-00000030.safetensors.unreadable"));
  CHECK(read_checkpoint(tmp / "checkpoints/ckpt-00000040.safetensors.unreadable").metadata.at("step") == "10");
  CHECK(read_checkpoint(tmp / "checkpoints/ckpt-00000030.safetensors").metadata.at("step") == "30");
  CHECK(read_checkpoint(tmp / "checkpoints/ckpt-00000040.safetensors").metadata.at("step") == "40");
}

TEST_CASE("checkpoint dir: the partial writes a stopped run left are removed, nothing else") {
  TempDir tmp;
  CheckpointDir dir(tmp / "checkpoints", 3);
  CHECK(dir.remove_partial_writes() == 0);  // no directory yet
  dir.save(10, small_model(10.f), {{"step", "10"}});
  spit(tmp / "checkpoints/ckpt-00000020.safetensors.tmp", "half a checkpoint");
  spit(tmp / "checkpoints/ckpt-20.safetensors.tmp", "not of a checkpoint's name");
  spit(tmp / "checkpoints/notes.tmp", "the user's");
  CHECK(dir.remove_partial_writes() == 1);
  CHECK(!std::filesystem::exists(tmp / "checkpoints/ckpt-00000020.safetensors.tmp"));
  CHECK(slurp(tmp / "checkpoints/ckpt-20.safetensors.tmp") == "not of a checkpoint's name");
  CHECK(slurp(tmp / "checkpoints/notes.tmp") == "the user's");
  CHECK(dir.list().size() == 1);
}

TEST_CASE("checkpoint: a changed byte anywhere in the header fails the read") {
  TempDir tmp;
  const std::string good = tmp / "good.safetensors";
  write_checkpoint(good, small_model(), {{"step", "10"}, {"sample_position", "640"}});
  const std::string bytes = slurp(good);
  const uint64_t n = header_length(bytes);
  const std::string bad = tmp / "bad.safetensors";
  // The length field, the tensor table, the metadata (step, data position, the checksum
  // itself) and the padding: a bit flipped anywhere there is caught, by the JSON parser,
  // the table's checks or the checksum.
  size_t cases = 0;
  for (size_t i = 0; i < 8 + n; ++i)
    for (unsigned char mask : {0x01, 0x20, 0x80}) {
      std::string flipped = bytes;
      flipped[i] = static_cast<char>(flipped[i] ^ mask);
      spit(bad, flipped);
      CAPTURE(i);
      CAPTURE(static_cast<int>(mask));
      CHECK_THROWS_AS(read_checkpoint(bad), Error);
      ++cases;
    }
  CHECK(cases == 3 * (8 + n));
  // A change that leaves valid JSON and a consistent table is the checksum's to catch.
  std::string step = bytes;
  step.replace(step.find("\"step\":\"10\""), 11, "\"step\":\"11\"");
  spit(bad, step);
  CHECK_THROWS_WITH_AS(read_checkpoint(bad), contains("checksum mismatch"), Error);
}

TEST_CASE("checkpoint dir: a header-corrupted newest checkpoint falls back to the previous one") {
  TempDir tmp;
  CheckpointDir dir(tmp / "checkpoints", 5);
  for (int64_t step : {10, 20})
    dir.save(step, small_model(static_cast<float>(step)),
             {{"step", std::to_string(step)}, {"sample_position", std::to_string(step * 64)}});
  std::string s20 = slurp(dir.path_for(20));
  s20.replace(s20.find("\"sample_position\":\"1280\""), 24, "\"sample_position\":\"1216\"");
  spit(dir.path_for(20), s20);
  std::vector<std::string> skipped;
  std::optional<Checkpoint> c = dir.load_newest_valid(skipped);
  REQUIRE(c.has_value());
  CHECK(c->metadata.at("step") == "10");
  REQUIRE(skipped.size() == 1);
  CHECK(skipped[0].find(dir.path_for(20) + ": checksum mismatch") != std::string::npos);
}

TEST_CASE("checkpoint dir: a corrupt newest checkpoint falls back to the previous one") {
  TempDir tmp;
  CheckpointDir dir(tmp / "checkpoints", 5);
  for (int64_t step : {10, 20, 30}) dir.save(step, small_model(static_cast<float>(step)), {{"step", std::to_string(step)}});
  std::string s30 = slurp(dir.path_for(30));
  s30[s30.size() - 1] ^= 1;
  spit(dir.path_for(30), s30);
  const std::string s20 = slurp(dir.path_for(20));
  spit(dir.path_for(20), s20.substr(0, s20.size() - 4));

  std::vector<std::string> skipped;
  std::optional<Checkpoint> c = dir.load_newest_valid(skipped);
  REQUIRE(c.has_value());
  CHECK(c->metadata.at("step") == "10");
  CHECK(c->tensors.at("w").to_vector() == iota(6, 10.f));
  REQUIRE(skipped.size() == 2);
  CHECK(skipped[0].find(dir.path_for(30) + ": checksum mismatch") != std::string::npos);
  CHECK(skipped[0].find("; using ckpt-00000010.safetensors") != std::string::npos);
  CHECK(skipped[1].find(dir.path_for(20) + ": truncated") != std::string::npos);

  spit(dir.path_for(10), "garbage");
  skipped.clear();
  CHECK_THROWS_WITH_AS(dir.load_newest_valid(skipped),
                       contains("no valid checkpoint in " + dir.dir()), Error);
  try {
    dir.load_newest_valid(skipped);
  } catch (const Error& e) {
    for (int64_t step : {10, 20, 30}) CHECK(std::string(e.what()).find(dir.path_for(step)) != std::string::npos);
  }
}

TEST_CASE("checkpoint dir: an entry of a checkpoint's name that is no file is named and passed over, never deleted") {
  TempDir tmp;
  CheckpointDir dir(tmp / "checkpoints", 2);
  dir.save(10, small_model(10.f), {{"step", "10"}});
  std::filesystem::create_directory(dir.path_for(30));
  std::filesystem::create_symlink(tmp / "nowhere", dir.path_for(20));
  std::vector<std::string> skipped;
  std::optional<Checkpoint> c = dir.load_newest_valid(skipped);
  REQUIRE(c.has_value());
  CHECK(c->metadata.at("step") == "10");
  REQUIRE(skipped.size() == 2);
  CHECK(skipped[0] == dir.path_for(30) + ": a directory; expected a checkpoint file; using ckpt-00000010.safetensors");
  CHECK(skipped[1] == dir.path_for(20) + ": a link to nothing; expected a checkpoint file; using ckpt-00000010.safetensors");
  CHECK(dir.list().size() == 1);  // retention and listing see files only
  dir.save(40, small_model(40.f));
  dir.save(50, small_model(50.f));  // keep 2: 10 goes, the directory and the link stay
  CHECK(std::filesystem::is_directory(dir.path_for(30)));
  CHECK(std::filesystem::is_symlink(dir.path_for(20)));
  CHECK_FALSE(std::filesystem::exists(dir.path_for(10)));
  // With no file left, resuming is refused, naming them, rather than starting afresh.
  std::filesystem::remove(dir.path_for(40));
  std::filesystem::remove(dir.path_for(50));
  skipped.clear();
  CHECK_THROWS_WITH_AS(dir.load_newest_valid(skipped), contains(dir.path_for(30) + ": a directory"), Error);
}

TEST_CASE("checkpoint: a full disk (EFBIG) leaves the previous checkpoints byte-for-byte intact") {
  TempDir tmp;
  CheckpointDir dir(tmp / "checkpoints", 2);
  dir.save(10, small_model(10.f));
  dir.save(20, small_model(20.f));
  const std::string before10 = slurp(dir.path_for(10)), before20 = slurp(dir.path_for(20));
  // 64 Ki floats = 256 KiB, well past the limit below.
  std::vector<nn::NamedTensor> big = {{"w", Tensor::from_vector(iota(65536), {256, 256}, cpu_backend())}};

  // Writes past the soft limit fail with EFBIG instead of raising SIGXFSZ (which would
  // kill the test). Both are restored before any check can fail.
  struct rlimit old_limit {};
  REQUIRE(::getrlimit(RLIMIT_FSIZE, &old_limit) == 0);
  struct sigaction ignore {}, old_action {};
  ignore.sa_handler = SIG_IGN;
  REQUIRE(::sigaction(SIGXFSZ, &ignore, &old_action) == 0);
  struct rlimit small = old_limit;
  small.rlim_cur = 16 * 1024;
  REQUIRE(::setrlimit(RLIMIT_FSIZE, &small) == 0);
  std::string same_path_error, new_path_error;
  try {
    dir.save(20, big);  // over an existing checkpoint
  } catch (const Error& e) {
    same_path_error = e.what();
  }
  try {
    dir.save(30, big);  // would have pushed step 10 out of retention
  } catch (const Error& e) {
    new_path_error = e.what();
  }
  ::setrlimit(RLIMIT_FSIZE, &old_limit);
  ::sigaction(SIGXFSZ, &old_action, nullptr);

  CHECK(same_path_error.find(dir.path_for(20)) != std::string::npos);
  CHECK(same_path_error.find("File too large") != std::string::npos);
  CHECK(new_path_error.find(dir.path_for(30)) != std::string::npos);
  CHECK(new_path_error.find("File too large") != std::string::npos);
  CHECK_FALSE(fs::exists(dir.path_for(20) + ".tmp"));
  CHECK_FALSE(fs::exists(dir.path_for(30) + ".tmp"));
  CHECK_FALSE(fs::exists(dir.path_for(30)));
  CHECK(slurp(dir.path_for(10)) == before10);
  CHECK(slurp(dir.path_for(20)) == before20);
  CHECK(std::distance(fs::directory_iterator(dir.dir()), fs::directory_iterator()) == 2);
  CHECK(read_checkpoint(dir.path_for(20)).tensors.at("w").to_vector() == iota(6, 20.f));
}

TEST_CASE("checkpoint: a path under a file fails cleanly") {
  TempDir tmp;
  spit(tmp / "file", "x");
  CHECK_THROWS_WITH_AS(write_checkpoint(tmp / "file/c.safetensors", small_model(), {}),
                       contains("file/c.safetensors: Not a directory"), Error);
}

// Root ignores directory permissions, so as root the attempt runs with the effective uid
// dropped to "nobody" (the real uid stays 0, so it can be restored). Where that is not
// allowed the case cannot run: the process exits 77 and meson's `unit-permissions`
// test reports SKIP. It is checked before anything is created, since exit() skips the
// temporary directory's cleanup.
TEST_CASE("checkpoint: an unwritable directory fails cleanly" * doctest::test_suite("needs-permission-drop")) {
  const bool root = ::geteuid() == 0;
  if (root) {
    if (::seteuid(65534) != 0) {
      std::printf("SKIP: running as root and seteuid(nobody) is refused: %s\n", std::strerror(errno));
      std::fflush(stdout);
      std::exit(77);
    }
    REQUIRE(::seteuid(0) == 0);
  }
  TempDir tmp;
  const std::string dir = tmp / "ro";
  fs::create_directory(dir);
  const std::string path = dir + "/c.safetensors";
  write_checkpoint(path, small_model(1.f), {});
  const std::string before = slurp(path);
  fs::permissions(dir, fs::perms::owner_read | fs::perms::owner_exec);  // 0500

  if (root) REQUIRE(::seteuid(65534) == 0);
  std::string error;
  try {
    write_checkpoint(path, small_model(2.f), {});
  } catch (const Error& e) {
    error = e.what();
  }
  if (root) REQUIRE(::seteuid(0) == 0);
  fs::permissions(dir, fs::perms::owner_all);

  CHECK(error.find(path) != std::string::npos);
  CHECK(error.find("Permission denied") != std::string::npos);
  CHECK_FALSE(fs::exists(path + ".tmp"));
  CHECK(slurp(path) == before);
}

TEST_CASE("checkpoint: load_into copies in place and names every mismatch") {
  TempDir tmp;
  const std::string path = tmp / "ckpt-00000010.safetensors";
  write_checkpoint(path,
                   {{"model.w", Tensor::from_vector(iota(6, 1.f), {2, 3}, cpu_backend())},
                    {"model.ids", Tensor::from_ints({7, 8}, {2}, cpu_backend())},
                    {"optim.m", Tensor::from_vector(iota(6), {2, 3}, cpu_backend())}},
                   {});
  Checkpoint c = read_checkpoint(path);

  Tensor w = Tensor::zeros({2, 3}, cpu_backend());
  Tensor ids = Tensor::from_ints({0, 0}, {2}, cpu_backend());
  float* storage = w.data();
  load_into({{"model.w", w}, {"model.ids", ids}}, c, "model.");  // optim.* is not the model's
  CHECK(w.data() == storage);  // same storage: the parameter keeps its identity
  CHECK(w.to_vector() == iota(6, 1.f));
  CHECK(ids.to_ints() == std::vector<int32_t>{7, 8});

  // A strided view receives the values through its strides.
  Tensor base = Tensor::zeros({3, 2}, cpu_backend());
  load_into({{"model.w", transpose(base, 0, 1)}, {"model.ids", ids}}, c, "model.");
  CHECK(base.to_vector() == std::vector<float>{1, 4, 2, 5, 3, 6});

  const std::string head = "checkpoint ckpt-00000010.safetensors does not match the model: ";
  Tensor untouched = Tensor::zeros({3, 2}, cpu_backend());
  CHECK_THROWS_WITH_AS(load_into({{"model.w", untouched}, {"model.ids", ids}}, c, "model."),
                       contains(head + "tensor 'model.w' has shape [2, 3] in the checkpoint and [3, 2] in the model"),
                       Error);
  CHECK(untouched.to_vector() == std::vector<float>(6, 0.f));  // nothing copied on failure
  CHECK_THROWS_WITH_AS(load_into({{"model.w", w}, {"model.ids", Tensor::zeros({2}, cpu_backend())}}, c, "model."),
                       contains("tensor 'model.ids' is int32 in the checkpoint and float32 in the model"),
                       Error);
  CHECK_THROWS_WITH_AS(load_into({{"model.w", w}, {"model.ids", ids}, {"model.b", Tensor::zeros({3}, cpu_backend())}}, c, "model."),
                       contains("tensor 'model.b' of shape [3] is missing from the checkpoint"), Error);
  CHECK_THROWS_WITH_AS(load_into({{"model.w", w}}, c, "model."),
                       contains("tensor 'model.ids' of shape [2] is in the checkpoint but not in the model"),
                       Error);
  // Another model: the first eight mismatches, a count of the rest, and why.
  std::vector<nn::NamedTensor> other;
  for (int i = 0; i < 12; ++i) other.emplace_back("model.x" + std::to_string(i), Tensor::zeros({1}, cpu_backend()));
  CHECK_THROWS_WITH_AS(load_into(other, c, "model."),
                       contains("tensor 'model.x7' of shape [1] is missing from the checkpoint; and 6 more of 14 "
                                "mismatches (none of the model's tensors is in it: it holds another model)"),
                       Error);
  // Without a prefix every tensor in the file must be accounted for.
  CHECK_THROWS_WITH_AS(load_into({{"model.w", w}, {"model.ids", ids}}, c),
                       contains("tensor 'optim.m'"), Error);
}
