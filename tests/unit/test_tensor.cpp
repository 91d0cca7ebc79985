// Tensors, views and the allocator.
#include <doctest/doctest.h>

#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/threads.h"
#include "ops/ops.h"

using namespace ht;

namespace {
std::vector<float> iota(int n) {
  std::vector<float> v(n);
  for (int i = 0; i < n; ++i) v[i] = static_cast<float>(i);
  return v;
}
}  // namespace

TEST_CASE("tensor: views share storage and follow their strides") {
  Tensor x = Tensor::from_vector(iota(24), {2, 3, 4}, cpu_backend());
  Tensor t = transpose(x, 0, 2);  // (4, 3, 2)
  CHECK(t.same_storage(x));
  CHECK(t.shape() == Shape{4, 3, 2});
  CHECK(t.strides() == Strides{1, 4, 12});
  CHECK_FALSE(t.is_contiguous());
  std::vector<float> v = t.to_vector();
  CHECK(v[1] == 12.f);  // t[0][0][1] = x[1][0][0]
  CHECK(v[2] == 4.f);   // t[0][1][0] = x[0][1][0]

  Tensor s = slice(x, 2, 1, 3);  // (2, 3, 2)
  CHECK(s.same_storage(x));
  CHECK(s.offset() == 1);
  CHECK(s.to_vector() == std::vector<float>{1, 2, 5, 6, 9, 10, 13, 14, 17, 18, 21, 22});

  Tensor e = expand(Tensor::from_vector({1, 2, 3}, {3, 1}, cpu_backend()), {2, 3, 4});
  CHECK(e.strides() == Strides{0, 1, 0});
  CHECK(e.to_vector()[5] == 2.f);

  Tensor r = reshape(x, {6, 4});
  CHECK(r.same_storage(x));  // dense: a view, no copy
  Tensor rt = reshape(t, {24});
  CHECK_FALSE(rt.same_storage(x));  // strided: copied
  CHECK(rt.to_vector()[1] == 12.f);
  CHECK(reshape(x, {-1, 8}).shape() == Shape{3, 8});

  Tensor c = contiguous(t);
  CHECK(c.is_contiguous());
  CHECK(contiguous(x).same_storage(x));  // already dense: no copy
  CHECK(c.to_vector() == t.to_vector());
}

TEST_CASE("tensor: permute round-trips and int32 tensors keep their values") {
  Tensor x = Tensor::from_vector(iota(24), {2, 3, 4}, cpu_backend());
  Tensor p = permute(permute(x, {1, 2, 0}), {2, 0, 1});
  CHECK(p.shape() == x.shape());
  CHECK(p.to_vector() == x.to_vector());
  Tensor ids = Tensor::from_ints({3, -1, 7}, {3}, cpu_backend());
  CHECK(ids.dtype() == DType::i32);
  CHECK(ids.to_ints() == std::vector<int32_t>{3, -1, 7});
}

TEST_CASE("allocator: live and peak bytes, reuse, and the cap") {
  Allocator& a = cpu_backend().allocator();
  size_t base = a.live_bytes();
  a.reset_peak();
  {
    Tensor x = Tensor::zeros({1000}, cpu_backend());  // 4000 bytes, rounded to 4032
    CHECK(a.live_bytes() == base + 4032);
    Tensor y = Tensor::zeros({1000}, cpu_backend());
    CHECK(a.peak_bytes() >= base + 2 * 4032);
  }
  CHECK(a.live_bytes() == base);

  a.set_cap(base + 20000);
  Tensor ok = Tensor::zeros({1000}, cpu_backend());
  try {
    Tensor too_big = Tensor::zeros({4000}, cpu_backend());
    FAIL("expected OutOfMemory");
  } catch (const OutOfMemory& e) {
    std::string m = e.what();
    CHECK(m.find("requested 16000 bytes") != std::string::npos);
    CHECK(m.find("in use") != std::string::npos);
    CHECK(m.find("cap of") != std::string::npos);
  }
  try {
    Tensor x = Tensor::full({2000}, 1.f, cpu_backend());
    (void)add(x, x);  // the op's output no longer fits
    FAIL("expected OutOfMemory");
  } catch (const OutOfMemory& e) {
    CHECK(std::string(e.what()).rfind("add:", 0) == 0);
  }
  a.set_cap(0);
  CHECK(a.cap() == 0);
}

TEST_CASE("allocator: host staging is outside the cap and the counts") {
  Allocator& a = cpu_backend().allocator();
  const size_t base = a.live_bytes();
  a.set_cap(base + 20000);
  {
    Tensor staged;
    {
      Allocator::HostStaging staging;
      staged = Tensor::full({100000}, 2.f, cpu_backend());  // 400 KB, far past the cap
    }
    CHECK(a.live_bytes() == base);
    CHECK(staged.to_vector()[99999] == 2.f);
    CHECK_THROWS_AS(Tensor::zeros({100000}, cpu_backend()), OutOfMemory);  // the guard has ended
  }
  CHECK(a.live_bytes() == base);
  a.set_cap(0);
}

TEST_CASE("allocator: freed blocks are reused; staged blocks go straight back") {
  int raw_allocs = 0, raw_frees = 0;
  std::vector<std::vector<char>> blocks;
  {
    Allocator a(
        "counting", [&](size_t n) { ++raw_allocs; return blocks.emplace_back(n).data(); },
        [&](void*) { ++raw_frees; });
    void* p = a.allocate(4000, "test");
    a.deallocate(p, 4000);
    CHECK(a.allocate(4000, "test") == p);  // kept for the next step, same rounded size
    CHECK(raw_allocs == 1);
    CHECK(raw_frees == 0);
    void* s = nullptr;
    {
      Allocator::HostStaging staging;
      s = a.allocate(4000, "test");  // not taken from the cache, not put back into it
    }
    CHECK(s != p);
    CHECK(raw_allocs == 2);
    a.deallocate(s, 4000);
    CHECK(raw_frees == 1);
    a.deallocate(p, 4000);
    CHECK(raw_frees == 1);  // cached
  }
  CHECK(raw_frees == 2);  // the destructor frees the cache
}

TEST_CASE("allocator: a cached block serves a request up to a quarter smaller; a cap counts the whole block, up to an allowance") {
  int raw_allocs = 0;
  std::vector<std::vector<char>> blocks;
  Allocator a("counting", [&](size_t n) { ++raw_allocs; return blocks.emplace_back(n).data(); }, [](void*) {});
  void* big = a.allocate(4096, "test");
  a.deallocate(big, 4096);
  // 3300 rounds to 3328, and 4096 <= 3328 + 3328 / 4: the cached block serves it.
  void* q = a.allocate(3300, "test");
  CHECK(q == big);
  CHECK(raw_allocs == 1);
  CHECK(a.live_bytes() == 3328);  // the request's bytes, as the planner counts them
  a.deallocate(q, 3300);          // back to the cache as the whole block
  // 3000 rounds to 3008, and 4096 > 3008 + 752: too large, a new block.
  void* r = a.allocate(3000, "test");
  CHECK(r != big);
  CHECK(raw_allocs == 2);
  CHECK(a.allocate(4096, "test") == big);  // still whole: it serves its own size again
  a.deallocate(big, 4096);
  a.deallocate(r, 3000);
  CHECK(a.live_bytes() == 0);

  // Under a cap the blocks' bytes beyond their requests count, up to a 64th of the cap
  // (Allocator::slack_allowance): at 48 KiB, 768 bytes. 3328 asked takes the 4096 block
  // (768 beyond); 2752 asked then does not take the cached 3008 block (256 more beyond)
  // but a block of its own. Requests up to the cap less the allowance fit, and no more.
  a.set_cap(49152);
  REQUIRE(Allocator::slack_allowance(49152) == 768);
  q = a.allocate(3300, "test");
  CHECK(q == big);
  void* own = a.allocate(2700, "test");
  CHECK(own != r);
  CHECK(raw_allocs == 3);
  void* rest = nullptr;
  CHECK_NOTHROW(rest = a.allocate(49152 - 768 - 3328 - 2752, "test"));
  CHECK_THROWS_AS(a.allocate(64, "test"), OutOfMemory);
  if (rest) a.deallocate(rest, 49152 - 768 - 3328 - 2752);
  a.deallocate(own, 2700);
  a.deallocate(q, 3300);
  a.set_cap(0);
  CHECK(a.live_bytes() == 0);
}

TEST_CASE("allocator: a re-split's changing batch reuses blocks; only a batch larger than every earlier one adds any") {
  int raw_allocs = 0;
  std::vector<std::vector<char>> blocks;
  Allocator a("counting", [&](size_t n) { ++raw_allocs; return blocks.emplace_back(n).data(); }, [](void*) {});
  const std::vector<size_t> widths = {784, 512, 512, 10};  // a step's activations per sample
  uint32_t x = 12345;
  size_t largest = 0;
  int new_largest = 0, distinct = 0;
  std::vector<bool> seen(200, false);
  for (int step = 0; step < 200; ++step) {
    x = x * 1664525u + 1013904223u;
    const size_t batch = 150 + (x >> 16) % 31;  // 150..180: every block serves them all once large enough
    if (batch > largest) {
      largest = batch;
      ++new_largest;
    }
    if (!seen[batch]) {
      seen[batch] = true;
      ++distinct;
    }
    std::vector<void*> live;
    for (size_t w : widths) live.push_back(a.allocate(batch * w * sizeof(float), "test"));
    for (size_t i = 0; i < widths.size(); ++i) a.deallocate(live[i], batch * widths[i] * sizeof(float));
  }
  // Exact sizes only would allocate for every distinct batch (and keep every block).
  CHECK(distinct > 2 * new_largest);
  CHECK(raw_allocs == static_cast<int>(widths.size()) * new_largest);
}

TEST_CASE("tensor: rehome moves the values between host staging and the device, for every handle") {
  Allocator& a = cpu_backend().allocator();
  const size_t base = a.live_bytes();
  Tensor t = Tensor::from_vector({1, 2, 3, 4, 5, 6}, {2, 3}, cpu_backend());
  const Tensor alias = t;  // another handle of the same tensor
  CHECK(a.live_bytes() == base + 64);  // 24 bytes, rounded to 64
  t.rehome(cpu_backend(), true);
  CHECK(a.live_bytes() == base);  // out of the device's counts
  CHECK(a.staged(t.raw()));
  CHECK(alias.same_storage(t));
  CHECK(alias.to_vector() == std::vector<float>{1, 2, 3, 4, 5, 6});
  t.rehome(cpu_backend(), true);  // already there: nothing happens
  CHECK(a.staged(t.raw()));
  a.set_cap(base + 64);  // room for exactly these bytes
  t.rehome(cpu_backend(), false);
  CHECK(a.live_bytes() == base + 64);
  CHECK_FALSE(a.staged(alias.raw()));
  CHECK(alias.to_vector() == std::vector<float>{1, 2, 3, 4, 5, 6});
  CHECK_THROWS_AS(Tensor::zeros({16}, cpu_backend()), OutOfMemory);  // the cap is full
  {
    const Tensor view = permute(t, {1, 0});  // a view made after shares the new storage
    CHECK(view.same_storage(alias));
  }
  t.rehome(cpu_backend(), true);
  CHECK_NOTHROW(Tensor::zeros({16}, cpu_backend()));  // the device has its room back
  a.set_cap(0);
}

TEST_CASE("tensor: move_to puts the values in memory that another keeps, for every handle, outside the counts") {
  Allocator& a = cpu_backend().allocator();
  const size_t base = a.live_bytes();
  bool released = false;
  {
    std::shared_ptr<float> memory(new float[8]{9, 9, 9, 9, 9, 9, 7, 7}, [&released](float* p) {
      released = true;
      delete[] p;
    });
    Tensor t = Tensor::from_vector({1, 2, 3, 4, 5, 6}, {3, 2}, cpu_backend());
    const Tensor alias = t;
    t.move_to(memory.get(), memory, true);
    CHECK(a.live_bytes() == base);  // the allocator's block went back
    CHECK(alias.data() == memory.get());
    CHECK(memory.get()[5] == 6);
    CHECK(memory.get()[6] == 7);  // only the tensor's bytes
    memory.get()[0] = -1;  // what another process writes, every handle sees
    CHECK(alias.to_vector() == std::vector<float>{-1, 2, 3, 4, 5, 6});
    // Without copying, the tensor takes what the memory holds.
    Tensor u = Tensor::zeros({2}, cpu_backend());
    u.move_to(memory.get() + 6, memory, false);
    CHECK(u.to_vector() == std::vector<float>{7, 7});
    // A strided view copies densely.
    Tensor w = permute(Tensor::from_vector({1, 2, 3, 4}, {2, 2}, cpu_backend()), {1, 0});
    w.move_to(memory.get() + 2, memory, true);
    CHECK(w.is_contiguous());
    CHECK(std::vector<float>(memory.get() + 2, memory.get() + 6) == std::vector<float>{1, 3, 2, 4});
    memory.reset();
    CHECK_FALSE(released);  // the tensors keep it
  }
  CHECK(released);
  CHECK(a.live_bytes() == base);
}

TEST_CASE("threads: explicit request, then OMP_NUM_THREADS, then OPENBLAS_NUM_THREADS") {
  const char* omp = std::getenv("OMP_NUM_THREADS");
  std::string saved = omp ? omp : "";
  setenv("OMP_NUM_THREADS", "3", 1);
  CHECK(resolve_thread_count(5) == 5);
  CHECK(resolve_thread_count() == 3);
  unsetenv("OMP_NUM_THREADS");
  setenv("OPENBLAS_NUM_THREADS", "2", 1);
  CHECK(resolve_thread_count() == 2);
  unsetenv("OPENBLAS_NUM_THREADS");
  CHECK(resolve_thread_count(0, 1000) == 1);  // many ranks per node: never oversubscribe
  setenv("OMP_NUM_THREADS", "lots", 1);
  CHECK_THROWS_WITH_AS(resolve_thread_count(), doctest::Contains("OMP_NUM_THREADS='lots'"),
                       Error);
  if (omp) setenv("OMP_NUM_THREADS", saved.c_str(), 1);
  else unsetenv("OMP_NUM_THREADS");
}
