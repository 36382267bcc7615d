// The library's own threads never take a process-directed signal. A signal sent to the process
// (kill(1), ^C) goes to any one thread that does not block it: were that a worker of ours, an
// embedder that blocks SIGINT/SIGTERM in its own thread to read them from a signalfd (neshost
// run's last writes) would never see them, and with no handler installed any more the default
// action would end the process. So every thread the library starts is created with all signals
// blocked (a new thread inherits its creator's mask); handling them stays the embedder's choice.
// Internal (not installed).
#pragma once

#include <signal.h>

namespace nes::host {

/// RAII: every signal blocked in the calling thread while it lives, so the threads it creates
/// meanwhile start with them all blocked; the caller's own mask is restored at the end of scope.
class SignalsBlocked {
 public:
  SignalsBlocked() {
    sigset_t all;
    sigfillset(&all);
    ::pthread_sigmask(SIG_SETMASK, &all, &old_);
  }
  ~SignalsBlocked() { ::pthread_sigmask(SIG_SETMASK, &old_, nullptr); }
  SignalsBlocked(const SignalsBlocked&) = delete;
  SignalsBlocked& operator=(const SignalsBlocked&) = delete;

 private:
  sigset_t old_;
};

}  // namespace nes::host
