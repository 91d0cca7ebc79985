#include "runtime/fault_injection.h"

#include <charconv>
#include <chrono>
#include <cmath>
#include <limits>
#include <map>
#include <set>
#include <thread>

#include "config/config.h"
#include "config/spec_fields.h"

namespace ht::runtime {

namespace {

[[noreturn]] void reject(const std::string& spec, const std::string& what) {
  // The spec names the fault; the command line adds the flag that carried it.
  throw config::ConfigError("fault " + config::spec_text(spec, 80) + ": " + what);
}

int64_t int_field(const std::string& spec, const std::string& key, const std::string& text, int64_t min) {
  int64_t v = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  // A whole number past int64's range is a number, out of range, not "not an integer".
  if (ec == std::errc::result_out_of_range && end == text.data() + text.size())
    reject(spec, config::field_text(key, text) + " is out of range; expected an integer from " + std::to_string(min) +
                     " to " + std::to_string(std::numeric_limits<int64_t>::max()));
  if (ec != std::errc() || end != text.data() + text.size())
    reject(spec, config::field_text(key, text) + " is not an integer; expected an integer of at least " +
                     std::to_string(min));
  if (v < min)
    reject(spec, config::field_text(key, text) + " is out of range; expected at least " + std::to_string(min));
  return v;
}

double real_field(const std::string& spec, const std::string& key, const std::string& text, double min,
                  double max, const char* expected) {
  double v = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (ec != std::errc() || end != text.data() + text.size() || !std::isfinite(v))
    reject(spec, config::field_text(key, text) + " is not a number; expected " + expected);
  if (v < min || v > max) reject(spec, config::field_text(key, text) + " is out of range; expected " + expected);
  return v;
}

}  // namespace

Fault parse_fault(const std::string& spec) {
  Fault f;
  f.spec = spec;
  const std::string kind = spec.substr(0, spec.find(':'));
  if (kind == "stall") f.kind = FaultKind::stall;
  else if (kind == "nan") f.kind = FaultKind::nan;
  else if (kind == "slow") f.kind = FaultKind::slow;
  else if (kind == "scale") f.kind = FaultKind::scale;
  else
    reject(spec, "unknown kind '" + config::spec_text(kind) +
                     "'; expected stall, nan, slow or scale (e.g. stall:rank=1,at=10,for=5)");
  const std::map<FaultKind, std::vector<std::string>> allowed = {  // in the order messages list them
      {FaultKind::stall, {"at", "for", "rank"}},
      {FaultKind::nan, {"at", "rank", "steps"}},
      {FaultKind::slow, {"at", "factor", "rank", "steps"}},
      {FaultKind::scale, {"at", "factor", "rank", "steps"}}};
  const std::map<FaultKind, std::set<std::string>> required = {
      {FaultKind::stall, {"rank", "at", "for"}},
      {FaultKind::nan, {"rank", "at"}},
      {FaultKind::slow, {"rank", "at", "factor"}},
      {FaultKind::scale, {"rank", "at", "factor"}}};
  const std::vector<std::string>& keys = allowed.at(f.kind);
  std::string keys_text;
  for (const std::string& k : keys) keys_text += (keys_text.empty() ? "" : ", ") + k;
  // A slow-down lasts to the job's end unless `steps` bounds it (a card that throttles
  // for a while and recovers).
  if (f.kind == FaultKind::slow) f.steps = std::numeric_limits<int64_t>::max();
  std::set<std::string> seen;
  for (const auto& [key, value] : config::spec_fields("fault", spec, keys, keys_text)) {
    seen.insert(key);
    if (key == "rank") {
      const int64_t r = int_field(spec, key, value, 0);
      // Any real job is far smaller; the world's size is checked by check_fault_ranks.
      if (r > (1 << 20))
        reject(spec, config::field_text("rank", value) + " is out of range; expected a rank of this job");
      f.rank = static_cast<int>(r);
    } else if (key == "at") f.at = int_field(spec, key, value, f.kind == FaultKind::stall ? 0 : 1);
    else if (key == "steps") f.steps = int_field(spec, key, value, 1);
    // Bounded: a sleep of 1e308 s overflows its conversion to the clock's ticks and
    // returns at once, so a stall or slowdown past these would silently not happen.
    else if (key == "for") f.seconds = real_field(spec, key, value, 0, kMaxFaultSeconds, "seconds from 0 to 1e6");
    else if (key == "factor") f.factor = real_field(spec, key, value, 1, kMaxFaultFactor, "a factor from 1 to 1e6");
  }
  for (const std::string& k : required.at(f.kind))
    if (!seen.count(k)) reject(spec, "missing field '" + k + "'; expected " + kind + " to give " + k + "=...");
  return f;
}

void stall_before_start(const std::vector<Fault>& faults, int rank) {
  for (const Fault& f : faults)
    if (f.kind == FaultKind::stall && f.at == 0 && f.rank == rank)
      std::this_thread::sleep_for(std::chrono::duration<double>(f.seconds));
}

void check_fault_ranks(const std::vector<Fault>& faults, int world_size) {
  for (const Fault& f : faults)
    if (f.rank >= world_size)
      reject(f.spec, "rank=" + std::to_string(f.rank) + " is out of range; expected a rank in [0, " +
                         std::to_string(world_size - 1) + "] of this " + std::to_string(world_size) + "-rank job");
}

FaultInjector::FaultInjector(std::vector<Fault> faults, int rank) {
  for (Fault& f : faults)
    if (f.rank == rank) faults_.push_back(std::move(f));
  slept_.assign(faults_.size(), false);
}

void FaultInjector::begin_step(int64_t step) {
  if (first_step_ < 0) first_step_ = step;
  due_.clear();
  factor_ = 1;
  poison_ = false;
  scale_ = 1;
  for (size_t i = 0; i < faults_.size(); ++i) {
    const Fault& f = faults_[i];
    switch (f.kind) {
      case FaultKind::stall:
        // At 0: slept before the world was made (stall_before_start); before this run's
        // first step: a resumed run's, which never acts.
        if (f.at >= 1 && f.at >= first_step_ && f.at <= step && !slept_[i]) due_.push_back(i);
        break;
      case FaultKind::nan:
        if (step >= f.at && step - f.at < f.steps) poison_ = true;
        break;
      case FaultKind::slow:
        if (step >= f.at && step - f.at < f.steps) factor_ *= f.factor;
        break;
      case FaultKind::scale:
        if (step >= f.at && step - f.at < f.steps) scale_ *= f.factor;
        break;
    }
  }
}

double FaultInjector::take_stall() const {
  double seconds = 0;
  for (size_t i : due_)
    if (!slept_[i]) {
      seconds += faults_[i].seconds;
      slept_[i] = true;
    }
  return seconds;
}

}  // namespace ht::runtime
