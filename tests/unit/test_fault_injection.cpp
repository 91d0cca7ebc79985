// --inject specs: what each kind parses to, which steps it acts in, and a one-line error
// naming the spec, the field, the value and what was expected for each kind of bad spec.
#include <doctest/doctest.h>

#include "config/config.h"
#include "runtime/fault_injection.h"
#include "tests/unit/error_message.h"

using namespace ht::runtime;

TEST_CASE("fault specs parse to their kind, rank, step and amount") {
  const Fault stall = parse_fault("stall:rank=2,at=10,for=5.5");
  CHECK(stall.kind == FaultKind::stall);
  CHECK(stall.rank == 2);
  CHECK(stall.at == 10);
  CHECK(stall.seconds == 5.5);
  const Fault nan = parse_fault("nan:at=3,rank=1");  // fields in any order; steps defaults to 1
  CHECK(nan.kind == FaultKind::nan);
  CHECK(nan.rank == 1);
  CHECK(nan.at == 3);
  CHECK(nan.steps == 1);
  CHECK(parse_fault("nan:rank=1,at=10,steps=11").steps == 11);
  const Fault slow = parse_fault("slow:rank=0,at=1,factor=2.5");
  CHECK(slow.kind == FaultKind::slow);
  CHECK(slow.factor == 2.5);
  CHECK(slow.spec == "slow:rank=0,at=1,factor=2.5");
  const Fault scale = parse_fault("scale:rank=3,at=7,factor=1000,steps=2");
  CHECK(scale.kind == FaultKind::scale);
  CHECK(scale.factor == 1000);
  CHECK(scale.steps == 2);
  CHECK(parse_fault("scale:rank=3,at=7,factor=50").steps == 1);
  // A stall at step 0 is one before MPI start-up (stall_before_start), never in a step.
  const std::vector<Fault> at_start = {parse_fault("stall:rank=1,at=0,for=3")};
  CHECK(at_start[0].at == 0);
  FaultInjector injector(at_start, 1);
  for (int64_t step = 1; step <= 3; ++step) {
    injector.begin_step(step);
    CHECK(injector.take_stall() == 0);
  }
}

TEST_CASE("a fault acts on its rank in its steps only") {
  const std::vector<Fault> faults = {parse_fault("stall:rank=1,at=4,for=2"), parse_fault("nan:rank=1,at=10,steps=3"),
                                     parse_fault("slow:rank=1,at=6,factor=3"), parse_fault("nan:rank=0,at=1")};
  FaultInjector one(faults, 1);
  std::vector<int64_t> stalled, poisoned, slowed;
  for (int64_t step = 1; step <= 15; ++step) {
    one.begin_step(step);
    if (one.take_stall() > 0) stalled.push_back(step);
    if (one.poison_gradient()) poisoned.push_back(step);
    if (one.slow_factor() > 1) slowed.push_back(step);
    CHECK(one.gradient_scale() == 1);
  }
  CHECK(stalled == std::vector<int64_t>{4});
  CHECK(poisoned == std::vector<int64_t>{10, 11, 12});
  CHECK(slowed == std::vector<int64_t>{6, 7, 8, 9, 10, 11, 12, 13, 14, 15});
  // A bounded slow-down (a card that throttles and recovers): steps 3..5 only, and two
  // at once multiply.
  FaultInjector bounded({parse_fault("slow:rank=2,at=3,factor=4,steps=3"), parse_fault("slow:rank=2,at=5,factor=2")}, 2);
  std::vector<double> factors;
  for (int64_t step = 1; step <= 7; ++step) {
    bounded.begin_step(step);
    factors.push_back(bounded.slow_factor());
  }
  CHECK(factors == std::vector<double>{1, 1, 4, 4, 8, 2, 2});
  one.begin_step(4);
  CHECK(one.take_stall() == 0);  // slept once, at step 4
  // Under local a job step may run no executor step on this rank: a stall due then is
  // slept at the next one that does, once; one before a resumed run's first step never.
  FaultInjector later(faults, 1);
  later.begin_step(3);
  later.begin_step(4);  // no step run: nothing taken
  later.begin_step(5);
  CHECK(later.take_stall() == 2);
  CHECK(later.take_stall() == 0);
  later.begin_step(6);
  CHECK(later.take_stall() == 0);
  FaultInjector resumed(faults, 1);
  resumed.begin_step(10);
  CHECK(resumed.take_stall() == 0);
  FaultInjector two(faults, 2);
  CHECK(two.empty());
  two.begin_step(10);
  CHECK(!two.poison_gradient());
  FaultInjector scaled({parse_fault("scale:rank=0,at=3,factor=10,steps=2"), parse_fault("scale:rank=0,at=4,factor=3")}, 0);
  std::vector<double> scales;
  for (int64_t step = 1; step <= 5; ++step) {
    scaled.begin_step(step);
    scales.push_back(scaled.gradient_scale());
  }
  CHECK(scales == std::vector<double>{1, 1, 10, 30, 1});
}

TEST_CASE("bad fault specs are one-line errors naming the spec, field, value and expectation") {
  struct Case {
    const char* spec;
    const char* message;
  };
  const Case cases[] = {
      {"wobble:rank=1,at=2", "fault wobble:rank=1,at=2: unknown kind 'wobble'; expected stall, nan, slow or scale"},
      {"stall:rank=1,at=2", "fault stall:rank=1,at=2: missing field 'for'; expected stall to give for=..."},
      {"nan:at=2", "fault nan:at=2: missing field 'rank'"},
      {"scale:rank=1,at=2", "fault scale:rank=1,at=2: missing field 'factor'; expected scale to give factor=..."},
      {"nan", "fault nan: missing field "},
      {"stall:rank=1,at=2,for=-1", "fault stall:rank=1,at=2,for=-1: for=-1 is out of range; expected seconds from 0 to 1e6"},
      {"stall:rank=1,at=2,for=1e308", "fault stall:rank=1,at=2,for=1e308: for=1e308 is out of range; expected seconds from 0 to 1e6"},
      {"slow:rank=1,at=2,factor=2,steps=99999999999999999999",
       "fault slow:rank=1,at=2,factor=2,steps=99999999999999999999: steps=99999999999999999999 is out of range; "
       "expected an integer from 1 to 9223372036854775807"},
      {"slow:rank=1,at=2,factor=0.5",
       "fault slow:rank=1,at=2,factor=0.5: factor=0.5 is out of range; expected a factor from 1 to 1e6"},
      {"slow:rank=1,at=2,factor=2e6", "fault slow:rank=1,at=2,factor=2e6: factor=2e6 is out of range; expected a factor from 1 to 1e6"},
      {"slow:rank=1,at=2,factor=fast", "factor=fast is not a number; expected a factor from 1 to 1e6"},
      {"nan:rank=-1,at=2", "rank=-1 is out of range; expected at least 0"},
      {"nan:rank=1,at=0", "at=0 is out of range; expected at least 1"},
      {"nan:rank=1,at=2,steps=0", "steps=0 is out of range; expected at least 1"},
      {"nan:rank=1,at=2x", "at=2x is not an integer"},
      {"nan:rank=1,at=2,for=3", "unknown field 'for' for nan; expected at, rank, steps"},
      {"nan:rank=1,rank=2,at=2", "field 'rank' is given twice"},
      {"nan:rank=1,,at=2", "field '' is not key=value"},
      {"nan:rank=99999999999,at=2", "rank=99999999999 is out of range"},
  };
  for (const Case& c : cases) {
    CAPTURE(c.spec);
    std::string m;
    try {
      parse_fault(c.spec);
      FAIL_CHECK("no error");
    } catch (const ht::config::ConfigError& e) {  // the CLI's exit status 2
      m = e.what();
    }
    CHECK_MESSAGE(contains(m, c.message), m);
    CHECK(m.find('\n') == std::string::npos);
  }
}

TEST_CASE("a fault's rank must be one of the job's") {
  const std::vector<Fault> faults = {parse_fault("stall:rank=3,at=1,for=1")};
  check_fault_ranks(faults, 4);
  CHECK(error_of([&] { check_fault_ranks(faults, 3); }) ==
        "fault stall:rank=3,at=1,for=1: rank=3 is out of range; expected a rank in [0, 2] of this 3-rank job");
}
