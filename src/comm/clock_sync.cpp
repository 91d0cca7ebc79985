#include "comm/clock_sync.h"

#include "core/error.h"

namespace ht::comm {

namespace {

constexpr int kClockTag = 9201;

}  // namespace

double clock_seconds(Clock::time_point t) { return std::chrono::duration<double>(t.time_since_epoch()).count(); }

std::vector<ClockOffset> clock_offsets(Communicator& comm, int rounds, Timeout timeout) {
  HT_CHECK(rounds >= 1, "clock_offsets: ", rounds, " rounds; expected at least 1");
  if (comm.rank() != 0) {
    for (int i = 0; i < rounds; ++i) {
      char ping = 0;
      Request r = comm.irecv_bytes(&ping, 1, 0, kClockTag);
      // The first ping may come after rank 0 has timed the ranks before this one: wait for
      // it as any wait does. The rest follow at once: take them without sleeping.
      if ((i == 0 ? r.wait(timeout) : r.spin(timeout)) != WaitStatus::done)
        fail_as<PeerTimeout>(peer_timeout_message(comm.world_rank(comm.rank()), {comm.world_rank(0)},
                                                  "rank 0's clock round trip", timeout));
      const double t = clock_seconds();
      comm.send_bytes(&t, sizeof t, 0, kClockTag, timeout, "rank 0 to take this rank's clock reading");
    }
    return {};
  }
  std::vector<ClockOffset> out(static_cast<size_t>(comm.size()));
  for (int peer = 1; peer < comm.size(); ++peer) {
    ClockOffset& o = out[static_cast<size_t>(peer)];
    for (int i = 0; i < rounds; ++i) {
      char ping = 0;
      double t = 0;
      Request r = comm.irecv_bytes(&t, sizeof t, peer, kClockTag);
      const double a = clock_seconds();
      comm.send_bytes(&ping, 1, peer, kClockTag, timeout, "the clock round trip");
      if (r.spin(timeout) != WaitStatus::done)
        fail_as<PeerTimeout>(peer_timeout_message(comm.world_rank(0), {comm.world_rank(peer)},
                                                  "the clock round trip's answer", timeout));
      const double b = clock_seconds();
      if (i == 0 || (b - a) / 2 < o.error_s) o = {(a + b) / 2 - t, (b - a) / 2};
    }
  }
  return out;
}

}  // namespace ht::comm
