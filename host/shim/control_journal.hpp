// Controls journaled (docs/containerd.md "Controls journaled"): Kill, SignalProcess, Pause and
// Resume each carry a per-task sequence number, recorded in the shim's own task's record
// (nesinit-task.json) before the control is sent and removed once the monitor answered. The
// monitor applies a sequence number once (host/monitor/control.hpp Targeted::seq), so a shim
// replaced between the record and the answer sends each recorded control again, and it takes
// effect exactly once.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>

#include "host/lib/base.hpp"
#include "host/monitor/control.hpp"

namespace nes::shim {

class Container;

/// Records `request` in `own`'s record (the shim's own task: its VM's monitor is the one every
/// control reaches) with the next sequence number, durably (fault point `eio:record:control`),
/// then passes the fault point `control:recorded`: the control to send. Errors: more than
/// kPendingControlsMax unanswered (nothing recorded), the record's write (naming the file and
/// the errno; the number is not reused).
host::Result<monitor::control::Targeted> record_control(Container& own, const monitor::control::Request& request);

/// The control `seq` was answered (its answer about to be given): the fault point
/// `control:sent`, then the control removed from the record. That write failing is logged only:
/// a replacement would send the control again, which the monitor answers without applying it.
void control_answered(Container& own, std::uint64_t seq);

/// A control journaled and sent (blocking, one try of at most `timeout`): record_control,
/// control_call, control_answered. Errors: the record's; the monitor's answer or none.
host::Status journaled_call(Container& own, const monitor::control::Request& request,
                            std::chrono::milliseconds timeout);

/// A replaced shim (Container::restore): each control its record names unanswered is sent again
/// with its own number, in order, on the shim's loop (waiting for a monitor not ready yet, at
/// most 30 s), then removed from the record; `replayed(request, status)` is called for each (its
/// answer, or why it was not delivered). Returns how many there were.
std::size_t replay_controls(Container& own,
                            std::function<void(const monitor::control::Request&, host::Status)> replayed);

}  // namespace nes::shim
