// The guest's process list for `list_processes` (docs/protocol.md): what `ctr task ps` and
// `neshost top` show. Read from /proc; only user-space processes (a kernel thread's stat flags
// carry PF_KTHREAD).
#pragma once

#include <string>

#include "protocol/messages.hpp"

namespace nes::init {

/// The processes under `proc` (a procfs mount), by pid, at most proto::kProcessesMax (the rest
/// counted in `truncated`). Each entry's `cmd` is its argv joined by spaces, cut to
/// proto::kProcessCmdMax bytes at a UTF-8 boundary, or `[comm]` when it has none. A process that
/// exits while it is read is left out. `totals`: the guest's memory and CPU time from
/// <proc>/meminfo and <proc>/stat (absent when either is unreadable). Never fails: an unreadable
/// /proc gives an empty list.
proto::Processes read_processes(const std::string& proc = "/proc");

}  // namespace nes::init
