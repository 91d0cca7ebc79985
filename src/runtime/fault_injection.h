// Fault injection, a testing aid (`hetrain train --inject SPEC`, docs/faults.md): a rank
// stalls, computes slowly or produces a NaN gradient at a given step, so that the bounded
// waits, the deadline and local synchronisation and the bad-node guard can be tested on
// one machine without real faulty hardware.
//
// Specs, one per --inject (steps numbered as metrics.jsonl numbers them, the first is 1):
//   stall:rank=R,at=STEP,for=SECONDS   rank R sleeps SECONDS at the start of step STEP;
//                                      at=0: before MPI start-up (the bounded start, watchdog.h)
//   nan:rank=R,at=STEP[,steps=N]       rank R's gradient holds a NaN in steps STEP..STEP+N-1
//   slow:rank=R,at=STEP,factor=F[,steps=N]  rank R's compute takes F times as long in steps
//                                      STEP..STEP+N-1 (no steps: to the job's end)
//   scale:rank=R,at=STEP,factor=F[,steps=N]  rank R's gradient is F times what it computed in
//                                      steps STEP..STEP+N-1: finite garbage, for the guard's norm check
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace ht::runtime {

// The largest stall (seconds) and slow factor --inject takes: about 11.6 days, and a
// million times slower (past them a sleep's conversion to clock ticks overflows).
inline constexpr double kMaxFaultSeconds = 1e6;
inline constexpr double kMaxFaultFactor = 1e6;

enum class FaultKind { stall, nan, slow, scale };

struct Fault {
  FaultKind kind = FaultKind::stall;
  int rank = 0;
  int64_t at = 1;       // the first step it acts in (1-based, as in metrics.jsonl; a stall's 0: before start-up)
  double seconds = 0;   // stall
  int64_t steps = 1;    // nan, scale, slow: how many consecutive steps (slow: unbounded by default)
  double factor = 1;    // slow, scale: >= 1
  std::string spec;     // as given, for messages
};

// Throws config::ConfigError naming the spec, the field, the value and what was expected.
Fault parse_fault(const std::string& spec);
// Throws config::ConfigError when a fault names a rank outside [0, world_size).
void check_fault_ranks(const std::vector<Fault>& faults, int world_size);
// Sleeps out rank `rank`'s stalls at step 0, before the world is made (so the caller
// passes the launcher's rank: comm::launcher_rank).
void stall_before_start(const std::vector<Fault>& faults, int rank);

// What the faults do to one rank at the current step. begin_step is called once per
// step, before the executor runs it.
class FaultInjector {
 public:
  FaultInjector() = default;
  FaultInjector(std::vector<Fault> faults, int rank);
  bool empty() const { return faults_.empty(); }
  void begin_step(int64_t step);  // 1-based
  // To sleep at the start of the step the executor runs now: the stalls due by this job
  // step that no step has slept yet, each once. Under local a rank's group computes at
  // some job steps only (its inner steps are front-loaded in a round): a stall at a job
  // step with none waits for the group's next inner step, where before it never acted.
  double take_stall() const;
  bool poison_gradient() const { return poison_; }   // a NaN into this step's gradient
  double slow_factor() const { return factor_; }     // 1: full speed
  double gradient_scale() const { return scale_; }   // 1: the gradient as computed

 private:
  std::vector<Fault> faults_;  // this rank's only
  mutable std::vector<bool> slept_;  // per fault: a stall taken (take_stall)
  std::vector<size_t> due_;          // the stalls take_stall would take now
  int64_t first_step_ = -1;          // this run's first step: stalls before it never act
  double factor_ = 1, scale_ = 1;
  bool poison_ = false;
};

}  // namespace ht::runtime
