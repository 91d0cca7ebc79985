#include "core/thread_pool.h"

#include <atomic>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

namespace ht {

namespace {

thread_local bool t_inside_task = false;

// One parallel call. Workers hold it by shared_ptr, so a worker that wakes late (after
// the call returned) still sees a valid job with no chunk left, and never the next job.
struct Job {
  const std::function<void(int64_t)>* fn;
  int64_t chunks;
  std::atomic<int64_t> next{0}, done{0};
};

class Pool {
 public:
  ~Pool() { resize(1); }

  int threads() {
    std::lock_guard<std::mutex> l(mu_);
    return static_cast<int>(workers_.size()) + 1;
  }

  void resize(int n) {
    std::lock_guard<std::mutex> run_lock(run_mu_);  // never while a job is running
    stop_workers();
    std::lock_guard<std::mutex> l(mu_);
    stopping_ = false;
    for (int i = 1; i < n; ++i) workers_.emplace_back([this] { work(); });
  }

  void run(int64_t chunks, const std::function<void(int64_t)>& fn) {
    std::lock_guard<std::mutex> run_lock(run_mu_);  // one job at a time
    auto job = std::make_shared<Job>();
    job->fn = &fn;
    job->chunks = chunks;
    {
      std::lock_guard<std::mutex> l(mu_);
      current_ = job;
      ++generation_;
    }
    wake_.notify_all();
    // The caller works too, and waits only for chunks that others have started: with
    // busy cores a worker may wake late, and then simply finds nothing left to do.
    take_chunks(*job);
    std::unique_lock<std::mutex> l(mu_);
    done_.wait(l, [&] { return job->done.load() == job->chunks; });
    current_.reset();
  }

 private:
  void take_chunks(Job& job) {
    t_inside_task = true;
    for (int64_t c; (c = job.next.fetch_add(1)) < job.chunks;) {
      (*job.fn)(c);
      if (job.done.fetch_add(1) + 1 == job.chunks) {
        std::lock_guard<std::mutex> l(mu_);  // pairs with the caller's predicate check
        done_.notify_all();
      }
    }
    t_inside_task = false;
  }

  void work() {
    uint64_t seen = 0;
    for (;;) {
      std::shared_ptr<Job> job;
      {
        std::unique_lock<std::mutex> l(mu_);
        wake_.wait(l, [&] { return stopping_ || generation_ != seen; });
        if (stopping_) return;
        seen = generation_;
        job = current_;
      }
      if (job) take_chunks(*job);
    }
  }

  void stop_workers() {
    {
      std::lock_guard<std::mutex> l(mu_);
      stopping_ = true;
    }
    wake_.notify_all();
    for (auto& w : workers_) w.join();
    workers_.clear();
  }

  std::mutex run_mu_, mu_;
  std::condition_variable wake_, done_;
  std::vector<std::thread> workers_;
  std::shared_ptr<Job> current_;
  uint64_t generation_ = 0;
  bool stopping_ = false;
};

Pool& pool() {
  static Pool p;
  return p;
}

}  // namespace

void parallel_chunks(int64_t chunks, const std::function<void(int64_t)>& fn) {
  if (chunks <= 0) return;
  if (chunks == 1 || t_inside_task || pool().threads() == 1) {
    for (int64_t c = 0; c < chunks; ++c) fn(c);
    return;
  }
  pool().run(chunks, fn);
}

int pool_threads() { return pool().threads(); }
void set_pool_threads(int n) { pool().resize(n < 1 ? 1 : n); }

}  // namespace ht
