// End-to-end harness: the real static init ($NESINIT_BIN) as PID 1 of a fresh pid + mount
// namespace (`unshare --pid --fork --mount-proc --kill-child`), always with an explicit
// `--channel=unix:PATH`, against a scripted host on that Unix socket. RAII: the destructor kills
// and reaps the namespace (SIGKILL to unshare; --kill-child takes its init with it) and removes
// the temp dir, whatever the test did. No sleeps: every wait is on a message, an output or an
// exit, each with a bounded timeout.
#pragma once

#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>

#include <algorithm>
#include <array>
#include <map>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "host/lib/testing.hpp"
#include "protocol/protocol.hpp"

namespace nes::init::test {

/// How the namespace ended (a wait status of unshare, which re-raises its child's terminating
/// signal): SIGINT is the init's power-off, SIGHUP its reboot.
inline bool powered_off(std::optional<int> status) {
  return status && WIFSIGNALED(*status) && WTERMSIG(*status) == SIGINT;
}
inline bool rebooted(std::optional<int> status) {
  return status && WIFSIGNALED(*status) && WTERMSIG(*status) == SIGHUP;
}

struct SandboxOptions {
  std::vector<std::string> init_args;     // after --channel=unix:PATH
  std::vector<std::string> unshare_args;  // extra namespace flags, e.g. --uts
  bool listen = true;                     // false: no host listener at all
  std::string log = "info";
  bool full_backlog = false;    // listen with backlog 0 and queue one connection of our own: the
                                // init's connect finds the listener alive and its backlog full
  bool stderr_unread = false;   // the init's stderr: a one-page pipe, already full, not read
                                // until read_stderr() (a log nobody reads)
  std::vector<std::string> wrapper;  // argv run before the init inside the namespace (prlimit ...)
  bool data = false;            // listen for the data channel too: --data-channel=unix:DIR/data.sock
  proto::FrameRules data_rules{proto::FrameSender::guest, false, false, false};  // what it may send
  bool hold_receipt = false;    // do not close the data channel at the output's eofs (the
                                // receipt): the test closes it (close_data()) when it chooses
};

/// The real init in its sandbox, with the scripted host end of its channel (ScriptedHost, the
/// installed harness: next(), expect<T>(), send(), send_raw(), wait_eof(), last_error()); this
/// pump also serves the listener, the init's stdout/stderr and its exit.
class Sandbox : public host::testing::ScriptedHost {
 public:
  explicit Sandbox(SandboxOptions o = {});
  ~Sandbox() override;

  const std::filesystem::path& dir() const { return dir_; }
  /// The `unshare` process (outside the pid namespace, inside the sandbox's mount namespace):
  /// /proc/PID/ns/mnt and /proc/PID/mountinfo show the namespace the init was started in.
  pid_t unshare_pid() const { return pid_; }
  /// Accept the init's connection (bounded).
  bool accept(int timeout_ms = 10000);
  /// The usual opening: accept, `ready`, send `boot`, then `mounted` and `started`. False at the
  /// first step that fails, with that step named in last_error().
  bool start(const proto::Boot& boot) {
    if (!accept()) {
      last_error_ = "accept: " + last_error_;
      return false;
    }
    return open(boot);
  }
  /// Close our end of the channel (EOF for the init).
  void close_channel() { close(); }
  /// Wait until the workload's/init's stdout contains `needle`.
  bool wait_stdout(std::string_view needle, int timeout_ms = 10000);
  /// Wait until the init's stderr contains `needle`.
  bool wait_stderr(std::string_view needle, int timeout_ms = 10000);
  /// Send `sig` to the namespace's PID 1 from outside (found as unshare's child). False if absent.
  bool signal_init(int sig);
  /// Start reading the init's stderr (stderr_unread), first discarding the bytes we put there.
  void read_stderr();
  // ---- the data channel (SandboxOptions::data): pumped along with everything else ----------------
  /// Pump until `pred()` holds (true) or timeout_ms pass (false).
  template <class Pred>
  bool wait_until(Pred pred, int timeout_ms = 20000) {
    const std::uint64_t until = clock_ms() + static_cast<std::uint64_t>(timeout_ms);
    while (!pred()) {
      const std::uint64_t now = clock_ms();
      if (now >= until) return pred();
      pump(static_cast<int>(std::min<std::uint64_t>(until - now, 100)));
    }
    return true;
  }
  /// Stop (true) or resume reading the data channel: a host that does not keep up.
  void pause_data(bool paused) { data_paused_ = paused; }
  /// Close our end of the data channel before the output's end: a host that gives up on it.
  void close_data() {
    if (data_fd_ >= 0) ::close(data_fd_);
    data_fd_ = -1;
    data_closed_ = true;
  }
  /// Queue bytes (frames) for the guest; written as the socket takes them.
  void send_data(std::string_view bytes) { data_tx_ += bytes; }
  /// Bytes received per stream (stdout, stderr), drop counts, and the per-stream eofs.
  const std::string& data_out() const { return data_[1]; }
  const std::string& data_err() const { return data_[2]; }
  /// What process `proc` (started by exec) wrote to `s` so far.
  std::string proc_data(std::uint16_t proc, proto::Stream s) const {
    auto it = proc_data_.find(proc);
    return it == proc_data_.end() ? std::string() : it->second[static_cast<std::size_t>(s)];
  }
  std::uint64_t dropped() const { return dropped_; }
  bool data_eof(proto::Stream s) const { return data_dec_.at_eof(s); }
  bool data_connected() const { return data_fd_ >= 0 || data_closed_; }
  /// The guest closed the data channel (EOF).
  bool data_closed() const { return data_closed_; }
  /// A framing error in what the guest sent ("" if none).
  const std::string& data_error() const { return data_dec_.error(); }
  /// What arrived, in arrival order across both channels: "msg:<type>", "data:<stream>:eof",
  /// "data:dropped", "data:closed".
  const std::vector<std::string>& timeline() const { return timeline_; }
  /// The pump round in which the first timeline entry equal to `what` arrived (npos if none).
  /// Entries of one round arrived together: their order across the two sockets is unknown, so
  /// compare rounds with <=, and prove strict orders from the init's own log.
  std::size_t when(std::string_view what) const;
  static std::uint64_t clock_ms();

  /// Wait for the namespace to end: the wait status of unshare, which re-raises its child's
  /// terminating signal (SIGINT for power-off, SIGHUP for reboot). nullopt on timeout.
  std::optional<int> wait_exit(int timeout_ms = 20000);
  /// The host's `shutdown` (the ack after an outcome, or the request), then wait_exit: true if
  /// the init powered off.
  bool shutdown_powered_off(int timeout_ms = 20000) {
    send(proto::Shutdown{});
    return powered_off(wait_exit(timeout_ms));
  }

  const std::string& out() const { return out_; }
  const std::string& err() const { return err_; }
  /// output_end accounts the checks took off the channel (e2e_checks.hpp's next_exit), in order.
  std::vector<proto::OutputEnd> output_ends;

 protected:
  /// One poll round over listener, channel, stdout, stderr and the process; false on timeout.
  bool pump(int timeout_ms) override;
  /// Every guest message, in arrival order, into the timeline.
  void on_bytes(std::string_view bytes) override;
  /// Notes whether the boot asks for a terminal (then stdout is the only output stream).
  void on_send(const proto::HostMessage& m) override;

 private:
  std::filesystem::path dir_;
  std::string sock_path_;
  int listen_fd_ = -1;
  int out_fd_ = -1, err_fd_ = -1;
  int pidfd_ = -1;
  int filler_ = -1;           // our connection that fills the backlog (full_backlog)
  int data_listen_ = -1, data_fd_ = -1;
  bool data_paused_ = false, data_closed_ = false;
  bool terminal_ = false;     // the boot sent asked for a terminal: stdout is the only output
  bool hold_receipt_ = false;  // SandboxOptions::hold_receipt
  std::string data_[3];
  std::map<std::uint16_t, std::array<std::string, 3>> proc_data_;  // exec'd processes' output
  std::string data_tx_;
  std::uint64_t dropped_ = 0;
  proto::FrameDecoder data_dec_{proto::FrameRules{}};
  std::vector<std::string> timeline_;
  std::vector<std::size_t> timeline_round_;
  std::size_t round_ = 0;
  proto::LineReader timeline_reader_;
  bool err_paused_ = false;   // stderr_unread, until read_stderr()
  pid_t pid_ = -1;
  std::optional<int> status_;
  std::string out_, err_;
};

/// A boot descriptor running argv (terminal unless said otherwise).
proto::Boot make_boot(std::vector<std::string> argv, bool terminal = true);

/// True if `needles` occur in `hay` in this order (each after the previous one).
bool in_order(const std::string& hay, const std::vector<std::string>& needles, std::string* missing = nullptr);

/// Path of the init under test ($NESINIT_BIN).
std::string init_bin();

}  // namespace nes::init::test
