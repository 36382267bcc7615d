#include "reaper.hpp"

#include <sys/wait.h>

#include <cerrno>

namespace nes::init {

proto::WorkloadExited to_exit(int st) {
  if (WIFSIGNALED(st)) return proto::WorkloadExited::killed(static_cast<std::uint8_t>(WTERMSIG(st)));
  return proto::WorkloadExited::code(static_cast<std::uint8_t>(WEXITSTATUS(st)));
}

bool Reaper::watch_exec(pid_t pid) {
  for (pid_t& e : execs_)
    if (e == 0) {
      e = pid;
      return true;
    }
  return false;
}

void Reaper::forget(pid_t pid) {
  if (pid == workload_) workload_ = 0;
  for (pid_t& e : execs_)
    if (e == pid) e = 0;
}

Reaped Reaper::reap() {
  Reaped r;
  for (;;) {
    int st = 0;
    pid_t pid = ::waitpid(-1, &st, WNOHANG);
    if (pid == 0) break;  // children left, none exited
    if (pid < 0) {
      if (errno == EINTR) continue;
      if (errno == ECHILD) r.no_children = true;
      break;
    }
    if (pid == workload_ && workload_ > 0) {
      r.workload = to_exit(st);
      workload_ = 0;  // exactly once
      continue;
    }
    bool exec = false;
    for (pid_t& e : execs_)
      if (e == pid) {
        r.execs.push_back(ExecReaped{pid, to_exit(st)});
        e = 0;  // exactly once
        exec = true;
        break;
      }
    if (!exec) {
      ++r.orphans;
      ++orphans_total_;
    }
  }
  return r;
}

}  // namespace nes::init
