// The data channel shared by several processes' stdio (docs/protocol.md "Data channel", "Exec"),
// sans-I/O: it owns the workload's StdioCore (process 0) and the core of every process `exec`
// started, and decides what concerns more than one of them: whose frames go out next, how much
// may be read from the host, which core a frame from the host belongs to, and when a closed
// process's core may go. The loop asks it and does the I/O (read, write, splice); it never
// touches an fd, so its rules are tested by driving it directly (tests/init/stdio_mux_test.cpp).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "protocol/frame.hpp"
#include "protocol/messages.hpp"
#include "stdio.hpp"

namespace nes::init {

/// The workload's and every exec'd process's StdioCore behind one data channel.
///
/// Sending: the processes take turns, one batch (StdioCore::tx(), up to kTxBatch bytes) or one
/// direct frame each, in a fixed ring (the workload, then the exec slots), so no process's flood
/// holds the others' output back. A turn that has begun is finished before another process's
/// bytes go out: frames of different processes interleave only at frame boundaries.
///
/// Receiving: the workload's core decodes the whole channel (one FrameDecoder knows every
/// process's rules); frames of an open exec'd process go to its core, those of a closed one are
/// skipped, and a number above any ever opened is a framing error (rx_error()).
class StdioMux {
 public:
  /// The workload's stdio (`boot.stdio`); the channel is open.
  explicit StdioMux(const proto::Stdio& workload);

  /// Process 0's core: the loop feeds it the workload's pipes or PTY, and moves its direct frames.
  StdioCore& workload() { return workload_; }
  const StdioCore& workload() const { return workload_; }

  // ---- processes exec started
  /// Most exec'd processes held at once: kExecMax open, and one closed whose turn is not over.
  static constexpr std::size_t kSlots = proto::kExecMax + 1;
  /// Process `proc` (1..65535) gets a core for `s` (`exec.stdio`), copying only (splice is the
  /// workload's alone: one frame pipe), and its frames become legal on the channel. With the
  /// channel already gone the core discards output as the others do; with the host's sending
  /// side already ended (EOF, or the channel gone) its stdin is at eof from the start.
  /// nullptr: refused (kExecMax open already, or `proc` still held: its last turn is not over).
  StdioCore* open(std::uint16_t proc, const proto::Stdio& s);
  /// The core of open process `proc` (0: the workload's); nullptr once closed or never opened.
  StdioCore* core(std::uint16_t proc);
  /// Process `proc` was reported (or did not start): its late frames from the host are skipped
  /// and its unsent output is discarded. Its core goes at once, or, while its turn is under way
  /// (a frame of it half-written), as soon as that turn is over: in every round, the final
  /// flush's too. Unknown numbers and 0 are ignored.
  void close(std::uint16_t proc);
  /// A core for `proc` is held, open or closed with its turn not over (tests).
  bool holds(std::uint16_t proc) const;
  /// True once, the first time it is asked after `proc`'s outputs are both at EOF (the loop
  /// reports OutputsDone or ExecOutputsDone then); false for a closed or unknown process. An
  /// exec'd process's only once its frames are written too (while the channel is open): its
  /// report closes it, which discards what its core still holds.
  bool take_outputs_done(std::uint16_t proc);

  // ---- to the host
  /// What the loop writes next: `bytes` (framed, stable until sent()), or, when empty, the
  /// workload's direct frame in progress (`direct`), which the loop moves with splice(2) through
  /// StdioCore's direct_* calls. `proc`: whose turn it is.
  struct Tx {
    std::uint16_t proc = 0;                   // whose turn: 0 the workload, else `exec`'s proc
    std::string_view bytes;                   // framed bytes to write now, or empty
    std::optional<StdioCore::Direct> direct;  // with empty bytes: the direct frame to move on
  };
  /// The turn under way, or the next process in the ring with frames due (which begins its
  /// turn); nullopt when nothing is due.
  std::optional<Tx> tx();
  /// `n` bytes of tx().bytes were written; the turn ends once its batch is out in full.
  void sent(std::size_t n);
  /// Some process has frames due (the loop polls the channel for POLLOUT).
  bool tx_pending();

  // ---- from the host
  /// Bytes the loop may read from the data channel now: the least room of any open process's
  /// stdin buffer (each leaves room for one whole frame beyond what is read), so no process's
  /// stdin passes kStdinCap; 0: do not read (the host is backpressured by its transport).
  std::size_t rx_room() const;
  /// Bytes read from the data channel: decoded, each frame to its process's core.
  void on_rx(std::string_view bytes);
  /// The host closed its sending side: every open process's stdin ends once what it holds is
  /// written (no frame can come for any of them any more: docker closes an exec's stdin when
  /// its attach stream ends). A partial frame at EOF is the workload's framing error instead.
  void on_rx_eof();
  /// The first framing error the host caused ("" if none); the loop then closes the channel.
  const std::string& rx_error() const { return workload_.rx_error(); }

  // ---- the channel itself
  /// The data channel is gone (error, write failure, power-off): every core discards its output
  /// and its stdin from now on, no turn is under way, and closed processes' cores go.
  void channel_closed();
  /// Data channel resume (the workload's StdioCore::resume()): the channel was lost without the
  /// host's close. The workload's core keeps its output for the next connection; every process
  /// exec started loses its streams as at channel_closed() (docs/protocol.md "Data channel
  /// resume": their clients ended with the host). Without resume: channel_closed().
  void channel_lost();
  /// A redialled channel is connected: the workload's handshake goes out before anything else.
  void channel_resumed();
  /// False once channel_closed() was called.
  bool channel_open() const { return workload_.channel_open(); }

 private:
  struct Slot {
    Slot(const proto::Stdio& s, std::uint16_t p) : proc(p), core(s, p) {}
    std::uint16_t proc;
    bool closed = false;  // reported: kept only while its turn is under way
    bool outputs_reported = false;
    StdioCore core;
  };
  /// The ring: 0 the workload, 1.. the exec slots.
  StdioCore* ring(std::size_t i);
  Slot* slot_of(std::uint16_t proc) const;
  void end_turn();

  StdioCore workload_;
  bool outputs_reported_ = false;  // the workload's
  // Grown as processes open (at most kSlots), never shrunk: a slot's ring index stays its own,
  // and a free one (null) is reused. Each is allocated on its own, so growing moves no core.
  std::vector<std::unique_ptr<Slot>> slots_;
  std::optional<std::size_t> turn_;  // ring index whose turn is under way
  bool rx_ended_ = false;            // nothing more comes from the host (EOF, or the channel gone)
  std::size_t next_ = 0;             // ring index to look at first for the next turn
};

}  // namespace nes::init
