#include "host/vm/daemon.hpp"

#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <vector>

namespace nes::vm {

DaemonWait wait_ready(VmProcess& p, int ready_fd, std::chrono::milliseconds bound,
                      const std::function<bool()>& confirm) {
  pollfd fds[2] = {{ready_fd, POLLIN, 0}, {p.pidfd(), POLLIN, 0}};
  const auto deadline = std::chrono::steady_clock::now() + bound;
  while (true) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    int r = ::poll(fds, 2, static_cast<int>(std::max<long long>(0, left.count())));
    if (r < 0 && errno == EINTR) continue;
    if (r > 0 && fds[1].revents) {
      DaemonWait w{DaemonWait::Outcome::exited, p.wait_for(std::chrono::milliseconds(0)), {}};
      p.finish_output(std::chrono::milliseconds(1000));
      w.tail = p.diagnostics_tail();
      return w;
    }
    if (r > 0 && (fds[0].revents & POLLIN)) {
      if (!confirm || confirm()) return {};
      continue;
    }
    if (r > 0) continue;  // an event on the ready fd other than POLLIN (none expected): poll again
    DaemonWait w{DaemonWait::Outcome::timed_out, std::nullopt, p.diagnostics_tail()};
    p.terminate(std::chrono::milliseconds(200));
    p.finish_output(std::chrono::milliseconds(1000));
    return w;
  }
}

ProcessExit stop_daemon(VmProcess& p, std::chrono::milliseconds grace) {
  ProcessExit e;
  if (auto x = p.wait_for(grace)) e = *x;
  else e = p.terminate(std::chrono::milliseconds(1000));
  p.finish_output(std::chrono::milliseconds(1000));
  return e;
}

std::string daemon_last_lines(std::string_view text, std::size_t max,
                              const std::function<bool(std::string_view)>& skip) {
  std::vector<std::string_view> lines;
  while (!text.empty()) {
    auto nl = text.find('\n');
    std::string_view line = text.substr(0, nl);
    text = nl == std::string_view::npos ? std::string_view() : text.substr(nl + 1);
    while (!line.empty() && std::isspace(static_cast<unsigned char>(line.back()))) line.remove_suffix(1);
    if (line.empty() || (skip && skip(line))) continue;
    lines.push_back(line);
  }
  // The last lines that fit in `max` with their separating spaces.
  std::size_t first = lines.size(), size = 0;
  while (first > 0 && size + lines[first - 1].size() + (size ? 1 : 0) <= max) {
    size += lines[first - 1].size() + (size ? 1 : 0);
    --first;
  }
  std::string out;
  if (first == lines.size() && !lines.empty()) {  // the last line alone is longer than max
    out = "... ";
    out += lines.back().substr(lines.back().size() - max);
    return out;
  }
  if (first > 0) out = "... ";
  for (std::size_t i = first; i < lines.size(); ++i) {
    if (i > first) out += ' ';
    out += lines[i];
  }
  return out;
}

void append_bounded_log(int log, std::string_view b, std::size_t cap, std::size_t& logged) {
  if (log < 0 || logged >= cap) return;
  std::string_view part = b.substr(0, cap - logged);
  while (!part.empty()) {
    ssize_t n = ::write(log, part.data(), part.size());
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
    logged += static_cast<std::size_t>(n);
    part.remove_prefix(static_cast<std::size_t>(n));
  }
}

}  // namespace nes::vm
