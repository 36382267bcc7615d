// The Monitor's stdio: the workload's output on our stdout/stderr with flow control, our stdin
// (or a replacement's reopened source) to the workload's, --stdin-hold, the terminal's size and
// raw mode (host/monitor/vm_monitor.hpp; docs/vm.md "Workload stdio").
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>

#include <fmt/format.h>

#include "host/monitor/say.hpp"
#include "host/monitor/vm_monitor.hpp"

namespace nes::monitor {

/// What the constructor sets up before serving: -i's pump, --stdin-hold's writer, -t's SIGWINCH,
/// -it's raw mode (restored by finish(), or when the Monitor goes).
void Monitor::setup_stdio() {
  out_.on_drained = [this] { update_pause(); };
  err_.on_drained = [this] { update_pause(); };
  // Each byte written to a recorded sink counted at once (output.pos), so a replacement goes on
  // at the first byte not yet delivered; a replacement writes what the sink lacked first.
  if (run_.output_tally && run_.count_out)
    out_.on_written = [this](std::size_t n) { run_.output_tally->add(host::OutputStream::out, n); };
  if (run_.output_tally && run_.count_err)
    err_.on_written = [this](std::size_t n) { run_.output_tally->add(host::OutputStream::err, n); };
  if (!run_.backlog_out.empty()) out_.write(std::exchange(run_.backlog_out, {}));
  if (!run_.backlog_err.empty()) err_.write(std::exchange(run_.backlog_err, {}));
  if (plan_.interactive) make_pump(0, 0);
  hold_stdin();
  if (plan_.tty) {
    winch_.add(SIGWINCH);
    arm_winch();
  }
  if (plan_.raw_terminal) {
    auto r = cli::RawMode::enter(0);
    if (r) raw_ = std::move(*r);
  }
}

/// The data channel is not read while any local reader is over its queue's cap (ours, or an exec
/// client's): the guest then holds the workload back.
void Monitor::update_pause() {
  bool want = out_.full() || err_.full() || execs_.any_full();
  if (want == output_paused_ || !host_) return;
  output_paused_ = want;
  (void)host_->pause_output(vmid_, want);
}

/// `fd` forwarded to the workload's stdin (its EOF too), from stdin.spool's byte `from` when the
/// run keeps one (a FIFO's bytes spliced there first: host/monitor/stdin_spool.hpp).
void Monitor::make_pump(int fd, std::uint64_t from) {
  pump_ = std::make_unique<cli::StdinPump>(
      io_, fd, [this](std::string_view b) { return host_ && host_->send_stdin(vmid_, b).ok(); },
      [this] {
        if (host_) (void)host_->send_stdin_eof(vmid_);
      });
  if (run_.stdin_spool)
    pump_->through(*run_.stdin_spool, from,
                   [this](std::string why) { say("neshost monitor: VM {}: {}\n", vmid_, why); });
}

/// --stdin-hold: a writer of our own on the stdin FIFO (a new open of it; non-blocking succeeds,
/// our fd 0 being a reader), closed by `close-stdin`: until then no EOF reaches the workload.
void Monitor::hold_stdin() {
  if (!plan_.stdin_hold) return;
  struct stat st{};
  if (::fstat(0, &st) != 0 || !S_ISFIFO(st.st_mode))
    say("neshost run: --stdin-hold: stdin is not a FIFO: nothing to hold\n");
  else if (stdin_hold_.reset(::open("/proc/self/fd/0", O_WRONLY | O_NONBLOCK | O_CLOEXEC)); !stdin_hold_)
    say("neshost run: --stdin-hold: open /proc/self/fd/0: {}\n", std::strerror(errno));
}

void Monitor::end_stdin(const std::string& why) {
  say("neshost monitor: VM {}: the workload's stdin ends here (EOF): {}\n", vmid_, why);
  if (host_) (void)host_->send_stdin_eof(vmid_);
}

/// A replacement monitor: the workload's stdin source reopened at the guest's stdin position
/// `guest_pos` (a file read again from there; a FIFO's bytes the monitor gone took sent again
/// from stdin.spool, then the FIFO where it stopped), else the workload's stdin ends, said why.
void Monitor::adopt_stdin(std::uint64_t guest_pos) {
  using Kind = host::VmmStdin::Kind;
  const auto& src = run_.stdin_source;
  if (!src) return end_stdin("its source (a terminal, an anonymous pipe) cannot be reopened by another process");
  adopted_in_.reset(::open(src->path.c_str(), O_RDONLY | O_CLOEXEC | (src->kind == Kind::fifo ? O_NONBLOCK : 0)));
  if (!adopted_in_) return end_stdin(fmt::format("open {}: {}", src->path.string(), std::strerror(errno)));
  if (src->kind == Kind::file) {
    // A file is read again from the guest's position: nothing twice, nothing lost.
    if (::lseek(adopted_in_.get(), static_cast<off_t>(src->offset + guest_pos), SEEK_SET) < 0)
      return end_stdin(fmt::format("seek {}: {}", src->path.string(), std::strerror(errno)));
    make_pump(adopted_in_.get(), 0);
    pump_->start();
    return;
  }
  // A FIFO: what the monitor gone took from it and the guest never received is in stdin.spool;
  // it goes again from the guest's position, then the FIFO where it stopped.
  auto sp = host::StdinSpool::open(plan_.state_dir, vmid_, false);
  if (!sp) return end_stdin(sp.error().message);
  run_.stdin_spool = std::move(*sp);
  const auto& p = *run_.stdin_spool;
  if (guest_pos > p.size())
    return end_stdin(fmt::format("{} holds {} bytes, fewer than the {} the guest received: its offsets are not "
                                 "the guest's", host::kStdinSpoolFile, p.size(), guest_pos));
  const std::uint64_t from = std::max(guest_pos, p.held_from());
  const std::uint64_t lost = from - std::min(guest_pos, from);
  say("neshost monitor: VM {}: stdin continues at byte {}: {} bytes the monitor gone took from {} and the guest "
      "never received go again from {}; {} bytes lost\n",
      vmid_, guest_pos, p.size() - from, src->path.string(), host::kStdinSpoolFile, lost);
  make_pump(adopted_in_.get(), from);
  pump_->start();
}

/// -t: each SIGWINCH becomes a resize of the workload's terminal (ours, or stdout's).
void Monitor::arm_winch() {
  winch_.async_wait([this](boost::system::error_code ec, int) {
    if (ec) return;
    auto sz = cli::terminal_size(0);
    if (!sz) sz = cli::terminal_size(1);
    if (sz && host_) (void)host_->send_resize(vmid_, sz->rows, sz->cols);
    arm_winch();
  });
}

}  // namespace nes::monitor
