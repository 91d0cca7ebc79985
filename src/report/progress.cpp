#include "report/progress.h"

#include <fcntl.h>
#include <unistd.h>

#include <cmath>

namespace ht::report {

std::string format_duration(double s) {
  if (!std::isfinite(s) || s < 0) return "?";
  char buf[32];
  long t = std::lround(s);
  if (t >= 3600)
    std::snprintf(buf, sizeof buf, "%ldh%02ldm", t / 3600, (t / 60) % 60);
  else if (t >= 60)
    std::snprintf(buf, sizeof buf, "%ldm%02lds", t / 60, t % 60);
  else
    std::snprintf(buf, sizeof buf, "%lds", t);
  return buf;
}

bool reaches_terminal(int fd, const std::string& forwarded_to) {
  if (!isatty(fd)) return false;
  if (forwarded_to.empty()) return true;
  // Non-blocking and no controlling terminal: the descriptor may be a FIFO or a tty that
  // this process must not adopt. Unreadable (another host's launcher, no /proc): lines.
  const int onward = ::open(forwarded_to.c_str(), O_RDONLY | O_NOCTTY | O_NONBLOCK | O_CLOEXEC);
  if (onward < 0) return false;
  const bool terminal = isatty(onward);
  ::close(onward);
  return terminal;
}

Progress::Mode Progress::detect(bool quiet, bool terminal) {
  if (quiet) return Mode::quiet;
  return terminal ? Mode::bar : Mode::lines;
}

Progress::Progress(Mode mode, int64_t total_steps, std::FILE* out)
    : mode_(mode), total_(total_steps), out_(out) {}

namespace {
std::string loss_text(float loss) {
  char text[32] = "-";  // NaN: not known yet (many ranks learn it at log steps)
  if (!std::isnan(loss)) std::snprintf(text, sizeof text, "%.4f", static_cast<double>(loss));
  return text;
}
}  // namespace

void Progress::logged(int64_t done, float loss, float lr, double samples_per_s, double eta_s) {
  if (mode_ != Mode::lines) return;
  std::fprintf(out_, "step %lld/%lld  loss %s  lr %.2e  %.0f samples/s  eta %s\n", static_cast<long long>(done),
               static_cast<long long>(total_), loss_text(loss).c_str(), lr, samples_per_s,
               format_duration(eta_s).c_str());
  std::fflush(out_);
}

void Progress::step(int64_t done, float loss, float /*lr*/, double samples_per_s, double eta_s) {
  if (mode_ != Mode::bar) return;
  // Redraw at most ten times a second: fast steps would otherwise flood the terminal.
  auto now = std::chrono::steady_clock::now();
  if (done != total_ && now - last_draw_ < std::chrono::milliseconds(100)) return;
  last_draw_ = now;
  constexpr int kWidth = 28;
  int filled = total_ > 0 ? static_cast<int>(kWidth * done / total_) : kWidth;
  char bar[kWidth + 1];
  for (int i = 0; i < kWidth; ++i) bar[i] = i < filled ? '=' : (i == filled ? '>' : ' ');
  bar[kWidth] = '\0';
  std::fprintf(out_, "\r[%s] %lld/%lld  loss %s  %.0f samples/s  ETA %s\033[K", bar,
               static_cast<long long>(done), static_cast<long long>(total_), loss_text(loss).c_str(),
               samples_per_s, format_duration(eta_s).c_str());
  std::fflush(out_);
  bar_drawn_ = true;
}

void Progress::clear_bar() {
  if (bar_drawn_) std::fprintf(out_, "\r\033[K");
  bar_drawn_ = false;
}

void Progress::note(const std::string& line) {
  if (mode_ == Mode::quiet) return;
  clear_bar();
  std::fprintf(out_, "%s\n", line.c_str());
  std::fflush(out_);
}

void Progress::finish() {
  if (mode_ == Mode::bar && bar_drawn_) std::fprintf(out_, "\n");
  bar_drawn_ = false;
  std::fflush(out_);
}

}  // namespace ht::report
