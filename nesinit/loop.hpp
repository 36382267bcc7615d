// The event loop of PID 1: one thread, one poll(2) over the signalfd and the channel fd, timers
// as deadlines folded into poll's timeout. It feeds the session events and performs its actions;
// all decisions are the session's (session.hpp).
#pragma once

#include "config.hpp"
#include "log.hpp"
#include "reaper.hpp"

namespace nes::init {

/// Run PID 1 from the dial to the final act. `sfd`: a signalfd for every blocked signal.
/// Never returns.
[[noreturn]] void run_pid1(Mode mode, const Config& cfg, const Log& log, int sfd, Reaper& reaper);

/// Milliseconds on CLOCK_MONOTONIC.
std::uint64_t monotonic_ms();

}  // namespace nes::init
