// The session: a sans-I/O state machine for one connection of the lifecycle channel and the
// ordered shutdown that ends it. Events in (a decoded line, EOF, mounts done, workload started /
// exited, a signal to PID 1, a timer, a dial result), actions out (dial, send a message, mount,
// spawn, signal, arm a timer, power off). It never touches a file descriptor or a clock: the loop (loop.cpp) does the
// I/O, which keeps every rule here testable by driving events directly (tests/init/session_test).
// Rules: docs/protocol.md; the reasons: docs/init.md.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "log.hpp"
#include "protocol/codec.hpp"
#include "protocol/frame.hpp"
#include "protocol/line_reader.hpp"
#include "protocol/messages.hpp"
#include "protocol/status.hpp"

namespace nes::init {

/// The session's timers. Each is armed with a duration in ms; re-arming replaces it.
enum class Timer {
  dial,             // the first dial began -> connect_timeout_ms -> give up: ordered shutdown
  boot,             // ready sent -> boot_timeout_ms
  workload_grace,   // the workload's one SIGTERM -> grace_ms -> SIGKILL (during shutdown)
  workload_kill,    // SIGKILL to the workload's group -> kKillWaitMs -> give up on it
  all_grace,        // kill(-1, SIGTERM) -> grace_ms -> kill(-1, SIGKILL)
  all_kill,         // kill(-1, SIGKILL) -> kKillWaitMs -> give up on stragglers
  ack,              // terminal outcome sent -> ack_timeout_ms -> power off without the ack
  drain,            // workload reaped, its output not at EOF -> stdio.drain_ms -> CheckHeld: nothing held: report
  reconnect,        // channel lost after boot -> boot.reconnect_ms -> today's shutdown
  redial,           // a dial attempt failed -> backoff -> the next attempt (first dial or redial)
  data_dial,        // boot.stdio: the data channel's dial began -> connect_timeout_ms -> start_failed
  data_redial,      // a data channel attempt failed -> backoff -> the next attempt
  flush_idle,       // an unacknowledged final flush wrote nothing for kFlushIdleMs -> power off anyway
  flush_cap,        // an unacknowledged final flush began -> kFlushMaxMs -> power off anyway
  exec_drain,       // an exec'd process reaped, its output not at EOF -> its drain_ms -> CheckHeld: nothing held: report
  ack_window,       // the first ack timeout treated as a loss (reconnect_ms > 0) -> reconnect_ms -> today's power-off
  data_reconnect,   // data channel resume: the data channel lost -> boot.reconnect_ms -> DataGiveUp
};
inline constexpr int kTimerCount = 17;
/// Backoff between dial attempts (the first dial and a redial alike): ms, doubling from the first
/// to the last.
inline constexpr std::uint32_t kRedialFirstMs = 10;
inline constexpr std::uint32_t kRedialMaxMs = 500;
std::string_view to_string(Timer t);

/// How long to wait for processes to disappear after SIGKILL (they can only be stuck in the
/// kernel, e.g. uninterruptible I/O on a dead share): ms.
inline constexpr std::uint32_t kKillWaitMs = 5000;
/// The final flush before power-off (docs/protocol.md "The receipt"), when no live host holds it
/// (no ack of the outcome, or the lifecycle channel hung up): given up after this long without a
/// byte written to either channel, ms ...
inline constexpr std::uint32_t kFlushIdleMs = 1000;
/// ... and after this long in all, ms.
inline constexpr std::uint32_t kFlushMaxMs = 15000;

// ---- events ------------------------------------------------------------------------------------
namespace ev {
/// One output stream's account (docs/protocol.md "output_end"): `sent` payload bytes framed for
/// the data channel (at its EOF, with those read and framed next), `unsent` bytes given up (thrown
/// away, or still unread in the pipe: FIONREAD); sent + unsent is every byte of the stream the
/// init has seen. `eof_framed`: its eof frame is framed.
struct OutputAccount {
  std::uint64_t sent = 0;
  std::uint64_t unsent = 0;
  bool eof_framed = false;
  bool operator==(const OutputAccount&) const = default;
};
struct Start { std::string channel; };            // PID 1 is set up: dial `channel` (its address, for the log)
struct ChannelUp {};                              // dialled (or redialled): the session (re)begins
struct Line { proto::Line line; };                // a framed line (the session decodes it)
struct Message { proto::HostDecoded msg; };       // an already-decoded line
struct Eof {};                                    // the host closed the channel (or it broke)
struct MountsDone {};
struct MountFailed { proto::MountFailed failure; };
/// boot.network could not be configured (nothing started).
struct NetworkFailed { proto::NetworkFailed failure; };
struct Started { std::int32_t pid; };
struct StartFailed { proto::StartFailed failure; };
struct Exited { proto::WorkloadExited status; };  // the workload was reaped
struct Signal { int signo; };                     // a signal to PID 1 (read from signalfd)
struct TimerFired { Timer timer; };
struct NoChildren {};                             // waitpid(-1) says ECHILD
struct DataUp {};                                 // the data channel is connected (boot.stdio)
/// One data channel attempt (act::DialData) failed: `reason` names the address and the error,
/// `err` is its errno, `retryable` as for DialFailed (false: give up, nothing starts).
struct DataFailed { std::string reason; int err; bool retryable = false; };
struct DataError { std::string reason; };         // the host broke the framing: channel closed
/// Data channel resume: the channel ended without the host's close frame; the workload's output
/// is kept (act::DialData redials it, act::DataGiveUp ends the wait).
struct DataLost { std::string reason; };
/// The workload's stdout and stderr are at EOF, their eof frames framed: their final accounts
/// (no `err` with a terminal: one stream).
struct OutputsDone { OutputAccount out; std::optional<OutputAccount> err = OutputAccount{}; };
/// One dial attempt (act::Dial) failed: `reason` is the error as text (strerror); `retryable`
/// says the peer is not there *yet* (transport.hpp's retryable(errno): no listener, no port yet,
/// an attempt cut short by a signal) rather than refusing for good.
struct DialFailed { std::string reason; bool retryable = true; };
/// During the final flush (act::Flush): what is left, reported at once and after every round of
/// writes. `written`: bytes written to either channel in that round; `control_queued`: lines for
/// the host not written yet; `data_open`: the data channel is open; `data_unsent`: frames not
/// written yet; `outputs_done`: the workload's stdout and stderr are at EOF; `receipt`: the host
/// closed the data channel (EOF, or a virtio port's hang-up); `output_bytes`: output still held;
/// `channel_open`: the lifecycle channel is connected (no hang-up seen); `out`, `err`: the
/// workload's output streams' accounts.
struct Flushing {
  std::uint64_t written = 0;
  bool control_queued = false;
  bool data_open = false;
  bool data_unsent = false;
  bool outputs_done = false;
  bool receipt = false;
  std::size_t output_bytes = 0;
  bool channel_open = true;
  OutputAccount out;
  std::optional<OutputAccount> err = OutputAccount{};  // none with a terminal
};
/// act::CheckHeld's answer: `bytes` of process `proc`'s output (0: the workload's) the init still
/// holds: in its buffers, a frame begun, or unread in its pipes (FIONREAD). 0: nothing waits.
struct Held { std::uint16_t proc; std::uint64_t bytes; };
/// act::CloseExec closed process `proc`'s streams: their accounts then, and whether both were
/// already at EOF (their accounts went out with ExecOutputsDone).
struct ExecClosed { std::uint16_t proc; OutputAccount out; std::optional<OutputAccount> err = OutputAccount{}; bool outputs_done = false; };
struct ProcessList { proto::Processes list; };    // act::ListProcesses's result (read from /proc)
struct ResourcesDone { proto::ContainerResourcesReply reply; };  // act::ContainerResources's result
struct ExecStarted { std::uint16_t proc; std::int32_t pid; };          // act::SpawnExec succeeded
struct ExecFailed { std::uint16_t proc; proto::StartFailed failure; };  // ... or failed: nothing runs
struct ExecReaped { std::int32_t pid; proto::WorkloadExited status; };  // an exec'd pid was reaped
/// Process `proc`'s stdout and stderr are at EOF (their final accounts), or it has no streams
/// (`stdio` false: no accounts).
struct ExecOutputsDone { std::uint16_t proc; bool stdio = false; OutputAccount out; std::optional<OutputAccount> err = OutputAccount{}; };
}  // namespace ev
using Event = std::variant<ev::Start, ev::ChannelUp, ev::Line, ev::Message, ev::Eof,
                           ev::MountsDone, ev::MountFailed, ev::NetworkFailed, ev::Started, ev::StartFailed,
                           ev::Exited, ev::Signal, ev::TimerFired, ev::NoChildren, ev::DataUp,
                           ev::DataFailed, ev::DataError, ev::DataLost, ev::OutputsDone, ev::DialFailed,
                           ev::Flushing, ev::ProcessList, ev::ExecStarted, ev::ExecFailed,
                           ev::ExecReaped, ev::ExecOutputsDone, ev::Held, ev::ExecClosed, ev::ResourcesDone>;

// ---- actions -----------------------------------------------------------------------------------
namespace act {
/// One line to the host: `msg` with the session's `generation` beside it (proto::GuestEnvelope:
/// echoed from boot.generation in every line after `boot`; unset before it).
struct Send { proto::GuestMessage msg; std::optional<std::uint64_t> generation; };
/// One attempt to dial the data channel (boot.stdio): DataUp or DataFailed. Held like act::Dial
/// (at most `attempt_ms`, never past a pending signal or the next armed timer); once up, the
/// channel carries the workload's streams as `stdio` says.
struct DialData {
  std::uint32_t attempt_ms;
  proto::Stdio stdio;
  /// Data channel resume (stdio.replay_bytes > 0 and boot.reconnect_ms > 0): the hello frame's
  /// `generation` and `vm`; `redial`: the channel was lost and this attempt redials it (a
  /// virtio port then counts only with its host side connected).
  bool resume = false;
  std::uint64_t generation = 0;
  std::string vm;
  bool redial = false;
};
/// The data channel's resume window ended without a host: close it for good (output discarded
/// and counted from now on).
struct DataGiveUp {};
/// One attempt to dial the lifecycle channel: ChannelUp or DialFailed. The attempt holds the loop
/// at most `attempt_ms` (a connect in progress), and never past a pending signal or the next
/// armed timer. `need_peer`: a virtio port counts as dialled only with its host side connected
/// (no POLLHUP) and its next hang-up is an EOF (a redial); without it (the first dial) the port
/// is taken as soon as it opens and a hang-up before the host's first byte means "not yet".
struct Dial { std::uint32_t attempt_ms; bool need_peer; };
/// Switch to `root` (if set), then mount `mounts` in order: MountsDone or MountFailed.
/// Then configure `network` (if set; /etc/hostname from `hostname`): MountsDone, or NetworkFailed.
struct Mount {
  std::optional<proto::Root> root;
  std::vector<proto::Mount> mounts;
  std::optional<proto::Network> network;
  std::optional<std::string> hostname;
};
/// A warm start's first step (boot.entropy, boot.realtime_ns: either set), before the data
/// channel, the shares and the network: add `entropy` to the kernel's pool (credited) and reseed
/// its CRNG at once; step CLOCK_REALTIME to `realtime_ns` if it is more than kClockStepNs off.
/// A failure is logged (warn), never fatal; no event follows.
struct Seed {
  std::optional<proto::Entropy> entropy;
  std::optional<std::uint64_t> realtime_ns;
};
/// Set `hostname` (if set), then start `exec` in its own process group with `geometry` in its
/// environment and its stdio as `stdio` says (unset: /dev/console with `console`, else the init's
/// own fds): Started or StartFailed.
struct Spawn {
  std::optional<std::string> hostname;
  proto::Exec exec;
  proto::Geometry geometry;
  std::optional<proto::Stdio> stdio;
  bool console = false;  // no `stdio`: fds 0-2 on /dev/console, else the init's own
};
struct SignalGroup { int signo; std::int32_t pgid; };  // kill(-pgid, signo): the workload's group
struct SignalAll { int signo; };    // kill(-1, signo): everything but PID 1
struct ArmTimer { Timer timer; std::uint32_t ms; };
struct CancelTimer { Timer timer; };
struct Note { Severity severity; std::string phase; std::string text; };  // one log line
/// Before the final act: from now on only write what is queued on both channels (and watch the
/// data channel for the host's close), reporting ev::Flushing at once and after every round.
/// Nothing new is read from the host; the session ends it with PowerOff.
struct Flush {};
/// Close the lifecycle channel now, without an ev::Eof (the session already counts it lost):
/// what is queued for the host is dropped (the session re-sends what it still owes on the next
/// channel). A redial (act::Dial) follows.
struct CloseChannel {};
struct PowerOff { proto::Halt halt; };  // the final act: unmount, reboot(2). Never returns.
struct ListProcesses {};  // read the guest's processes (procs.hpp): ProcessList
/// Update (when `req.update` is set) and read the cgroup of the running container `req.proc`
/// (cgroup.hpp): ResourcesDone.
struct ContainerResources { proto::ContainerResourcesRequest req; };
/// Start `exec` beside the workload (the host's `exec`), in its own session and process group,
/// `geometry` in its environment; its streams as `stdio` says, framed as process `proc` on the
/// data channel (unset: /dev/null). ExecStarted or ExecFailed; later ExecOutputsDone.
/// `container` set: as a new container's PID 1 (container.hpp); `in_pid` > 0: inside the running
/// container whose PID 1 is that pid (the host's `exec.in`).
struct SpawnExec {
  std::uint16_t proc;
  proto::Exec exec;
  proto::Geometry geometry;
  std::optional<proto::Stdio> stdio;
  std::optional<proto::Container> container = std::nullopt;
  std::int32_t in_pid = 0;
};
/// Process `proc` was reported: close what is left of its streams (its late output is
/// discarded) once the frames already begun are out. ev::ExecClosed follows (with stdio).
struct CloseExec { std::uint16_t proc; };
/// Measure what process `proc` (0: the workload) still holds of its output: ev::Held.
struct CheckHeld { std::uint16_t proc; };
}  // namespace act
using Action = std::variant<act::Send, act::DialData, act::DataGiveUp, act::Dial, act::Seed, act::Mount, act::Spawn, act::SignalGroup, act::SignalAll,
                            act::ArmTimer, act::CancelTimer, act::Note, act::Flush, act::PowerOff,
                            act::ListProcesses, act::SpawnExec, act::CloseExec, act::CheckHeld,
                            act::CloseChannel, act::ContainerResources>;
using Actions = std::vector<Action>;

/// Where the session is.
enum class Phase { idle_before_channel, awaiting_boot, mounting, starting, running, settled,
                   shutting_down, done };
/// Where the ordered shutdown is (Phase::shutting_down).
enum class Stage { none, workload_term, workload_kill, all_term, all_kill, await_ack, flush, final };
std::string_view to_string(Phase p);
std::string_view to_string(Stage s);

/// The session's configuration (Config's times, in ms).
struct SessionOptions {
  std::uint32_t grace_ms = 10000;
  std::uint32_t ack_timeout_ms = 3000;
  std::uint32_t boot_timeout_ms = 30000;
  proto::Halt halt = proto::Halt::poweroff;
  std::uint32_t connect_timeout_ms = 10000;  // the first dial, every attempt and backoff together
  /// This PID 1 may switch to a share as `/` (boot.root): a guest's on its initramfs, never a
  /// sandbox's (it shares the machine's tree). Without it a root is mount_failed (EPERM).
  bool may_switch_root = true;
  /// This PID 1 may set boot.hostname: not a sandbox in the machine's own UTS namespace (it
  /// would rename the machine). Without it the hostname is skipped with a warning.
  bool may_set_hostname = true;
  /// A data channel address is configured (--data-channel, nesinit.data=). Without one a boot
  /// with stdio is start_failed at once: there is nothing to dial.
  bool has_data_channel = true;
  /// Without boot.stdio the workload's fds 0-2 are /dev/console (a guest's PID 1: the console is
  /// all the output there is); off, they are the init's own (a sandbox's: its caller's).
  bool console_stdio = false;
  /// This PID 1 may configure boot.network: a guest, or a sandbox in a network namespace of its
  /// own (Config::own_netns). Without it boot.network is network_failed (EPERM), nothing starts.
  bool may_configure_network = true;
  /// This PID 1 may seed the kernel's CRNG and set its clock (act::Seed): a guest only; a
  /// sandbox's kernel and clock are the machine's. Without it both fields are skipped (logged).
  bool may_seed = true;
};
/// The longest one redial attempt may hold the loop (a vsock connect in progress): ms. The
/// backoff spaces the attempts; a pending signal cuts one short.
inline constexpr std::uint32_t kRedialAttemptMs = 200;

/// One session of the lifecycle channel, from the dial to the final act. Single-threaded; never
/// throws; every input is bounded by the protocol's own limits. Feed it events in the order they
/// happened; perform the returned actions in order (results of Mount/Spawn come back as events).
class Session {
 public:
  explicit Session(SessionOptions o) : opt_(o) {}

  /// Feed one event; returns the actions to perform, in order.
  Actions handle(const Event& e);

  Phase phase() const { return phase_; }
  Stage stage() const { return stage_; }
  /// The descriptor acted on (set once, by the first valid `boot`).
  const std::optional<proto::Boot>& boot() const { return boot_; }
  /// The session's outcome: the first final event sent (mount_failed, start_failed,
  /// workload_exited). Never replaced.
  const std::optional<proto::GuestMessage>& outcome() const { return outcome_; }
  bool channel_open() const { return channel_open_; }
  /// The first dial runs (between ev::Start and ChannelUp or giving up).
  bool dialling() const { return dialling_; }
  /// The channel was lost after boot and is being redialled (boot.reconnect_ms).
  bool reconnecting() const { return reconnecting_; }
  bool workload_alive() const { return workload_pid_ > 0; }
  /// Processes `exec` started or is starting, not yet reported.
  std::size_t execs() const { return execs_.size(); }
  std::int32_t workload_pid() const { return workload_pid_; }
  bool term_sent() const { return term_sent_; }
  /// True while the shutdown waits for every other process to be gone (the loop then reports
  /// NoChildren as soon as waitpid says ECHILD).
  bool waiting_for_children() const {
    return stage_ == Stage::all_term || stage_ == Stage::all_kill;
  }
  /// The final act the session will ask for (descriptor's on_exit.halt wins over the config).
  proto::Halt halt() const;

 private:
  void on(const ev::Start&);
  void on(const ev::ChannelUp&);
  void on(const ev::Line&);
  void on(const ev::Message&);
  void on(const ev::Eof&);
  void on(const ev::MountsDone&);
  void on(const ev::MountFailed&);
  void on(const ev::NetworkFailed&);
  void on(const ev::Started&);
  void on(const ev::StartFailed&);
  void on(const ev::Exited&);
  void on(const ev::Signal&);
  void on(const ev::TimerFired&);
  void on(const ev::NoChildren&);
  void on(const ev::DataUp&);
  void on(const ev::DataFailed&);
  void on(const ev::DataError&);
  void on(const ev::DataLost&);
  act::DialData data_dial(std::uint32_t attempt_ms, bool redial) const;
  void on(const ev::OutputsDone&);
  void on(const ev::DialFailed&);
  void on(const ev::Flushing&);
  void on(const ev::ProcessList&);
  void on(const ev::ResourcesDone&);
  void on_container_resources(const proto::ContainerResourcesRequest& r);
  void on(const ev::ExecStarted&);
  void on(const ev::ExecFailed&);
  void on(const ev::ExecReaped&);
  void on(const ev::ExecOutputsDone&);
  void on(const ev::Held&);
  void on(const ev::ExecClosed&);
  void on_exec(const proto::ExecProcess& x);
  void on_kill_exec(int signo, std::uint16_t proc);
  void report_exec(std::size_t i);  // exec_exited for execs_[i], then CloseExec; erased
  bool survives_loss() const;  // an EOF now starts a reconnect instead of a shutdown
  /// An ack timeout now is a loss (close, redial, the outcome again): reconnect_ms > 0, the
  /// outcome unacknowledged on an open channel, and its window (Timer::ack_window) not over.
  bool keeps_outcome() const;
  void begin_reconnect();
  void resume_channel();
  void give_up_dialling(std::string why);  // the first dial ends without a channel
  void dial_once();                        // act::Dial for the first dial or a redial
  void end_data_dial();                    // stop dialling the data channel (timers cancelled)
  void data_gave_up(std::string reason, int err);  // start_failed: nothing starts
  void mount();                            // act::Mount with the descriptor's shares

  void on_boot(const proto::Boot& b);
  void on_stop(std::string_view why);
  void on_kill(int signo);
  void on_shutdown_msg();

  void send(proto::GuestMessage m);
  void settle(proto::GuestMessage outcome);  // record + send the outcome, then terminal or not
  void note(Severity s, std::string_view phase, std::string text);
  void arm(Timer t, std::uint32_t ms);
  void cancel(Timer t);
  void term_workload();  // the one SIGTERM (if not sent yet)

  void begin_shutdown(std::string reason);
  void enter_all_term();
  void enter_await_ack();
  void enter_flush();
  void bound_flush();    // the flush's own deadlines: no live host holds it
  /// output_end for the workload's streams, once (none without a data channel); `why` is why the
  /// init gives them up ("" for eofs framed). True if lines went to an open channel.
  bool account_workload(const ev::OutputAccount& out, const std::optional<ev::OutputAccount>& err,
                        std::string_view why);
  /// output_end for process `proc`'s streams (no `err`: a terminal's one stream), a warning for
  /// each given up (`why`). Returns which streams were logged (bit 0 stdout, bit 1 stderr).
  unsigned send_accounts(std::uint16_t proc, const ev::OutputAccount& out, const std::optional<ev::OutputAccount>& err,
                         std::string_view why);
  /// Before the final act: the workload's accounts no host confirmed (see acct_confirmed_) are
  /// logged in full, each stream not logged yet, however little was given up.
  void log_unconfirmed_accounts();
  void enter_final();
  void report_held_exit();  // settle the outcome held back for the workload's output

  SessionOptions opt_;
  Actions out_;
  Phase phase_ = Phase::idle_before_channel;
  Stage stage_ = Stage::none;
  bool channel_open_ = false;
  std::optional<proto::Boot> boot_;
  std::int32_t workload_pid_ = 0;  // > 0 while the workload is alive (started, not yet reaped)
  bool term_sent_ = false;         // the workload's one SIGTERM, ever
  bool grace_expired_ = false;     // grace_ms since that SIGTERM have passed
  std::optional<proto::GuestMessage> outcome_;
  bool acked_ = false;             // `shutdown` received after the outcome, or EOF
  bool ack_armed_ = false;
  bool ack_expired_ = false;
  bool armed_[kTimerCount] = {};
  bool outputs_done_ = false;      // stdio: both output streams at EOF
  std::optional<proto::WorkloadExited> held_exit_;  // reaped, waiting for outputs_done_ or drain
  bool started_ever_ = false;      // the workload's exec succeeded (resume.started)
  bool host_shutdown_ = false;     // the host sent `shutdown`: a loss after it is not survived
  bool ack_window_over_ = false;   // Timer::ack_window fired: the outcome is no longer kept
  bool reconnecting_ = false;      // Timer::reconnect runs; Dial / Timer::redial alternate
  std::uint32_t redial_ms_ = kRedialFirstMs;
  bool dialling_ = false;          // the first dial runs: Dial / Timer::redial alternate, Timer::dial bounds it
  std::string channel_;            // the address dialled (ev::Start), for the log
  std::string last_dial_error_;    // the last failed attempt's reason
  unsigned attempts_ = 0;          // attempts of the first dial so far
  bool dialling_data_ = false;     // the data channel's dial runs (boot.stdio, before mounting)
  std::uint32_t data_backoff_ms_ = kRedialFirstMs;
  std::string last_data_error_;    // the last failed data channel attempt: reason and errno
  int last_data_err_ = 0;
  /// Processes `exec` started (or is starting), at most proto::kExecMax.
  struct ExecState {
    std::uint16_t proc = 0;
    std::int32_t pid = 0;            // 0 until ExecStarted
    bool outputs_done = false;
    std::optional<proto::WorkloadExited> held;  // reaped, waiting for outputs_done or exec_drain
    bool container = false;          // started with exec.container (exec.in may name it)
  };
  std::vector<ExecState> execs_;
  bool flush_data_owed_ = false;   // the final flush: the last report said output is still owed
  std::size_t flush_output_bytes_ = 0;  // ... and how much of it is held
  /// The final flush waits for the receipt without a deadline: the host acknowledged the outcome
  /// and its lifecycle channel is connected (docs/protocol.md "The receipt").
  bool flush_held_ = false;
  bool workload_accounted_ = false;  // the workload's output_end went out (or was logged)
  bool data_up_ = false;           // the data channel was connected (boot.stdio)
  bool resuming_data_ = false;     // data channel resume: lost, redialled until Timer::data_reconnect
  ev::Flushing last_flush_;        // the flush's last report: the workload's accounts
  /// The workload's accounts as sent (output_end), which streams' are in the log, and whether a
  /// host confirmed having them: it acknowledged (`shutdown`) an outcome sent after them on the
  /// same connection. Unconfirmed at the final act (a host that died, or hung up unacknowledged),
  /// the init's log is the only record of what it sent, so it is logged (issue 44).
  ev::OutputAccount acct_out_;
  std::optional<ev::OutputAccount> acct_err_;
  unsigned acct_logged_ = 0;       // bit 0 stdout, bit 1 stderr
  bool acct_before_outcome_ = false;  // sent on an open channel before the outcome
  bool acct_confirmed_ = false;
};

}  // namespace nes::init
