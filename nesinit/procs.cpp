#include "procs.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <vector>

namespace nes::init {

namespace {

// Up to `cap` bytes of a /proc file (they are generated on read: one read may return less).
std::string read_proc(const std::string& path, std::size_t cap) {
  std::string out;
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return out;
  char buf[1024];
  while (out.size() < cap) {
    ssize_t n = ::read(fd, buf, std::min(sizeof buf, cap - out.size()));
    if (n <= 0) break;
    out.append(buf, static_cast<std::size_t>(n));
  }
  ::close(fd);
  return out;
}

// The first `max` bytes of s, cut back to a UTF-8 character boundary.
std::string clip_utf8(std::string s, std::size_t max) {
  if (s.size() <= max) return s;
  std::size_t n = max;
  while (n > 0 && (static_cast<unsigned char>(s[n]) & 0xC0) == 0x80) --n;
  s.resize(n);
  return s;
}

}  // namespace

proto::Processes read_processes(const std::string& proc) {
  std::vector<std::int32_t> pids;
  if (DIR* d = ::opendir(proc.c_str())) {
    while (dirent* e = ::readdir(d)) {
      char* end = nullptr;
      long v = std::strtol(e->d_name, &end, 10);
      if (*e->d_name && !*end && v > 0 && v <= 0x7fffffff) pids.push_back(static_cast<std::int32_t>(v));
    }
    ::closedir(d);
  }
  std::sort(pids.begin(), pids.end());
  proto::Processes out;
  for (std::int32_t pid : pids) {
    const std::string dir = proc + "/" + std::to_string(pid);
    // stat: "pid (comm) state ppid ..."; comm may hold spaces and parentheses: the last ')' ends it.
    const std::string st = read_proc(dir + "/stat", 1024);
    const auto open = st.find('('), close = st.rfind(')');
    if (open == std::string::npos || close == std::string::npos || close < open || close + 4 > st.size()) continue;
    // After the comm: state ppid pgrp session tty_nr tpgid flags ... (proc(5)).
    const char* f = st.c_str() + close + 2;
    long fields[7] = {};
    for (long& v : fields) {
      while (*f == ' ') ++f;
      char* end = nullptr;
      v = f == st.c_str() + close + 2 ? 0 : std::strtol(f, &end, 10);  // field 0 is the state letter
      f = end ? end : f + 1;
    }
    // A kernel thread (PF_KTHREAD, include/linux/sched.h): not a process the guest runs. Not by
    // pid: in a sandbox's pid namespace pid 2 is the workload, not kthreadd.
    constexpr unsigned long kPfKthread = 0x00200000;
    if (static_cast<unsigned long>(fields[6]) & kPfKthread) continue;
    proto::ProcessInfo pi;
    pi.pid = pid;
    pi.ppid = static_cast<std::int32_t>(fields[1]);
    const std::string status = read_proc(dir + "/status", 4096);
    if (auto u = status.find("\nUid:"); u != std::string::npos)
      pi.uid = static_cast<std::uint32_t>(std::strtoul(status.c_str() + u + 5, nullptr, 10));
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
  return out;
}

}  // namespace nes::init
