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
    {
      std::lock_guard<std::mutex> l(mu_);
      fn_ = &fn;
      chunks_ = chunks;
      next_.store(0);
      // Every worker takes part in every job, if only to find no chunk left, and the
      // job ends when all have checked out: no worker can still be reading this job's
      // fields when the next job writes them.
      active_ = static_cast<int64_t>(workers_.size());
      ++generation_;
    }
    wake_.notify_all();
    take_chunks();
    std::unique_lock<std::mutex> l(mu_);
    done_.wait(l, [this] { return active_ == 0; });
    fn_ = nullptr;
  }

 private:
  // Runs chunks until none are left.
  void take_chunks() {
    t_inside_task = true;
    for (int64_t c; (c = next_.fetch_add(1)) < chunks_;) (*fn_)(c);
    t_inside_task = false;
  }

  void work() {
    uint64_t seen = 0;
    for (;;) {
      {
        std::unique_lock<std::mutex> l(mu_);
        wake_.wait(l, [&] { return stopping_ || generation_ != seen; });
        if (stopping_) return;
        seen = generation_;
      }
      take_chunks();
      std::lock_guard<std::mutex> l(mu_);
      if (--active_ == 0) done_.notify_all();
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
  const std::function<void(int64_t)>* fn_ = nullptr;
  int64_t chunks_ = 0, active_ = 0;
  std::atomic<int64_t> next_{0};
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
