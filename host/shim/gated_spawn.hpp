// A child that runs its program only once its parent says so: the task's monitor is recorded
// before it can do anything (intent before effect).
#pragma once

#include <sys/types.h>

#include <string>
#include <string_view>
#include <vector>

#include "host/lib/base.hpp"
#include "host/shim/process.hpp"

namespace nes::shim {

/// A child forked and waiting at its gate: `pid` (its own session and process group), `gate` the
/// write end the parent releases it through, `exec_errors` where it says execve's errno.
struct GatedChild {
  pid_t pid = 0;
  host::Fd gate;
  host::Fd exec_errors;
};

/// Forks `prog` (a path, or a name looked up on PATH before forking) with `args` (argv[1..]) in
/// a session of its own (a signal to the shim's group never reaches it; its group ends with it),
/// `s` as its fds 0-2 and nothing else of the shim's (containerd's connections above all), every
/// signal unblocked and default. The child execs only after release(); if the gate closes
/// first (the shim died, or gave up) it exits 125 without running anything. Errors name `prog`
/// and the errno.
host::Result<GatedChild> spawn_gated(const std::string& prog, const std::vector<std::string>& args, const Streams& s);

/// Lets the child exec its program and waits until it has (bounded by its execve). Errors name
/// `prog` and the child's errno when it could not run it (execve's ENOENT: no such program, the
/// child exits 127; a failed dup2 before the gate: it exits 125), else the gate's write errno
/// (the child never runs it: the gate is closed either way).
host::Status release(GatedChild& c, std::string_view prog);

}  // namespace nes::shim
