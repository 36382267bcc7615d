// The host's per-VM session state machine, sans I/O: events in (a framed guest line, EOF,
// deadlines, vm_started/vm_exited, record durable, API calls), actions out (send a message, write
// the record, close, arm a timer, call a hook, log an event). host/lib/host.cpp is the thin Asio loop
// around it: it frames the guest's bytes (proto::LineReader) and encodes what it sends, as
// nesinit's loop does around the init's session. Why it behaves as it does: docs/host.md.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "host/lib/record.hpp"
#include "host/lib/base.hpp"
#include "protocol/line_reader.hpp"
#include "protocol/messages.hpp"

namespace nes::host {

/// A host's `boot.stdio.replay_bytes` when it turns data channel resume on and the descriptor
/// names none: the descriptor's buffer_bytes, at least this (bytes). Why this size:
/// docs/protocol.md "Data channel resume".
inline constexpr std::uint32_t kReplayBytesDefault = 1u << 20;

/// What happens to the VM once its outcome is durable (docs/host.md "on_exit").
/// stop: send `shutdown`, wait for vm_exited, past the stop deadline call destroy.
/// keep: nothing; the VM stays up until shutdown() (the guest is booted with terminal=false).
/// remove: as stop, then the remove hook once the record is durable and the VM has exited.
enum class OnExitPolicy { stop, keep, remove };
std::string_view to_string(OnExitPolicy p);
std::optional<OnExitPolicy> on_exit_from_string(std::string_view s);

/// One VM generation as the embedder registers it.
struct SessionConfig {
  std::string vm;                    // identity (from the endpoint, never from guest data)
  std::uint64_t generation = 1;      // the embedder's restart counter; newer wins on disk
  /// Sent after `ready`; on_exit.terminal is overridden, and a realtime_ns that is set becomes
  /// the wall clock at the moment it is sent.
  proto::Boot descriptor;
  OnExitPolicy on_exit = OnExitPolicy::stop;
  std::chrono::milliseconds ready_timeout{30000};  // from vm_started to `ready`
  std::chrono::milliseconds stop_timeout{10000};   // shutdown sent -> vm_exited, else destroy
  /// Ending a running workload (shutdown(), the wall limit): `stop` (its SIGTERM), then this long
  /// for its outcome, then `shutdown` (the guest escalates to SIGKILL). As `docker stop -t`.
  std::chrono::milliseconds grace{10000};
  std::optional<std::chrono::milliseconds> wall_timeout;  // host's limit -> outcome `timeout`
  /// The limit runs from the workload's first `started` (an earlier v2 revision never sends one:
  /// then from `boot`, which also bounds the mounts) instead of from vm_started (the whole VM's);
  /// `neshost run --timeout`. Armed at most twice (boot, first `started`), never re-armed later.
  bool wall_from_started = false;
  /// Channel survival (docs/protocol.md "Channel survival"): sent as boot.reconnect_ms (with the
  /// VM and generation). A stream lost after `boot` is then no outcome yet: the guest has this
  /// long to redial with a resumed `ready` (plus kReconnectSlack), else `channel_lost`. 0: off.
  std::chrono::milliseconds reconnect{0};
  /// Data channel resume (docs/protocol.md "Data channel resume") with `reconnect` > 0, when the
  /// guest lists `data_resume`. false: the data channel is not resumed (its loss is counted, as
  /// without `reconnect`).
  bool data_resume = true;
  /// Take over a generation an earlier host process booted (its state dir): send no `boot`;
  /// accept only a resumed `ready` naming this VM and generation; ready_timeout bounds the wait.
  bool resume = false;
  /// A generation taken over (`resume`): when its VM started, as the host process that started
  /// it recorded (neshost's vmm.json): vm_started() keeps it instead of its own `now`, so the
  /// record's started_at is the VM's start, not the takeover's. Unset: vm_started's `now`.
  std::optional<WallTime> started_at;
  /// A generation taken over (`resume`) under a wall limit: what is left of the deadline the
  /// host process before armed (its recorded deadline minus now; zero or less: already due).
  /// vm_started() arms the wall timer with it, so the limit ends the workload when it would have
  /// under the first host (a later first `started` re-arms it with wall_timeout, as there).
  /// wall_timeout must be set too (the outcome's reason names it). Unset: nothing armed.
  std::optional<std::chrono::milliseconds> wall_left;
  /// A VM restored from a snapshot (host/vm/snapshot.hpp): the `ready` line (without its '\n')
  /// its guest sent before the VM was saved; that guest waits for its descriptor and will not say
  /// it again. The first stream takes it as its first line, checked as any `ready` is. Unset:
  /// the guest speaks first, as always.
  std::optional<std::string> saved_ready;
  std::size_t line_cap = proto::kDefaultLineCap;          // bytes per guest line
  /// The bound the guest gets to count what it could not deliver and power off once the host
  /// closed the data channel early at the stop deadline (act::CutOutput). Host::add_vm sets it
  /// from HostOptions::data_drain. ms.
  std::chrono::milliseconds data_drain{2000};
  /// How long a process exec() started may go without its exec_started (an init that predates
  /// `exec` never answers): then it ends `lost`. Host::add_vm sets it (Host::kExecAnswerWait). ms.
  std::chrono::milliseconds exec_answer_wait{10000};
};

/// A process Session::exec() started whose end will never be reported: the guest's stream closed,
/// the session ended, or no answer came in time. `reason` says which.
struct ExecLost {
  std::string reason;
};
/// How a process exec() started ended: the guest's exec_exited, its exec_failed (the process
/// never ran), or lost.
using ExecEnd = std::variant<proto::ExecExited, proto::ExecFailed, ExecLost>;

/// The session's lifecycle, in order (docs/host.md "The session's phases"). Never goes back.
/// awaiting_ready: no `ready` yet (the ready deadline runs from vm_started). ready: a `ready`
/// came (the deadline is met) but no `boot` went out (version mismatch, shutdown before boot).
/// booted: a `boot` went out, or a session resumed. finished: nothing more happens.
enum class Phase { awaiting_ready, ready, booted, finished };
/// The stop deadline once the VM is to end: idle (not armed), awaiting_exit (shutdown under way,
/// waiting for vm_exited), destroyed (CallDestroy went out, waiting once more), gave_up.
enum class StopPhase { idle, awaiting_exit, destroyed, gave_up };
/// The host's `stop` of a running workload and the `shutdown` after it: unarmed, running (the
/// grace timer), over (the `shutdown` may follow).
enum class Grace { unarmed, running, over };
/// The outcome's record: none (no outcome), writing (WriteRecord out), durable, failed.
enum class RecordState { none, writing, durable, failed };
/// Who asked for the VM's end, strongest last (it only rises): none, policy (on_exit after the
/// durable record), host (shutdown() after the outcome, or the wall limit), host_before_outcome
/// (shutdown() before any outcome: a lost stream is then `stopped`, not `channel_lost`).
enum class Ending { none, policy, host, host_before_outcome };
/// The current guest stream: closed (none), connected (no `ready` on it), ready, booted (a
/// `boot` went out on it, or it resumed).
enum class Link { closed, connected, ready, booted };
/// The `shutdown` sent on the current stream: none, request (the host's, before the guest's
/// report), ack (after its report, the record durable: the guest powers off on it).
enum class ShutdownSent { none, request, ack };
/// What is known of the current guest stream; a new stream (or a restarted guest's second
/// `ready`) starts from {}.
struct StreamState {
  Link link = Link::closed;
  bool reported = false;   // the guest sent its final report: any `shutdown` from now on is its ack
  bool stop_sent = false;  // `stop` went out (independent of the shutdown: one may go without the other)
  ShutdownSent shutdown = ShutdownSent::none;
};
/// The data channel as the loop sees it when a deadline fires (the session keeps no I/O):
/// `open`, and `moving`: output still flows (reads paused for a slow consumer, bytes unread in
/// the socket, or bytes read since the timer was armed; DataLink::moving()).
struct DataLinkState {
  bool open = false;
  bool moving = false;
};

/// The session's timers. `stop` runs twice at most: destroy, then give up waiting. `grace`: from
/// the host's `stop` of a running workload to the `shutdown` that follows it. `reconnect`: from a
/// lost stream (SessionConfig::reconnect > 0) to giving up on the guest's redial.
enum class TimerKind { ready, wall, stop, grace, reconnect };
/// How many TimerKinds there are: the loop keeps one timer per kind in a table of this size.
inline constexpr std::size_t kTimerKinds = static_cast<std::size_t>(TimerKind::reconnect) + 1;
/// Added to the guest's reconnect window before the host gives up: its backoff and a dial
/// through the VMM may take a little longer than the window itself. ms.
inline constexpr std::chrono::milliseconds kReconnectSlack{2000};

namespace act {
struct Send { proto::HostMessage msg; };                // the loop encodes it (protocol/codec.hpp)
struct CloseStream {};                                  // stop reading/writing the guest stream
struct ArmTimer { TimerKind kind; std::chrono::milliseconds after; };
struct CancelTimer { TimerKind kind; };
struct WriteRecord { Record record; };                  // make durable (worker pool)
struct CallDestroy {};                                  // embedder: kill the VMM
struct CallRemove {};                                   // embedder: delete the VM's resources
/// The events an embedder acts on, typed (never by matching log text); the rest are `other`.
enum class Milestone {
  other, connected, ready, started, outcome, recorded, finished,
  data_connected, data_error,  // the data channel (Host emits these, never the Session)
};
/// One event for humans/CLI: `kind` a snake_case tag, `detail` escaped text, `milestone` typed.
struct Log { std::string kind; std::string detail; Milestone milestone = Milestone::other; };
struct Finished {};                                     // nothing more happens for this VM
struct Processes { proto::Processes list; };            // the guest's answer to list_processes()
struct Resources { proto::ContainerResourcesReply reply; };  // ... to container_resources()
/// What the guest said of a process exec() started: exec_started, exec_failed or exec_exited.
struct ExecReport { std::variant<proto::ExecStarted, proto::ExecFailed, proto::ExecExited> report; };
/// The guest's account of one output stream (protocol `output_end`: sent, unsent); the owner,
/// which knows the bytes it received, computes the exact loss (0: the stream arrived whole).
struct OutputEnd { proto::OutputEnd report; };
/// End the wait for the workload's output on purpose: close the data channel before its eofs
/// (the guest counts what it could not deliver, `output_lost`). `reason` goes into the record's
/// lost_reason and the `output_cut` event. A no-op when the data channel is already closed.
struct CutOutput { std::string reason; };
/// Arm (again) the timer of process `proc` exec() started: first its answer's bound
/// (exec_answer_wait), after its exec_exited the window for its last output (data_drain). The
/// loop reports it with exec_timer_fired(); arming replaces the one before.
struct ArmExecTimer { std::uint16_t proc; std::chrono::milliseconds after; };
/// Process `proc` has ended: the loop settles its output, calls its `ended` hook, forgets it.
/// Always last of its actions, once.
struct ExecEnded { std::uint16_t proc; ExecEnd end; };
/// The answer came (exec_started): the timer of process `proc` stops until its exec_exited.
struct CancelExecTimer { std::uint16_t proc; };
}  // namespace act

using Action = std::variant<act::Send, act::CloseStream, act::ArmTimer, act::CancelTimer,
                            act::WriteRecord, act::CallDestroy, act::CallRemove, act::Log,
                            act::Finished, act::Processes, act::ExecReport, act::OutputEnd,
                            act::CutOutput, act::ArmExecTimer, act::CancelExecTimer,
                            act::ExecEnded, act::Resources>;

/// The state machine. Not thread-safe: one owner feeds it events and executes take()'s actions
/// in order. It holds no guest bytes: the owner frames them (feed_lines() below, with a
/// proto::LineReader of config().line_cap per stream, so at most line_cap + 1 bytes of one
/// unfinished line); memory here is a handful of short strings whatever the guest sends.
class Session {
 public:
  explicit Session(SessionConfig cfg);

  // ---- events ----
  /// The VMM process started: the ready deadline starts now.
  void vm_started(WallTime now);
  /// A guest stream was connected. false: refuse it (a live stream exists, or the session is over).
  bool stream_opened(WallTime now);
  /// One framed line of the guest stream (the owner's proto::LineReader, cap config().line_cap):
  /// its text is decoded here; a too_long one is a protocol error naming its length.
  void line(const proto::Line& l, WallTime now);
  /// The guest's unfinished line passed line_cap (LineReader::dropping()): an endless line is
  /// judged now, not at a '\n' that may never come. Repeats before its '\n' are ignored.
  void line_overflow(WallTime now);
  /// EOF or a read error on the guest stream. `unfinished`: bytes of a line it cut short
  /// (LineReader::pending()), 0 if it ended between lines.
  void stream_closed(std::size_t unfinished, WallTime now);
  /// A timer armed by ArmTimer expired. `data`: the data channel's state now (the stop deadline
  /// decides on it: output still moving restarts it unless the host ends the VM on purpose; a
  /// channel at rest, or one the host ends, is cut once there is an outcome or the host asked,
  /// and the guest gets data_drain to power off; docs/host.md "Output lost").
  void timer_fired(TimerKind k, WallTime now, DataLinkState data = {});
  /// The VMM process exited (only the embedder knows).
  void vm_exited(WallTime now);
  /// The record is durable; `on_disk` is what is on disk (maybe an earlier record of this
  /// generation, which wins).
  void record_durable(const Record& on_disk);
  /// The record could not be made durable (after bounded retries), or a newer generation is on disk.
  void record_failed(std::string error);
  /// The durable record was amended after the outcome (amend_record(): what was lost of the
  /// output); `on_disk` replaces outcome() if it is of this generation and the record is durable.
  void record_amended(const Record& on_disk);
  /// The data channel closed before the workload's output ended (the host closed it early, or it
  /// failed): the guest reports what it could not deliver (`output_lost`) on this stream, so a
  /// vm_exited from now on reads the stream to its EOF first (bounded by stop_timeout) instead of
  /// finishing at once.
  void expect_output_reports();
  /// One of the streams of process `proc` (exec'd) reached its eof on the data channel.
  void exec_eof(std::uint16_t proc, proto::Stream stream);
  /// The timer of process `proc` (act::ArmExecTimer) expired; `data` as for timer_fired(). After
  /// its exec_exited, output still moving restarts the window; else it ends (exited, or lost
  /// when no answer came).
  void exec_timer_fired(std::uint16_t proc, DataLinkState data);
  /// The data channel (workload stdio) connected.
  void data_opened();
  /// `boot.stdio.replay_bytes` this session sent (0: data channel resume off). A host of this
  /// project turns it on with `reconnect` > 0, a descriptor with stdio and a guest whose ready
  /// lists `data_resume`: the descriptor's value, else its buffer_bytes, at least kReplayDefault.
  std::uint32_t replay_bytes() const { return replay_bytes_; }
  /// The data channel closed (either side, or failed). `outputs_done`: the workload's eofs had
  /// all arrived; if not, the guest reports what it could not deliver (expect_output_reports()).
  /// Processes exec() started lose their streams with it: those already exited end now.
  void data_closed(bool outputs_done);

  // ---- API ----
  /// The workload's terminal size, rows x cols (each >= 1), before `boot` went out: the
  /// descriptor's stdio.terminal takes it, so the workload starts at that size. false (nothing
  /// changed) once boot was sent, or when the descriptor asks for no terminal.
  bool set_terminal_size(std::uint16_t rows, std::uint16_t cols);
  /// Ask the guest to SIGTERM the workload (sent at once, or right after the boot descriptor).
  Status stop();
  /// Send `signal` (1..64) to the workload's process group; needs a booted session. After the
  /// outcome, with the data channel open, it also cuts the output still owed (act::CutOutput).
  Status kill(int signal);
  /// Ask the guest for its processes (`list_processes`); the answer is act::Processes. Needs a
  /// guest that sent `ready` on an open stream.
  Status list_processes();
  /// Ask the guest to update (r.update) and read the cgroup of a running container
  /// (`container_resources`, docs/protocol.md "Container resources"); the answer is
  /// act::Resources. Refused naming the feature when the guest's init lacks "container_stats"
  /// (or "container_update" with an update).
  Status container_resources(const proto::ContainerResourcesRequest& r);
  /// Start another process in the guest (`exec`, docs/protocol.md "Exec"); its reports come as
  /// act::ExecReport, its end as act::ExecEnded (after its output: its eofs, or data_drain after
  /// its exec_exited while no output moves). Needs a booted session on an open stream whose
  /// outcome is not in yet.
  Status exec(const proto::ExecProcess& x);
  /// Send `signal` (1..64) to the group of process `proc` (exec'd); needs a booted session.
  Status kill_exec(int signal, std::uint16_t proc);
  /// End the session. A running workload first gets `stop`, then `grace` for its outcome, then
  /// `shutdown`; a `shutdown` after the guest's outcome is its ack, so it goes out only once the
  /// record is durable, and never for a record that failed (the guest then powers off after its
  /// own ack_timeout_ms; past the stop deadline the VM is destroyed). Waits for vm_exited.
  /// After the outcome, with the data channel open, the output still owed is cut (act::CutOutput).
  Status shutdown(WallTime now);

  // ---- state ----
  /// Actions produced so far, in order; clears the queue.
  std::vector<Action> take();
  /// The final outcome, once there is one (not necessarily durable yet).
  const std::optional<Record>& outcome() const { return outcome_; }
  bool durable() const { return record_ == RecordState::durable; }
  bool finished() const { return phase_ == Phase::finished; }
  bool stream_open() const { return stream_.link != Link::closed; }
  /// The embedder reported vm_exited.
  bool vm_gone() const { return vm_exited_; }
  /// The host ends this VM on purpose: shutdown() was called, or the wall limit fired (not the
  /// on_exit policy after the workload's own end). Its stop deadline then cuts output still owed
  /// instead of waiting for a slow consumer (docs/host.md "Output lost").
  bool ended_by_host() const { return ending_ >= Ending::host; }
  /// The stream was lost inside the reconnect window: the guest may still resume.
  bool awaiting_redial() const { return awaiting_redial_; }
  Phase phase() const { return phase_; }
  StopPhase stop_phase() const { return stop_phase_; }
  RecordState record_state() const { return record_; }
  const StreamState& stream() const { return stream_; }
  const SessionConfig& config() const { return cfg_; }
  /// When vm_started() was first reported (SessionConfig::started_at if set): the record's
  /// started_at. nullopt before it.
  const std::optional<WallTime>& started_at() const { return started_at_; }

 private:
  void handle_message(const proto::GuestMessage& m, WallTime now);
  void handle_resume(const proto::Resume& r, WallTime now);
  /// Refuse the current stream (a fencing violation): log `kind` with `why`, close it, and go on
  /// as after its loss (after_stream_loss). Nothing of the refused line is recorded.
  void refuse_stream(std::string kind, std::string why, WallTime now);
  /// What a lost stream means, given what it was (`was`) and the bytes of a line it cut short:
  /// nothing (it carried no session), a redial window (channel survival), or channel_lost
  /// (`cause` its reason; empty: the stream closed).
  void after_stream_loss(const StreamState& was, std::size_t unfinished, WallTime now,
                         std::string cause = {});
  void handle_ready(const proto::Ready& r, WallTime now);
  void exec_report(const std::variant<proto::ExecStarted, proto::ExecFailed, proto::ExecExited>& r);
  void finalize(proto::Outcome o, std::optional<std::uint8_t> code, std::optional<std::uint8_t> sig,
                std::optional<proto::StartFailClass> cls, std::string reason, WallTime now);
  void protocol_violation(std::string reason, WallTime now);
  void send(const proto::HostMessage& m);
  void send_boot(WallTime now);
  void close_stream();
  void begin_shutdown();
  void request_end();
  void maybe_send_shutdown();
  void lost(std::string reason, WallTime now);
  void maybe_finish();
  void finish(bool allow_remove);
  void arm(TimerKind k, std::chrono::milliseconds after);
  void arm_exec(std::uint16_t proc, std::chrono::milliseconds after);
  void end_exec(std::uint16_t proc, ExecEnd end);
  void end_all_execs(const std::string& why);
  void stop_deadline(WallTime now, DataLinkState data);
  bool stop_deadline_on_output(DataLinkState data);
  void reach(Phase p) { if (phase_ < p) phase_ = p; }
  void raise(Ending e) { if (ending_ < e) ending_ = e; }
  bool record_settled() const { return record_ == RecordState::durable || record_ == RecordState::failed; }
  bool link_at_least(Link l) const { return stream_.link >= l; }
  void log_limited(std::uint64_t& counter, std::string kind, std::string detail);
  void log(std::string kind, std::string detail);
  void log_guest(std::string kind, std::string detail);  // a guest-triggered event: rate-limited

  SessionConfig cfg_;
  bool ready_taken_ = false;  // SessionConfig::saved_ready was taken (by the first stream)
  std::vector<Action> out_;
  std::optional<WallTime> started_at_;
  std::optional<Record> outcome_;
  std::uint64_t lines_ = 0;             // lines seen on the current stream
  bool overflowed_ = false;             // the unfinished line was judged over the cap
  std::uint64_t unknown_ = 0;           // unknown-type lines skipped
  std::uint64_t ignored_ = 0;           // lines ignored after the outcome
  std::vector<std::pair<std::string, std::uint64_t>> guest_logs_;  // per guest-triggered kind
  // The lifecycle and its per-concern states (see the enums above).
  Phase phase_ = Phase::awaiting_ready;
  StopPhase stop_phase_ = StopPhase::idle;
  Grace grace_ = Grace::unarmed;
  RecordState record_ = RecordState::none;
  Ending ending_ = Ending::none;
  StreamState stream_;
  std::chrono::milliseconds stop_after_{0};  // the stop deadline's last arming (restarted as is)
  // Independent facts, each with its own source and no order among them:
  bool stop_pending_ = false;     // the API's stop() before boot (sent with the next boot/resume)
  bool awaiting_redial_ = false;  // a reconnect window is open: spans a new stream until it resumes
  bool wall_at_boot_ = false;     // the wall limit was armed at the first `boot` (once)
  bool wall_at_started_ = false;  // ... and moved to the first `started` (once; a resumed session
                                  // sees `started` without a `boot` of ours)
  bool vm_exited_ = false;        // the embedder's vm_exited
  bool await_reports_ = false;    // read the stream to EOF after vm_exited (output reports owed)
  bool data_resume_ = false;      // the guest's ready lists data_resume
  std::uint32_t replay_bytes_ = 0;  // boot.stdio.replay_bytes as sent (0: data channel resume off)
  bool data_open_ = false;        // the data channel is connected (data_opened/data_closed)
  bool stop_deferred_said_ = false;  // the stop deadline's restart was logged (once)
  /// After vm_exited with the stream still open: lines_ when the stop deadline was last armed,
  /// and how often it restarted because lines still arrived (a loaded host reading the guest's
  /// last backlog), at most kExitRestartsMax times.
  std::uint64_t lines_at_exit_arm_ = 0;
  unsigned exit_restarts_ = 0;
  static constexpr unsigned kExitRestartsMax = 10;
  /// A process exec() started, until its end (act::ExecEnded).
  struct ExecState {
    bool has_stdio = false;  // its own streams on the data channel
    bool terminal = false;   // one stream (stdout) only
    bool started = false;    // exec_started came
    bool out_eof = false, err_eof = false;
    std::optional<proto::ExecExited> exited;  // reported; its output may still be on its way
    std::chrono::milliseconds window{0};      // its timer's last arming (restarted as is)
    bool wait_said = false;                   // exec_output_wait logged (once)
    bool outputs_done() const { return !has_stdio || (out_eof && (err_eof || terminal)); }
  };
  std::map<std::uint16_t, ExecState> execs_;
  /// The guest's `ready.features` (unset: an init that predates the field, with none of them).
  std::optional<std::vector<std::string>> features_;
};

/// The owner's half of framing (host.cpp's read loop, the sans-I/O tests, the fuzzer): feed
/// `bytes` (any split) to the stream's `reader`, hand `s` each framed line, then report an
/// unfinished line past the cap. The reader is the stream's: a new one (cap
/// config().line_cap) for every stream the session accepts.
void feed_lines(Session& s, proto::LineReader& reader, std::string_view bytes, WallTime now);

}  // namespace nes::host
