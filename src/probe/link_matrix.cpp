#include "probe/link_matrix.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>

#include "core/error.h"
#include "core/wall_time.h"

namespace ht::probe {

namespace {

using Clock = std::chrono::steady_clock;
constexpr int kPingTag = 9101, kBulkTag = 9102, kAckTag = 9103;

// Receives by spinning on the request: a timed round trip must not include the
// communicator's backoff sleeps.
void spin_recv(comm::Communicator& c, void* data, size_t bytes, int peer, int tag,
               const LinkProbeOptions& o) {
  comm::Request r = c.irecv_bytes(data, bytes, peer, tag);
  HT_CHECK(r.spin(std::chrono::duration<double>(o.round_timeout_s)) == comm::WaitStatus::done, "probe: rank ",
           peer, " did not answer within ", o.round_timeout_s, " s; expected every rank to take part in the link probe");
}

// One pair: `me` leads (sends first) when it is the lower rank. Returns (one-way
// latency, bandwidth) as measured by the leader; the follower returns zeros.
std::pair<double, double> ping_pong(comm::Communicator& c, int peer, bool lead,
                                    const LinkProbeOptions& o) {
  char byte = 0;
  std::vector<double> rtts;
  for (int i = 0; i < o.pings + 1; ++i) {  // the first round trip warms the path up
    if (lead) {
      auto t0 = Clock::now();
      c.send_bytes(&byte, 1, peer, kPingTag, comm::Timeout(o.round_timeout_s), "the link probe's ping");
      spin_recv(c, &byte, 1, peer, kPingTag, o);
      if (i > 0) rtts.push_back(seconds_since(t0));
    } else {
      spin_recv(c, &byte, 1, peer, kPingTag, o);
      c.send_bytes(&byte, 1, peer, kPingTag, comm::Timeout(o.round_timeout_s), "the link probe's ping");
    }
  }
  std::vector<char> bulk(static_cast<size_t>(o.bulk_bytes));
  std::vector<double> bulk_times;
  for (int i = 0; i < o.bulk_repeats; ++i) {
    if (lead) {
      auto t0 = Clock::now();
      c.send_bytes(bulk.data(), bulk.size(), peer, kBulkTag, comm::Timeout(o.round_timeout_s), "the link probe's bulk message");
      spin_recv(c, &byte, 1, peer, kAckTag, o);
      bulk_times.push_back(seconds_since(t0));
    } else {
      spin_recv(c, bulk.data(), bulk.size(), peer, kBulkTag, o);
      c.send_bytes(&byte, 1, peer, kAckTag, comm::Timeout(o.round_timeout_s), "the link probe's acknowledgement");
    }
  }
  if (!lead) return {0.0, 0.0};
  // Minimums, not means: on a shared host a round trip is only ever slowed down by the
  // scheduler, so the fastest one is the link's own figure.
  double rtt = *std::min_element(rtts.begin(), rtts.end());
  double bulk_rtt = *std::min_element(bulk_times.begin(), bulk_times.end());
  // The bulk round trip is one large message out and one tiny one back: subtract a
  // small-message round trip to leave the transfer itself. When noise swamps that
  // difference, the whole bulk round trip gives a lower bound instead.
  double transfer = bulk_rtt - rtt;
  if (transfer < 0.1 * bulk_rtt) transfer = bulk_rtt;
  return {rtt / 2, static_cast<double>(o.bulk_bytes) / transfer};
}

}  // namespace

std::vector<std::vector<std::pair<int, int>>> pairing_rounds(int n) {
  std::vector<std::vector<std::pair<int, int>>> rounds;
  if (n < 2) return rounds;
  int m = n % 2 ? n + 1 : n;  // an odd count gets a phantom rank m - 1 (a bye)
  std::vector<int> ring(m);
  for (int i = 0; i < m; ++i) ring[i] = i;
  for (int r = 0; r < m - 1; ++r) {
    std::vector<std::pair<int, int>> round;
    for (int i = 0; i < m / 2; ++i) {
      int a = ring[i], b = ring[m - 1 - i];
      if (a < n && b < n) round.emplace_back(std::min(a, b), std::max(a, b));
    }
    rounds.push_back(round);
    // Circle method: keep ring[0], rotate the rest by one.
    std::rotate(ring.begin() + 1, ring.end() - 1, ring.end());
  }
  return rounds;
}

LinkMatrix measure_links(comm::Communicator& c, const LinkProbeOptions& o) {
  int n = c.size(), me = c.rank();
  LinkMatrix m;
  m.latency_s.assign(n, std::vector<double>(n, 0.0));
  m.bandwidth_bytes_per_s.assign(n, std::vector<double>(n, 0.0));
  // Each rank records the pairs it led; the rows are then shared with every rank.
  std::vector<std::pair<int, std::pair<double, double>>> mine;
  comm::Timeout t = std::chrono::duration<double>(o.round_timeout_s);
  for (const auto& round : pairing_rounds(n)) {
    for (auto [a, b] : round) {
      if (me != a && me != b) continue;
      bool lead = me == a;
      auto r = ping_pong(c, lead ? b : a, lead, o);
      if (lead) mine.push_back({b, r});
    }
    HT_CHECK(c.barrier(t) == comm::WaitStatus::done, "probe: a rank did not finish a link-probe "
             "round within ", o.round_timeout_s, " s; expected all ranks to keep pace");
  }
  std::string row;
  for (auto& [peer, r] : mine) {
    char line[96];
    std::snprintf(line, sizeof line, "%d %.9e %.9e\n", peer, r.first, r.second);
    row += line;
  }
  std::vector<std::string> rows = c.allgather(row, t, "the link probe's rows");
  for (int a = 0; a < n; ++a) {
    const char* p = rows[a].c_str();
    int peer;
    double lat, bw;
    int used;
    while (std::sscanf(p, "%d %lf %lf\n%n", &peer, &lat, &bw, &used) == 3) {
      m.latency_s[a][peer] = m.latency_s[peer][a] = lat;
      m.bandwidth_bytes_per_s[a][peer] = m.bandwidth_bytes_per_s[peer][a] = bw;
      p += used;
    }
  }
  return m;
}

}  // namespace ht::probe
