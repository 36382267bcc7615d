#include "procs.hpp"

#include <dirent.h>

#include <utility>
#include <vector>

#include <fmt/format.h>

#include "base/small_file.hpp"

namespace nes::init {

namespace {

// Up to `cap` bytes of a /proc file; "" when it cannot be read (the process has just exited).
std::string read_proc(const std::string& path, std::size_t cap) {
  auto r = base::read_small_file(path.c_str(), cap, {.longer = base::Longer::truncate});
  return r ? std::move(*r) : std::string();
}

// The decimal number at the front of `s` (after spaces; a '-' makes it negative), advancing `s`
// past it. Not strtol: that would pull libc's whole scanner into the init for a few fields.
long number(const char*& s) {
  while (*s == ' ' || *s == '\t') ++s;
  const bool neg = *s == '-';
  if (neg) ++s;
  unsigned long v = 0;
  for (; *s >= '0' && *s <= '9'; ++s) v = v * 10 + static_cast<unsigned long>(*s - '0');
  return neg ? -static_cast<long>(v) : static_cast<long>(v);
}

// The first `max` bytes of s, cut back to a UTF-8 character boundary.
std::string clip_utf8(std::string s, std::size_t max) {
  if (s.size() <= max) return s;
  std::size_t n = max;
  while (n > 0 && (static_cast<unsigned char>(s[n]) & 0xC0) == 0x80) --n;
  s.resize(n);
  return s;
}

// The guest's totals (proto::GuestTotals) from <proc>/meminfo and <proc>/stat; nullopt when
// either cannot be read. USER_HZ is 100 on every Linux architecture we boot (the ABI's
// sysconf(_SC_CLK_TCK)): one tick is 10 000 µs.
std::optional<proto::GuestTotals> read_totals(const std::string& proc) {
  const std::string mi = read_proc(proc + "/meminfo", 8192), st = read_proc(proc + "/stat", 4096);
  if (mi.empty() || !st.starts_with("cpu ")) return std::nullopt;
  constexpr std::uint64_t kMax = 9007199254740991ull;  // 2^53-1: the wire's exact integers
  auto clamp = [](std::uint64_t v) { return v > kMax ? kMax : v; };
  auto kib = [&](const char* field) -> std::uint64_t {
    auto at = mi.find(field);
    if (at == std::string::npos) return 0;
    const char* q = mi.c_str() + at + std::char_traits<char>::length(field);
    const long v = number(q);
    return v > 0 ? static_cast<std::uint64_t>(v) * 1024 : 0;
  };
  proto::GuestTotals t;
  t.mem_total = clamp(kib("MemTotal:"));
  t.mem_available = clamp(kib("MemAvailable:"));
  // "cpu  user nice system idle iowait irq softirq steal ..." (proc(5)), in ticks.
  const char* q = st.c_str() + 4;
  std::uint64_t f[7] = {};
  for (auto& v : f) {
    const long n = number(q);
    v = n > 0 ? static_cast<std::uint64_t>(n) : 0;
  }
  constexpr std::uint64_t kUsecPerTick = 10000;
  t.cpu_user_usec = clamp((f[0] + f[1]) * kUsecPerTick);
  t.cpu_system_usec = clamp((f[2] + f[5] + f[6]) * kUsecPerTick);
  return t;
}

}  // namespace

proto::Processes read_processes(const std::string& proc) {
  std::vector<std::int32_t> pids;
  if (DIR* d = ::opendir(proc.c_str())) {
    while (dirent* e = ::readdir(d)) {
      const char* end = e->d_name;
      long v = *end >= '0' && *end <= '9' ? number(end) : 0;
      if (!*end && v > 0 && v <= 0x7fffffff) pids.push_back(static_cast<std::int32_t>(v));
    }
    ::closedir(d);
  }
  // procfs lists pids in ascending order already: an insertion sort only confirms it (and costs
  // the init none of std::sort's bytes).
  for (std::size_t i = 1; i < pids.size(); ++i)
    for (std::size_t j = i; j > 0 && pids[j - 1] > pids[j]; --j) std::swap(pids[j - 1], pids[j]);
  proto::Processes out;
  for (std::int32_t pid : pids) {
    const std::string dir = fmt::format("{}/{}", proc, pid);
    // stat: "pid (comm) state ppid ..."; comm may hold spaces and parentheses: the last ')' ends it.
    const std::string st = read_proc(dir + "/stat", 1024);
    const auto open = st.find('('), close = st.rfind(')');
    if (open == std::string::npos || close == std::string::npos || close < open || close + 4 > st.size()) continue;
    // After the comm: state ppid pgrp session tty_nr tpgid flags ... (proc(5)).
    const char* f = st.c_str() + close + 3;  // past ") " and the state letter
    long fields[7] = {};
    for (int i = 1; i < 7; ++i) fields[i] = number(f);
    // A kernel thread (PF_KTHREAD, include/linux/sched.h): not a process the guest runs. Not by
    // pid: in a sandbox's pid namespace pid 2 is the workload, not kthreadd.
    constexpr unsigned long kPfKthread = 0x00200000;
    if (static_cast<unsigned long>(fields[6]) & kPfKthread) continue;
    proto::ProcessInfo pi;
    pi.pid = pid;
    pi.ppid = static_cast<std::int32_t>(fields[1]);
    const std::string status = read_proc(dir + "/status", 4096);
    if (auto u = status.find("\nUid:"); u != std::string::npos) {
      const char* q = status.c_str() + u + 5;
      pi.uid = static_cast<std::uint32_t>(number(q));
    }
    std::string cmd = read_proc(dir + "/cmdline", proto::kProcessCmdMax + 1);
    while (!cmd.empty() && cmd.back() == '\0') cmd.pop_back();
    for (char& c : cmd)
      if (c == '\0') c = ' ';
    if (cmd.empty()) cmd = "[" + st.substr(open + 1, close - open - 1) + "]";
    pi.cmd = clip_utf8(std::move(cmd), proto::kProcessCmdMax);
    if (out.processes.size() == proto::kProcessesMax) {
      ++out.truncated;
      continue;
    }
    out.processes.push_back(std::move(pi));
  }
  out.totals = read_totals(proc);
  return out;
}

}  // namespace nes::init
