#include "comm/weighted_allreduce.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <thread>

#include "core/error.h"

namespace ht::comm {

namespace {

// One tag per tensor and round, so no receive depends on the order of another's.
constexpr int kTagBase = 1000;
int tag(size_t tensor, int round) { return kTagBase + static_cast<int>(tensor % 15000) * 2 + round; }

// [offsets[j], offsets[j + 1]) is rank j's part of an n-element tensor.
std::vector<int64_t> parts(int64_t n, const std::vector<double>& weights) {
  const double total = std::accumulate(weights.begin(), weights.end(), 0.0);
  std::vector<int64_t> off{0};
  double before = 0;
  for (double w : weights) {
    before += w;
    off.push_back(std::min<int64_t>(n, std::llround(static_cast<double>(n) * before / total)));
  }
  off.back() = n;
  return off;
}

// Polls every request in turn until all are done. Waiting on them one by one can
// deadlock: a receive is matched only while its own request is tested (probe-based
// receives), so two ranks each waiting on a large send to the other would never match.
// Backs off from polling to sleeps of up to 1 ms, so a throttled rank keeps its quota.
WaitStatus wait_all(std::vector<Request>& requests, Clock::time_point deadline, bool bounded) {
  auto pause = std::chrono::microseconds(0);
  while (!requests.empty()) {
    const size_t before = requests.size();
    std::erase_if(requests, [](Request& r) { return r.test(); });
    if (requests.empty()) break;
    if (bounded && Clock::now() > deadline) return WaitStatus::timed_out;
    if (requests.size() < before) pause = std::chrono::microseconds(0);
    else pause = std::min(std::chrono::microseconds(1000), std::max(std::chrono::microseconds(20), pause * 2));
    std::this_thread::sleep_for(pause);
  }
  return WaitStatus::done;
}

}  // namespace

WaitStatus allreduce_sum_weighted(Communicator& comm, std::vector<Tensor>& tensors,
                                  const std::vector<double>& weights, Timeout timeout) {
  const int p = comm.size(), me = comm.rank();
  HT_CHECK(static_cast<int>(weights.size()) == p, "allreduce_sum_weighted: ", weights.size(),
           " weights for ", p, " ranks; expected one per rank");
  for (double w : weights)
    HT_CHECK(std::isfinite(w) && w > 0, "allreduce_sum_weighted: weight ", w, "; expected > 0");
  for (const Tensor& t : tensors)
    HT_CHECK(t.dtype() == DType::f32 && t.is_contiguous(), "allreduce_sum_weighted: tensors must be ",
             "contiguous float32; got ", dtype_name(t.dtype()), " of shape ", to_string(t.shape()));
  if (p == 1) return WaitStatus::done;
  const Clock::time_point deadline =
      Clock::now() + std::chrono::duration_cast<Clock::duration>(timeout.value_or(std::chrono::duration<double>(0)));
  const bool bounded = timeout.has_value();

  std::vector<std::vector<int64_t>> offsets;
  std::vector<std::vector<std::vector<float>>> incoming(tensors.size());  // [t][peer]
  std::vector<Request> requests;
  for (size_t t = 0; t < tensors.size(); ++t) {
    offsets.push_back(parts(tensors[t].numel(), weights));
    float* data = tensors[t].data();
    const auto& off = offsets.back();
    const int64_t mine = off[me + 1] - off[me];
    incoming[t].resize(static_cast<size_t>(p));
    for (int j = 0; j < p; ++j) {
      if (j == me) continue;
      const int64_t len = off[j + 1] - off[j];
      if (len > 0) requests.push_back(comm.isend_bytes(data + off[j], static_cast<size_t>(len) * 4, j, tag(t, 0)));
      if (mine > 0) {
        auto& buf = incoming[t][static_cast<size_t>(j)];
        buf.resize(static_cast<size_t>(mine));
        requests.push_back(comm.irecv_bytes(buf.data(), buf.size() * 4, j, tag(t, 0)));
      }
    }
  }
  if (wait_all(requests, deadline, bounded) == WaitStatus::timed_out) return WaitStatus::timed_out;

  for (size_t t = 0; t < tensors.size(); ++t) {
    float* data = tensors[t].data();
    const auto& off = offsets[t];
    float* part = data + off[me];
    const int64_t mine = off[me + 1] - off[me];
    for (int j = 0; j < p; ++j)  // in rank order, so every owner adds in the same order
      if (j != me && mine > 0) {
        const float* in = incoming[t][static_cast<size_t>(j)].data();
        for (int64_t i = 0; i < mine; ++i) part[i] += in[i];
      }
    for (int j = 0; j < p; ++j) {
      if (j == me) continue;
      const int64_t len = off[j + 1] - off[j];
      if (mine > 0) requests.push_back(comm.isend_bytes(part, static_cast<size_t>(mine) * 4, j, tag(t, 1)));
      if (len > 0) requests.push_back(comm.irecv_bytes(data + off[j], static_cast<size_t>(len) * 4, j, tag(t, 1)));
    }
  }
  return wait_all(requests, deadline, bounded);
}

}  // namespace ht::comm
