#include "host/lib/host.hpp"

#include <sys/socket.h>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/generic/stream_protocol.hpp>
#include <boost/asio/local/stream_protocol.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/redirect_error.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/thread_pool.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/asio/write.hpp>
#include <deque>
#include <filesystem>
#include <fmt/format.h>
#include <map>
#include <mutex>
#include <set>

#include "host/lib/signals_blocked.hpp"
#include "host/lib/state_dir.hpp"
#include "protocol/codec.hpp"

namespace nes::host {

namespace asio = boost::asio;
using boost::system::error_code;
using generic_stream = asio::generic::stream_protocol;
using unix_acceptor = asio::local::stream_protocol::acceptor;
using generic_acceptor = asio::basic_socket_acceptor<generic_stream>;

namespace detail {

/// One guest byte stream (Unix, vsock, or handed-in fd), framed by its own reader.
struct Stream {
  Stream(asio::io_context& io, int fd, int family, std::size_t line_cap)
      : sock(io), flush_timer(io), reader(line_cap) {
    error_code ec;
    sock.assign(generic_stream(family, 0), fd, ec);
    if (ec) ::close(fd);
  }
  generic_stream::socket sock;
  asio::steady_timer flush_timer;  // bounds the final flush before close
  proto::LineReader reader;        // the guest's lines: at most line_cap + 1 bytes of one held
  std::deque<std::string> outq;
  std::size_t out_bytes = 0;
  bool writing = false;
  bool closed = false;          // the session is done with it (no more events from it)
  bool close_after_flush = false;
};

/// One registered VM generation and its I/O objects.
struct Vm {
  Vm(asio::io_context& io, SessionConfig cfg) : core(std::move(cfg)) {
    timers.reserve(kTimerKinds);
    for (std::size_t i = 0; i < kTimerKinds; ++i) timers.emplace_back(io);
  }
  Session core;
  std::shared_ptr<Stream> stream;
  std::shared_ptr<unix_acceptor> acceptor;
  std::string socket_path;  // unlinked when the session finishes
  /// The session's timers, one slot per TimerKind (indexed by it): every timer the session can
  /// arm is here, so cancel_all() cannot forget one. `seq` tells a stale completion from the
  /// current arming; `mark` is DataLink::bytes_in() when it was armed (output moving since).
  struct TimerSlot {
    explicit TimerSlot(asio::io_context& io) : timer(io) {}
    asio::steady_timer timer;
    std::uint64_t seq = 0;
    std::uint64_t mark = 0;
  };
  std::vector<TimerSlot> timers;
  std::vector<std::function<void(WaitResult)>> waiters;
  std::optional<WaitResult> result;  // settled: durable record, or why not
  bool draining = false;
  // The data channel (workload stdio) and the built-in log.
  std::shared_ptr<unix_acceptor> data_acceptor;
  std::string data_socket_path;
  std::shared_ptr<DataLink> data;
  bool data_ever = false;
  /// A data connection that came before the boot went out (QEMU connects a virtio port's
  /// chardev as the VM starts): adopted once it has (Impl::drain), since whether the channel
  /// resumes is the boot's word (boot.stdio.replay_bytes). AF_UNIX or AF_VSOCK.
  Fd parked_data;
  int parked_family = 0;
  /// Data channel resume (docs/protocol.md "Data channel resume"): what outlives one data
  /// connection; null while resume is off or no connection came yet.
  std::shared_ptr<DataResume> resume;
  bool output_paused = false;
  std::optional<std::pair<std::uint16_t, std::uint16_t>> pending_resize;  // rows, cols for the data channel
  std::shared_ptr<AsyncLog> log;
  bool finishing = false;  // "finished" is held until the data channel and the log are closed
  std::function<void()> data_finished_cb;  // run once the data channel has closed
  bool workload_started = false;  // `started` seen: the workload's streams were live
  // Output the host did not deliver (docs/host.md "Output lost"). The guest's output_lost
  // reports, by (proc, stream): once each; kept here until that stream's data has ended on this
  // side (the data channel closed, or the exec'd process ended), when `received` is final.
  std::map<std::pair<std::uint16_t, proto::Stream>, proto::OutputEnd> loss_pending;
  std::set<std::pair<std::uint16_t, proto::Stream>> loss_reported;
  Record loss;             // the workload's lost, truncated and lost_reason, for the amendment
  std::string cut_reason;  // why the data channel closed before the workload's output ended
  // Host::async_list_processes requests waiting for the guest's `processes`, oldest first; each
  // with its deadline's timer.
  struct ProcessWaiter {
    std::function<void(Result<proto::Processes>)> handler;
    std::shared_ptr<asio::steady_timer> deadline;
  };
  std::deque<ProcessWaiter> process_waiters;
  // Host::async_container_resources requests waiting for the guest's answer, oldest first.
  struct ResourceWaiter {
    std::function<void(Result<proto::ContainerResourcesReply>)> handler;
    std::shared_ptr<asio::steady_timer> deadline;
  };
  std::deque<ResourceWaiter> resource_waiters;
  // Processes exec() started and not yet ended, by process number.
  struct ExecProc {
    ExecHooks hooks;
    bool has_stdio = false;
    bool started = false;
    bool terminal = false;
    std::optional<proto::ExecExited> exited;     // reported (ends it if it is superseded first)
    std::shared_ptr<asio::steady_timer> timer;   // act::ArmExecTimer's: the answer's bound, then the output's
    std::uint64_t mark = 0;                      // DataLink::bytes_in() when `timer` was armed
  };
  std::map<std::uint16_t, ExecProc> execs;
  std::uint16_t next_proc = 1;

  const std::string& id() const { return core.config().vm; }
  std::uint64_t generation() const { return core.config().generation; }
  TimerSlot& timer(TimerKind k) { return timers.at(static_cast<std::size_t>(k)); }
  /// Cancel every timer this VM has armed: the session's (each TimerKind), each exec'd process's
  /// and each async_list_processes deadline. Their completions then see a stale seq (or an
  /// aborted wait) and do nothing; none is left holding the VM.
  void cancel_all() {
    for (auto& t : timers) {
      ++t.seq;
      t.timer.cancel();
    }
    for (auto& [proc, x] : execs)
      if (x.timer) x.timer->cancel();
    for (auto& w : process_waiters) w.deadline->cancel();
    for (auto& w : resource_waiters) w.deadline->cancel();
  }
};

/// The group commit of the host's state dir: outcomes that become final while a batch is being
/// written queue here and are written together as a next batch (write_records), sharing its
/// journal commits and cache flushes. Up to `writers` batches are in flight on the worker pool, so
/// one batch is prepared and written while another waits for its fsyncs; a lone record goes at once.
struct RecordQueue {
  using Done = std::function<void(Result<WriteResult>)>;
  std::mutex mu;
  std::deque<std::pair<Record, Done>> pending;  // bounded by the registered VMs (one each)
  std::size_t running = 0;                      // drain jobs taking batches from `pending`
  std::size_t writers = 2;                      // at most this many

  /// Queue a record; true if the caller must start a drain job for it.
  bool push(Record r, Done done) {
    std::lock_guard<std::mutex> l(mu);
    pending.emplace_back(std::move(r), std::move(done));
    if (running >= writers) return false;
    ++running;
    return true;
  }

  /// Write batches until the queue is empty. On a worker thread; `done` runs there too.
  static void drain(const std::shared_ptr<RecordQueue>& q, const std::filesystem::path& dir,
                    const WriteOptions& opt) {
    for (;;) {
      std::vector<Record> batch;
      std::vector<Done> dones;
      {
        std::lock_guard<std::mutex> l(q->mu);
        if (q->pending.empty()) {
          --q->running;
          return;
        }
        while (!q->pending.empty() && batch.size() < std::max<std::size_t>(1, opt.batch_records)) {
          batch.push_back(std::move(q->pending.front().first));
          dones.push_back(std::move(q->pending.front().second));
          q->pending.pop_front();
        }
      }
      auto res = write_records(dir, batch, opt);
      for (std::size_t i = 0; i < dones.size(); ++i) dones[i](std::move(res[i]));
    }
  }
};

}  // namespace detail

using detail::RecordQueue;
using detail::Stream;
using detail::Vm;

struct Host::Impl : std::enable_shared_from_this<Host::Impl> {
  Impl(asio::io_context& io_, HostOptions opt_)
      : io(io_), opt(std::move(opt_)), pool(std::max<std::size_t>(1, opt.writer_threads) + 1) {
    records->writers = std::max<std::size_t>(1, opt.writer_threads);
  }

  asio::io_context& io;
  HostOptions opt;
  asio::thread_pool pool;
  std::shared_ptr<RecordQueue> records = std::make_shared<RecordQueue>();
  std::map<std::string, std::shared_ptr<Vm>> vms;
  CidRegistry cids;
  std::shared_ptr<generic_acceptor> vsock;
  std::shared_ptr<generic_acceptor> vsock_data;

  std::shared_ptr<Vm> find(const std::string& vm) const {
    auto it = vms.find(vm);
    return it == vms.end() ? nullptr : it->second;
  }
  bool current(const std::shared_ptr<Vm>& vm) const { return find(vm->id()) == vm; }

  void emit(const Vm& vm, std::string kind, std::string detail,
            act::Milestone m = act::Milestone::other) {
    if (!opt.on_event) return;
    std::optional<proto::Outcome> o;
    if (vm.core.outcome() && (m == act::Milestone::outcome || m == act::Milestone::recorded))
      o = vm.core.outcome()->outcome;
    opt.on_event(Event{vm.id(), vm.generation(), std::move(kind), std::move(detail), m, o});
  }

  // ---- actions ----

  void drain(const std::shared_ptr<Vm>& vm) {
    if (vm->draining) return;  // a hook re-entered: the outer loop picks up the new actions
    vm->draining = true;
    for (;;) {
      auto acts = vm->core.take();
      if (acts.empty()) break;
      for (auto& a : acts) execute(vm, a);
    }
    vm->draining = false;
    if (vm->parked_data && (vm->core.phase() >= Phase::booted || vm->finishing)) {
      const int family = vm->parked_family;
      adopt_data(vm, vm->parked_data.release(), family);  // refused if the session is over
      drain(vm);
    }
  }

  void execute(const std::shared_ptr<Vm>& vm, Action& a) {
    std::visit(
        [&](auto& x) {
          using T = std::decay_t<decltype(x)>;
          if constexpr (std::is_same_v<T, act::Send>) {
            send(vm, proto::encode_line(x.msg));
          } else if constexpr (std::is_same_v<T, act::CloseStream>) {
            close_stream(vm);
          } else if constexpr (std::is_same_v<T, act::ArmTimer>) {
            arm(vm, x.kind, x.after);
          } else if constexpr (std::is_same_v<T, act::CancelTimer>) {
            auto& t = vm->timer(x.kind);
            ++t.seq;
            t.timer.cancel();
          } else if constexpr (std::is_same_v<T, act::WriteRecord>) {
            write(vm, std::move(x.record));
          } else if constexpr (std::is_same_v<T, act::CallDestroy>) {
            if (opt.hooks.destroy) opt.hooks.destroy(vm->id(), vm->generation());
          } else if constexpr (std::is_same_v<T, act::CallRemove>) {
            if (opt.hooks.remove) opt.hooks.remove(vm->id(), vm->generation());
          } else if constexpr (std::is_same_v<T, act::Log>) {
            if (x.milestone == act::Milestone::finished) return finish_data(vm, std::move(x.detail));
            if (x.milestone == act::Milestone::started) vm->workload_started = true;
            emit(*vm, std::move(x.kind), std::move(x.detail), x.milestone);
          } else if constexpr (std::is_same_v<T, act::Finished>) {
            finished(vm);
          } else if constexpr (std::is_same_v<T, act::Processes>) {
            answer_processes(vm, std::move(x.list));
          } else if constexpr (std::is_same_v<T, act::Resources>) {
            answer_resources(vm, std::move(x.reply));
          } else if constexpr (std::is_same_v<T, act::ExecReport>) {
            exec_report(vm, std::move(x.report));
          } else if constexpr (std::is_same_v<T, act::OutputEnd>) {
            output_end(vm, x.report);
          } else if constexpr (std::is_same_v<T, act::CutOutput>) {
            cut_output(vm, std::move(x.reason));
          } else if constexpr (std::is_same_v<T, act::ArmExecTimer>) {
            arm_exec_timer(vm, x.proc, x.after);
          } else if constexpr (std::is_same_v<T, act::CancelExecTimer>) {
            if (auto it = vm->execs.find(x.proc); it != vm->execs.end() && it->second.timer) it->second.timer->cancel();
          } else if constexpr (std::is_same_v<T, act::ExecEnded>) {
            end_exec(vm, x.proc, std::move(x.end));
          }
        },
        a);
  }

  void send(const std::shared_ptr<Vm>& vm, std::string line) {
    auto st = vm->stream;
    if (!st || st->closed) return;
    if (st->out_bytes + line.size() > opt.send_cap) {
      emit(*vm, "send_dropped", "the guest is not reading");
      return;
    }
    st->out_bytes += line.size();
    st->outq.push_back(std::move(line));
    start_write(st);
  }

  static void hard_close(const std::shared_ptr<Stream>& st) {
    error_code ec;
    st->flush_timer.cancel();
    st->sock.close(ec);
    st->outq.clear();
    st->out_bytes = 0;
  }

  static void start_write(const std::shared_ptr<Stream>& st) {
    if (st->writing || st->outq.empty() || !st->sock.is_open()) return;
    st->writing = true;
    asio::async_write(st->sock, asio::buffer(st->outq.front()), [st](error_code ec, std::size_t) {
      st->writing = false;
      if (ec) {
        // The guest went away; the read side reports it. Nothing more can be sent.
        st->outq.clear();
        st->out_bytes = 0;
        if (st->close_after_flush) hard_close(st);
        return;
      }
      st->out_bytes -= st->outq.front().size();
      st->outq.pop_front();
      if (st->outq.empty() && st->close_after_flush) {
        hard_close(st);
        return;
      }
      start_write(st);
    });
  }

  void close_stream(const std::shared_ptr<Vm>& vm) {
    auto st = std::exchange(vm->stream, nullptr);
    if (!st) return;
    fail_process_waiters(vm, "list_processes: the guest's stream closed before it answered");
    st->closed = true;
    error_code ec;
    // Stop reading now; let queued lines (e.g. the `shutdown` ack) go out, bounded by 1 s.
    st->sock.shutdown(asio::socket_base::shutdown_receive, ec);
    if (st->outq.empty()) {
      hard_close(st);
      return;
    }
    st->close_after_flush = true;
    st->flush_timer.expires_after(std::chrono::seconds(1));
    st->flush_timer.async_wait([st](error_code e) {
      if (!e) hard_close(st);
    });
  }

  void arm(const std::shared_ptr<Vm>& vm, TimerKind k, std::chrono::milliseconds after) {
    auto& slot = vm->timer(k);
    auto seq = ++slot.seq;
    slot.mark = vm->data ? vm->data->bytes_in() : 0;
    auto& t = slot.timer;
    t.expires_after(after);
    std::weak_ptr<Impl> w = shared_from_this();
    t.async_wait([w, vm, k, seq](error_code ec) {
      auto self = w.lock();
      if (ec || !self || vm->timer(k).seq != seq || !self->current(vm)) return;
      // The data link's state is data for the session's decision (the stop deadline's).
      DataLinkState d;
      if (vm->data && vm->data->is_open()) d = {true, vm->data->moving(vm->timer(k).mark)};
      vm->core.timer_fired(k, wall_now(), d);
      self->drain(vm);
    });
  }

  /// act::CutOutput: close the data channel before the workload's eofs; the guest counts what it
  /// could not deliver (output_lost) and powers off. `why` goes into the record's lost_reason.
  void cut_output(const std::shared_ptr<Vm>& vm, std::string why) {
    if (!vm->data || !vm->data->is_open()) return;
    vm->cut_reason = std::move(why);
    emit(*vm, "output_cut", vm->cut_reason);
    vm->data->close();
  }

  // ---- output the host did not deliver (docs/host.md "Output lost") ----

  /// The guest's output_end account: counted once per stream, settled once that stream's data has
  /// ended here (received is final then).
  void output_end(const std::shared_ptr<Vm>& vm, const proto::OutputEnd& r) {
    if (r.proc != 0 && r.proc >= vm->next_proc) return;  // a number never opened: nothing of ours
    if (!vm->loss_reported.insert({r.proc, r.stream}).second) return;  // once per stream
    const bool ended =
        r.proc == 0 ? !(vm->data && vm->data->is_open()) && !data_may_resume(*vm) : !vm->execs.count(r.proc);
    if (ended) settle_loss(vm, r, nullptr);
    else vm->loss_pending[{r.proc, r.stream}] = r;
  }

  /// The workload's data channel may still come (back) on this host: the session resumes it (its
  /// boot turned resume on, or it took the session over) and it is lost, or not connected yet,
  /// while the session runs. What the guest framed waits in its replay ring for that connection,
  /// so its output account is not settled against the bytes received so far (the adoption race:
  /// the outcome and output_end can reach a host that took over before the data channel does).
  bool data_may_resume(const Vm& vm) const {
    if (!data_resumable(vm) || vm.finishing || vm.core.finished()) return false;
    return !vm.data || (!vm.data->is_open() && vm.data->lost());
  }
  /// The workload's data channel resumes: the boot turned resume on, or this host takes a
  /// session over (the guest says with its hello whether it resumes).
  static bool data_resumable(const Vm& vm) {
    const SessionConfig& cfg = vm.core.config();
    return cfg.descriptor.stdio && (vm.core.replay_bytes() > 0 || (cfg.resume && cfg.data_resume));
  }

  /// The exact loss of one stream: unsent + sent - bytes of it received. Reported when not 0:
  /// an event, and for the workload a gap in its log and the record's `lost`; for an exec'd
  /// process its `lost` hook, when it is still there.
  void settle_loss(const std::shared_ptr<Vm>& vm, const proto::OutputEnd& r, const ExecHooks* hooks) {
    const std::uint64_t received = vm->data ? vm->data->tally(r.proc, r.stream).received : 0;
    const std::uint64_t owed = r.sent + r.unsent;  // each at most 2^53 (the decoder's bound)
    const std::uint64_t lost = owed > received ? owed - received : 0;
    if (lost == 0) return;  // all of it arrived
    const std::string_view name = proto::to_string(r.stream);
    if (r.proc != 0) {
      emit(*vm, "output_lost", fmt::format("proc={} {} {} bytes", r.proc, name, lost));
      if (hooks && hooks->lost) hooks->lost(r.stream, lost, received);
      return;
    }
    (r.stream == proto::Stream::err ? vm->loss.lost.err : vm->loss.lost.out) = lost;
    if (vm->loss.lost_reason.empty())
      vm->loss.lost_reason = vm->cut_reason.empty() ? "the data channel closed before its end" : vm->cut_reason;
    emit(*vm, "output_lost", fmt::format("{} {} bytes", name, lost));
    if (vm->log)
      vm->log->push_gap(static_cast<OutputStream>(r.stream), fmt::format("{} bytes of {} lost", lost, name), wall_now());
  }

  /// The data channel ended (closed by either side, or failed). Before the workload's eofs: the
  /// guest counts what it could not deliver (output_lost), which the session then waits for.
  void data_ended(const std::shared_ptr<Vm>& vm, const std::string& error) {
    const bool done = vm->data->outputs_done();
    if (!done && vm->cut_reason.empty() && !error.empty()) vm->cut_reason = "the data channel failed: " + error;
    vm->core.data_closed(done);
    if (current(vm)) drain(vm);
    else vm->core.take();  // superseded: its late actions are ignored
    for (auto it = vm->loss_pending.begin(); it != vm->loss_pending.end();) {
      if (it->first.first != 0) { ++it; continue; }
      auto r = it->second;
      it = vm->loss_pending.erase(it);
      settle_loss(vm, r, nullptr);
    }
  }

  /// The session is finished and the data channel closed: reports still waiting are settled; a
  /// workload stream that ended without its eof and that nothing counted is truncated.
  void settle_output(const std::shared_ptr<Vm>& vm) {
    for (auto& [key, r] : std::exchange(vm->loss_pending, {})) settle_loss(vm, r, nullptr);
    if (!vm->data || !vm->workload_started) return;
    const bool terminal = vm->core.config().descriptor.stdio && vm->core.config().descriptor.stdio->terminal;
    for (auto st : {proto::Stream::out, proto::Stream::err}) {
      if (st == proto::Stream::err && terminal) continue;  // a terminal has one stream
      const auto t = vm->data->tally(0, st);
      if (t.eof || vm->loss_reported.count({0, st})) continue;
      const std::string_view name = proto::to_string(st);
      (st == proto::Stream::err ? vm->loss.truncated.err : vm->loss.truncated.out) = t.received;
      emit(*vm, "output_truncated", fmt::format("{}: its eof never arrived ({} bytes received)", name, t.received));
      if (vm->log)
        vm->log->push_gap(static_cast<OutputStream>(st),
                          fmt::format("{} truncated: its eof never arrived ({} bytes received)", name, t.received),
                          wall_now());
    }
  }

  /// What was lost of the output goes into the durable record (amend_record, on the worker
  /// pool), then `then` runs on the io_context. Nothing to write: `then` at once.
  void amend_then(const std::shared_ptr<Vm>& vm, std::function<void()> then) {
    const auto& rec = vm->core.outcome();
    if ((vm->loss.lost.empty() && vm->loss.truncated.empty()) || !vm->core.durable() || !rec) return then();
    Record r = *rec;
    r.lost = vm->loss.lost;
    r.truncated = vm->loss.truncated;
    r.lost_reason = vm->loss.lost_reason;
    std::weak_ptr<Impl> w = shared_from_this();
    asio::post(pool, [w, vm, r, then, dir = opt.state_dir, wopt = opt.write, &io = io] {
      auto res = amend_record(dir, r, wopt);
      asio::post(io, [w, vm, res = std::move(res), then] {
        auto self = w.lock();
        if (!self) return;
        if (res && res->kind == WriteResult::Kind::written) {
          vm->core.record_amended(res->on_disk);
          vm->result = WaitResult{res->on_disk};
          std::string said;
          for (const auto& l : describe_loss(res->on_disk)) said += (said.empty() ? "" : "; ") + l;
          self->emit(*vm, "record_amended", said);
        } else {
          self->emit(*vm, "record_error",
                     res ? std::string("amending the record: a newer generation is on disk")
                         : "amending the record: " + res.error().message);
        }
        then();
      });
    });
  }

  /// Queue the record for the next group commit; record_done() runs on the io_context once it
  /// is durable (or failed).
  void write(const std::shared_ptr<Vm>& vm, Record rec) {
    std::weak_ptr<Impl> w = shared_from_this();
    auto done = [w, vm, rec, &io = io](Result<WriteResult> res) mutable {
      asio::post(io, [w, vm, res = std::move(res), rec = std::move(rec)]() mutable {
        auto self = w.lock();
        if (!self) return;
        self->record_done(vm, rec, res);
      });
    };
    if (records->push(std::move(rec), std::move(done)))
      asio::post(pool, [q = records, dir = opt.state_dir, wopt = opt.write] {
        RecordQueue::drain(q, dir, wopt);
      });
  }

  void record_done(const std::shared_ptr<Vm>& vm, const Record& rec, Result<WriteResult>& res) {
    bool cur = current(vm);
    if (!res) {
      vm->core.record_failed(res.error().message);
      settle(vm, Error{res.error().message});
    } else if (res->kind == WriteResult::Kind::stale) {
      std::string why = fmt::format(
          "stale generation: {} generation {} is not recorded; the state dir holds generation {}",
          rec.vm, rec.generation, res->on_disk.generation);
      vm->core.record_failed(why);
      settle(vm, Error{why});
    } else {
      vm->core.record_durable(res->on_disk);
      settle(vm, res->on_disk);
    }
    if (cur) drain(vm);
    else vm->core.take();  // superseded generation: its late actions are ignored
  }

  void settle(const std::shared_ptr<Vm>& vm, WaitResult r) {
    if (vm->result) return;
    vm->result = r;
    auto ws = std::move(vm->waiters);
    vm->waiters.clear();
    for (auto& h : ws) asio::post(io, [h = std::move(h), r]() { h(r); });
  }

  /// The oldest waiting async_list_processes request gets `r` (posted: never re-entrant).
  void answer_processes(const std::shared_ptr<Vm>& vm, Result<proto::Processes> r) {
    if (vm->process_waiters.empty()) return;  // late: its request already timed out
    auto w = std::move(vm->process_waiters.front());
    vm->process_waiters.pop_front();
    w.deadline->cancel();
    asio::post(io, [h = std::move(w.handler), r = std::move(r)]() mutable { h(std::move(r)); });
  }
  void fail_process_waiters(const std::shared_ptr<Vm>& vm, const std::string& why) {
    while (!vm->process_waiters.empty()) answer_processes(vm, Error{why});
    while (!vm->resource_waiters.empty()) answer_resources(vm, Error{why});
  }
  /// The oldest waiting async_container_resources request gets `r` (posted).
  void answer_resources(const std::shared_ptr<Vm>& vm, Result<proto::ContainerResourcesReply> r) {
    if (vm->resource_waiters.empty()) return;  // late: its request already timed out
    auto w = std::move(vm->resource_waiters.front());
    vm->resource_waiters.pop_front();
    w.deadline->cancel();
    asio::post(io, [h = std::move(w.handler), r = std::move(r)]() mutable { h(std::move(r)); });
  }

  // ---- exec: the session decides each process's end (act::ExecEnded); here only its effects ----
  void exec_report(const std::shared_ptr<Vm>& vm,
                   std::variant<proto::ExecStarted, proto::ExecFailed, proto::ExecExited> r) {
    const std::uint16_t proc = std::visit([](const auto& m) { return m.proc; }, r);
    auto it = vm->execs.find(proc);
    if (it == vm->execs.end()) return;
    Vm::ExecProc& x = it->second;
    if (auto* st = std::get_if<proto::ExecStarted>(&r)) {
      x.started = true;
      if (vm->data) vm->data->exec_started(proc);
      emit(*vm, "exec_started", fmt::format("proc={} pid={}", proc, st->pid));
      if (x.hooks.started) x.hooks.started(st->pid);
    } else if (auto* f = std::get_if<proto::ExecFailed>(&r)) {
      emit(*vm, "exec_failed", fmt::format("proc={} {}", proc, f->reason.substr(0, 256)));
    } else {
      x.exited = std::get<proto::ExecExited>(r);
      emit(*vm, "exec_exited", fmt::format("proc={} {}", proc,
                                           x.exited->signal ? fmt::format("signal={}", *x.exited->signal)
                                                            : fmt::format("exit_code={}", *x.exited->exit_code)));
    }
  }

  /// act::ArmExecTimer: (re)arm process `proc`'s timer; its expiry goes to the session with the
  /// data link's state (output moving since it was armed).
  void arm_exec_timer(const std::shared_ptr<Vm>& vm, std::uint16_t proc, std::chrono::milliseconds after) {
    auto it = vm->execs.find(proc);
    if (it == vm->execs.end()) return;
    auto t = std::make_shared<asio::steady_timer>(io, after);
    if (it->second.timer) it->second.timer->cancel();
    it->second.timer = t;
    it->second.mark = vm->data ? vm->data->bytes_in() : 0;
    std::weak_ptr<Vm> wv = vm;
    std::weak_ptr<Impl> w = shared_from_this();
    t->async_wait([w, wv, proc, t](error_code ec) {
      auto self = w.lock();
      auto vm = wv.lock();
      if (ec || !vm || !self || !self->current(vm)) return;
      auto it = vm->execs.find(proc);
      if (it == vm->execs.end() || it->second.timer != t) return;
      DataLinkState d;
      if (vm->data && vm->data->is_open()) d = {true, vm->data->moving(it->second.mark)};
      vm->core.exec_timer_fired(proc, d);
      self->drain(vm);
    });
  }

  /// Output of process `proc` from the data channel.
  void exec_data(const std::shared_ptr<Vm>& vm, std::uint16_t proc, DataEvent& e) {
    auto it = vm->execs.find(proc);
    if (it == vm->execs.end()) return;
    Vm::ExecProc& x = it->second;
    if (auto* o = std::get_if<data_ev::Output>(&e)) {
      if (x.hooks.data) x.hooks.data(o->stream, o->bytes);
    } else if (auto* eo = std::get_if<data_ev::Eof>(&e)) {
      if (x.hooks.eof) x.hooks.eof(eo->stream);
      if (!current(vm)) return;
      vm->core.exec_eof(proc, eo->stream);
      drain(vm);
    }
  }

  void end_exec(const std::shared_ptr<Vm>& vm, std::uint16_t proc, ExecEnd e) {
    auto it = vm->execs.find(proc);
    if (it == vm->execs.end()) return;
    Vm::ExecProc x = std::move(it->second);
    vm->execs.erase(it);
    if (x.timer) x.timer->cancel();
    if (vm->data) vm->data->close_exec(proc);
    // Its streams have ended here: what the guest counted is settled now; a stream without its
    // eof that nothing counted (yet) is said to be truncated, before `ended`.
    for (auto st : {proto::Stream::out, proto::Stream::err}) {
      if (!x.has_stdio || !x.started || (st == proto::Stream::err && x.terminal)) continue;
      if (auto r = vm->loss_pending.find({proc, st}); r != vm->loss_pending.end()) {
        auto report = r->second;
        vm->loss_pending.erase(r);
        settle_loss(vm, report, &x.hooks);
        continue;
      }
      const auto t = vm->data ? vm->data->tally(proc, st) : DataLink::Tally{};
      if (t.eof || vm->loss_reported.count({proc, st})) continue;
      emit(*vm, "output_truncated", fmt::format("proc={} {}: its eof never arrived ({} bytes received)", proc,
                                                proto::to_string(st), t.received));
      if (x.hooks.lost) x.hooks.lost(st, std::nullopt, t.received);
    }
    if (auto* lost = std::get_if<ExecLost>(&e)) emit(*vm, "exec_lost", fmt::format("proc={} {}", proc, lost->reason));
    if (x.hooks.ended) x.hooks.ended(e);
  }

  void fail_execs(const std::shared_ptr<Vm>& vm, const std::string& why) {
    while (!vm->execs.empty()) {
      const std::uint16_t proc = vm->execs.begin()->first;
      auto& x = vm->execs.begin()->second;
      if (x.exited) end_exec(vm, proc, *x.exited);
      else end_exec(vm, proc, ExecLost{why});
    }
  }

  void finished(const std::shared_ptr<Vm>& vm) {
    fail_process_waiters(vm, "list_processes: the session is over");
    if (vm->acceptor) {
      error_code ec;
      vm->acceptor->close(ec);
      vm->acceptor.reset();
    }
    if (!vm->socket_path.empty()) {
      ::unlink(vm->socket_path.c_str());
      vm->socket_path.clear();
    }
    if (vm->data_acceptor) {
      error_code ec;
      vm->data_acceptor->close(ec);
      vm->data_acceptor.reset();
    }
    if (!vm->data_socket_path.empty()) {
      ::unlink(vm->data_socket_path.c_str());
      vm->data_socket_path.clear();
    }
  }

  // ---- the data channel and the workload log ----

  /// The session is finished: read the data channel to its end (bounded), close the log on the
  /// worker pool (a slow disk never stalls this loop), then report "finished".
  void finish_data(const std::shared_ptr<Vm>& vm, std::string detail) {
    if (vm->finishing) return;
    vm->finishing = true;
    if (!vm->data && !vm->log) return emit(*vm, "finished", detail, act::Milestone::finished);  // no stdio: as before
    std::weak_ptr<Impl> w = shared_from_this();
    auto after_log = [w, vm, detail] {
      auto self = w.lock();
      if (!self) return;
      self->emit(*vm, "finished", detail, act::Milestone::finished);
    };
    auto close_log = [w, vm, after_log] {
      auto self = w.lock();
      if (!self) return;
      auto log = std::exchange(vm->log, nullptr);
      if (!log) return after_log();
      asio::post(self->pool, [w, vm, log, after_log, &io = self->io] {
        bool all = log->close(std::chrono::milliseconds(2000));
        auto err = log->error();
        if (!err && !all) err = "the log did not catch up within 2 s; the rest is written late";
        asio::post(io, [w, vm, err, after_log] {
          auto self = w.lock();
          if (self && err) self->emit(*vm, "log_error", *err);
          after_log();
        });
      });
    };
    // Once the data channel is closed: settle what was lost of the output (gaps into the log
    // before it closes), make it durable in the record, then close the log.
    auto settle = [w, vm, close_log] {
      auto self = w.lock();
      if (!self) return;
      self->settle_output(vm);
      self->amend_then(vm, close_log);
    };
    if (vm->data && vm->data->is_open()) {
      vm->data_finished_cb = settle;
      vm->data->drain_then_close(opt.data_drain);
    } else {
      asio::post(io, settle);
    }
  }

  void open_log(const std::shared_ptr<Vm>& vm) {
    auto& d = vm->core.config().descriptor;
    if (!d.stdio || !opt.workload_log.enabled || opt.state_dir.empty()) return;
    std::error_code ec;
    std::filesystem::create_directories(opt.state_dir / vm->id(), ec);
    LogOptions lo;
    lo.path = vm_path(opt.state_dir, vm->id(), kWorkloadLog);
    lo.max_size = opt.workload_log.max_size;
    lo.max_files = opt.workload_log.max_files;
    lo.generation = vm->generation();  // each record names it (fencing: docs/host.md)
    // A session that may resume its data channel keeps each stream's position beside the log:
    // a host taking over asks the guest to go on from there.
    const auto& cfg = vm->core.config();
    if (cfg.reconnect.count() > 0 || cfg.resume) lo.positions = lo.path.string() + ".pos";
    // A session booted here starts its streams at 0: an earlier generation's positions go.
    if (!lo.positions.empty() && !cfg.resume) std::filesystem::remove(lo.positions, ec);
    std::weak_ptr<Impl> w = shared_from_this();
    std::weak_ptr<Vm> wv = vm;
    auto drained = [w, wv, &io = io] {
      asio::post(io, [w, wv] {
        auto self = w.lock();
        auto vm = wv.lock();
        if (self && vm && vm->data) vm->data->log_drained();
      });
    };
    auto log = AsyncLog::start(lo, opt.workload_log.queue_cap, drained);
    if (!log) {
      emit(*vm, "log_error", log.error().message);
      return;
    }
    vm->log = std::shared_ptr<AsyncLog>(std::move(*log));
    if (!lo.positions.empty())
      vm->log->on_written([w, wv, &io = io](LogPositions p) {
        asio::post(io, [w, wv, p] {
          auto self = w.lock();
          auto vm = wv.lock();
          if (self && vm && vm->data) vm->data->log_written(p);
        });
      });
  }

  void adopt_data(const std::shared_ptr<Vm>& vm, int fd, int family) {
    auto& d = vm->core.config().descriptor;
    const char* why = nullptr;
    const SessionConfig& cfg = vm->core.config();
    const bool resumable = data_resumable(*vm);
    const bool redial = vm->data_ever && resumable && vm->data && !vm->data->is_open() && vm->data->lost();
    // Only a session that may turn resume on with its boot (reconnect and data_resume) waits.
    const bool before_boot = d.stdio && !cfg.resume && cfg.reconnect.count() > 0 && cfg.data_resume &&
                             vm->core.phase() < Phase::booted && !vm->finishing;
    if (before_boot && !vm->parked_data) {
      vm->parked_data = Fd(fd);  // whether it resumes is the boot's word: adopted by drain()
      vm->parked_family = family;
      return;
    }
    if (!d.stdio) why = "the descriptor has no stdio";
    else if (before_boot) why = "a data channel is already waiting for the boot";
    else if (vm->data_ever && !redial) why = "a data channel was already connected for this generation";
    else if (vm->finishing || vm->core.finished()) why = "the session is finished";
    if (why) {
      ::close(fd);
      emit(*vm, "data_refused", why);
      return;
    }
    vm->data_ever = true;
    DataLink::Config c;
    c.vm = vm->id();
    c.stdio = *d.stdio;
    c.hooks = &opt.stdio;
    c.log = vm->log;
    c.stdin_cap = opt.stdin_cap;
    std::weak_ptr<Impl> w = shared_from_this();
    std::weak_ptr<Vm> wv = vm;
    c.emit = [w, wv](std::string kind, std::string detail) {
      auto self = w.lock();
      auto vm = wv.lock();
      if (!self || !vm) return;
      auto m = kind == "data_error" ? act::Milestone::data_error : act::Milestone::other;
      self->emit(*vm, std::move(kind), std::move(detail), m);
    };
    c.on_closed = [w, wv](const std::string& error) {
      auto vm = wv.lock();
      if (!vm) return;
      // A resumable link lost (or a stranger's refused): the guest redials; the output's end is
      // decided by the connection that resumes it, or by the session's end.
      if (vm->data && vm->data->lost() && !vm->finishing && !vm->core.finished()) {
        if (auto self = w.lock()) self->emit(*vm, "data_lost", error);
        return;
      }
      // The session hears it (processes exec() started lose their streams: those exited end).
      if (auto self = w.lock()) self->data_ended(vm, error);
      if (auto cb = std::exchange(vm->data_finished_cb, nullptr)) cb();
    };
    c.exec_event = [w, wv](std::uint16_t proc, DataEvent& e) {
      auto self = w.lock();
      auto vm = wv.lock();
      if (self && vm) self->exec_data(vm, proc, e);
    };
    if (resumable) {
      if (!vm->resume) {
        vm->resume = std::make_shared<DataResume>();
        vm->resume->vm = vm->id();
        vm->resume->generation = cfg.generation;
        if (cfg.resume) {
          // Taking over: the output goes on from what the log holds; stdin from the guest's word.
          const LogPositions p = vm->log ? vm->log->positions() : LogPositions{};
          vm->resume->pos[0] = vm->resume->safe[0] = vm->resume->acked[0] = p.out;
          vm->resume->pos[1] = vm->resume->safe[1] = vm->resume->acked[1] = p.err;
          vm->resume->in_known = false;
        }
      }
      c.resume = vm->resume;
      c.resume_required = vm->core.replay_bytes() > 0;
    }
    auto link = std::make_shared<DataLink>(io, fd, family, std::move(c));
    vm->data = link;
    vm->core.data_opened();
    emit(*vm, "data_connected", "", act::Milestone::data_connected);
    if (vm->output_paused) link->pause(true);
    link->start();
    if (auto r = std::exchange(vm->pending_resize, std::nullopt)) (void)link->send_resize(r->first, r->second);
  }

  static void close_data(const std::shared_ptr<Vm>& vm) {
    if (vm->data) vm->data->close();
    vm->data_finished_cb = nullptr;
    if (vm->log) vm->log->close(std::chrono::milliseconds(2000));
    vm->log.reset();
  }

  // ---- streams ----

  void adopt(const std::shared_ptr<Vm>& vm, int fd, int family) {
    if (!vm->core.stream_opened(wall_now())) {
      ::close(fd);
      drain(vm);
      return;
    }
    auto st = std::make_shared<Stream>(io, fd, family, vm->core.config().line_cap);
    vm->stream = st;
    drain(vm);
    if (!st->sock.is_open()) {
      stream_gone(vm, st);
      return;
    }
    asio::co_spawn(io, read_loop(weak_from_this(), vm, st, opt.read_chunk), asio::detached);
  }

  void stream_gone(const std::shared_ptr<Vm>& vm, const std::shared_ptr<Stream>& st) {
    if (st->closed) return;
    st->closed = true;
    hard_close(st);
    if (vm->stream == st) vm->stream.reset();
    if (!current(vm)) return;
    vm->core.stream_closed(st->reader.pending(), wall_now());
    drain(vm);
  }

  static asio::awaitable<void> read_loop(std::weak_ptr<Impl> w, std::shared_ptr<Vm> vm,
                                         std::shared_ptr<Stream> st, std::size_t chunk) {
    std::vector<char> buf(chunk);
    for (;;) {
      error_code ec;
      std::size_t n = co_await st->sock.async_read_some(
          asio::buffer(buf), asio::redirect_error(asio::use_awaitable, ec));
      auto self = w.lock();
      if (!self || st->closed) co_return;
      if (!self->current(vm)) {
        // Superseded generation: its stream is closed without reporting.
        st->closed = true;
        hard_close(st);
        co_return;
      }
      if (n > 0) {
        feed_lines(vm->core, st->reader, std::string_view(buf.data(), n), wall_now());
        self->drain(vm);
        if (st->closed) co_return;
      }
      if (ec) {
        self->stream_gone(vm, st);
        co_return;
      }
    }
  }

  /// Host::listen_unix (`data` false) and Host::listen_data_unix: open the VM's listener on
  /// opt.path and accept on it. Defined below, beside open_unix_acceptor.
  static Status listen_vm_unix(const std::shared_ptr<Impl>& self, const std::string& id,
                               const UnixListenOptions& opt, bool data);
  /// Host::listen_vsock (`data` false) and Host::listen_vsock_data: the one vsock listener of each.
  static Status listen_any_vsock(const std::shared_ptr<Impl>& self, std::uint32_t port, bool data);
  /// Host::attach_stream (`data` false) and Host::attach_data_stream: an already connected fd.
  Status attach_vm_stream(const std::string& id, Fd fd, bool data);

  /// One VM's Unix listener: the lifecycle channel, or (`data`) its data channel.
  static asio::awaitable<void> accept_loop(std::weak_ptr<Impl> w, std::shared_ptr<Vm> vm,
                                           std::shared_ptr<unix_acceptor> acc, bool data) {
    for (;;) {
      error_code ec;
      asio::local::stream_protocol::socket s =
          co_await acc->async_accept(asio::redirect_error(asio::use_awaitable, ec));
      auto self = w.lock();
      if (!self || !acc->is_open() || ec == asio::error::operation_aborted) co_return;
      if (ec) {
        // EMFILE and friends: report, pause briefly (bounded), go on accepting.
        self->emit(*vm, "accept_error", ec.message());
        asio::steady_timer t(self->io, std::chrono::milliseconds(100));
        self.reset();
        co_await t.async_wait(asio::redirect_error(asio::use_awaitable, ec));
        continue;
      }
      if (!self->current(vm)) co_return;
      if (data) self->adopt_data(vm, s.release(), AF_UNIX);
      else self->adopt(vm, s.release(), AF_UNIX);
    }
  }

  static asio::awaitable<void> vsock_accept_loop(std::weak_ptr<Impl> w,
                                                 std::shared_ptr<generic_acceptor> acc, bool data) {
    for (;;) {
      error_code ec;
      generic_stream::endpoint peer;
      generic_stream::socket s(acc->get_executor());
      co_await acc->async_accept(s, peer, asio::redirect_error(asio::use_awaitable, ec));
      auto self = w.lock();
      if (!self || !acc->is_open() || ec == asio::error::operation_aborted) co_return;
      if (ec) continue;
      auto cid = vsock_peer_cid(peer.data(), peer.size());
      auto vmid = cid ? self->cids.lookup(*cid) : std::nullopt;
      auto vm = vmid ? self->find(*vmid) : nullptr;
      if (!vm) {
        // Identity comes only from the endpoint: an unknown CID gets nothing.
        if (self->opt.on_event)
          self->opt.on_event(Event{"", 0, "refused", fmt::format("unknown vsock CID {}", cid.value_or(0))});
        continue;
      }
      if (data) self->adopt_data(vm, s.release(), AF_VSOCK);
      else self->adopt(vm, s.release(), AF_VSOCK);
    }
  }

  void teardown() {
    for (auto& [id, vm] : vms) {
      error_code ec;
      if (vm->acceptor) vm->acceptor->close(ec);
      if (vm->stream) {
        vm->stream->closed = true;
        hard_close(vm->stream);
      }
      vm->cancel_all();
      if (!vm->socket_path.empty()) ::unlink(vm->socket_path.c_str());
      if (vm->data_acceptor) vm->data_acceptor->close(ec);
      if (!vm->data_socket_path.empty()) ::unlink(vm->data_socket_path.c_str());
      close_data(vm);
    }
    if (vsock) {
      error_code ec;
      vsock->close(ec);
    }
    if (vsock_data) {
      error_code ec;
      vsock_data->close(ec);
    }
    pool.join();
  }
};

Host::Host(asio::io_context& io, HostOptions opt)
    : impl_([&] {
        SignalsBlocked quiet;  // the worker pool's threads never take a process signal
        return std::make_shared<Impl>(io, std::move(opt));
      }()) {}

Host::~Host() { impl_->teardown(); }

Status Host::add_vm(SessionConfig cfg) {
  if (auto id = check_vm_id(cfg.vm); !id) return Error{"vm: " + id.error().message};
  if (cfg.descriptor.exec.argv.empty() && !cfg.resume) return Error{"descriptor: exec.argv is empty"};
  if (auto old = impl_->find(cfg.vm)) {
    if (old->generation() >= cfg.generation)
      return Error{fmt::format("vm '{}': generation {} is registered; a new one must be newer than "
                               "that, got {}",
                               cfg.vm, old->generation(), cfg.generation)};
    // Superseded: close its I/O; its late completions see !current() and are dropped.
    impl_->close_stream(old);
    impl_->fail_execs(old, "the session is over");
    impl_->finished(old);
    Impl::close_data(old);
    old->cancel_all();
    impl_->settle(old, Error{fmt::format("vm '{}': generation {} superseded by {}", cfg.vm,
                                         old->generation(), cfg.generation)});
  }
  cfg.data_drain = impl_->opt.data_drain;
  cfg.exec_answer_wait = kExecAnswerWait;
  auto vm = std::make_shared<Vm>(impl_->io, std::move(cfg));
  impl_->vms[vm->id()] = vm;
  impl_->open_log(vm);
  impl_->emit(*vm, "registered", fmt::format("generation={} on_exit={}", vm->generation(),
                                             to_string(vm->core.config().on_exit)));
  return Ok{};
}

namespace {
Error no_vm(const std::string& vm) { return Error{fmt::format("vm '{}' is not registered", vm)}; }

/// A listening Unix socket at opt.path, handed to Asio (unlinked again if that fails).
Result<std::shared_ptr<unix_acceptor>> open_unix_acceptor(asio::io_context& io, const UnixListenOptions& opt) {
  auto fd = nes::host::listen_unix(opt);
  if (!fd) return fd.error();
  auto acc = std::make_shared<unix_acceptor>(io);
  error_code ec;
  acc->assign(asio::local::stream_protocol(), fd->get(), ec);
  if (ec) {
    ::unlink(opt.path.c_str());
    return Error{fmt::format("listen {}: {}", opt.path, ec.message())};
  }
  fd->release();
  return acc;
}

/// A listening AF_VSOCK socket on VMADDR_CID_ANY:port, handed to Asio.
Result<std::shared_ptr<generic_acceptor>> open_vsock_acceptor(asio::io_context& io, std::uint32_t port) {
  auto fd = nes::host::listen_vsock(port);
  if (!fd) return fd.error();
  auto acc = std::make_shared<generic_acceptor>(io);
  error_code ec;
  acc->assign(generic_stream(AF_VSOCK, 0), fd->get(), ec);
  if (ec) return Error{fmt::format("vsock:{}: {}", port, ec.message())};
  fd->release();
  return acc;
}
}  // namespace

Status Host::Impl::listen_vm_unix(const std::shared_ptr<Impl>& self, const std::string& id,
                                  const UnixListenOptions& opt, bool data) {
  auto vm = self->find(id);
  if (!vm) return no_vm(id);
  std::shared_ptr<unix_acceptor>& acceptor = data ? vm->data_acceptor : vm->acceptor;
  if (acceptor) return Error{fmt::format("vm '{}' already has a {}listener", id, data ? "data " : "")};
  auto acc = open_unix_acceptor(self->io, opt);
  if (!acc) return acc.error();
  acceptor = *acc;
  (data ? vm->data_socket_path : vm->socket_path) = opt.path;
  self->emit(*vm, data ? "data_listening" : "listening", "unix:" + opt.path);
  asio::co_spawn(self->io, accept_loop(self, vm, *acc, data), asio::detached);
  return Ok{};
}

Status Host::Impl::listen_any_vsock(const std::shared_ptr<Impl>& self, std::uint32_t port, bool data) {
  std::shared_ptr<generic_acceptor>& listener = data ? self->vsock_data : self->vsock;
  if (listener) return Error{fmt::format("a vsock {}listener is already open", data ? "data " : "")};
  auto acc = open_vsock_acceptor(self->io, port);
  if (!acc) return acc.error();
  listener = *acc;
  asio::co_spawn(self->io, vsock_accept_loop(self, *acc, data), asio::detached);
  return Ok{};
}

Status Host::listen_unix(const std::string& id, const UnixListenOptions& opt) {
  return Impl::listen_vm_unix(impl_, id, opt, false);
}

Status Host::Impl::attach_vm_stream(const std::string& id, Fd fd, bool data) {
  auto vm = find(id);
  if (!vm) return no_vm(id);
  if (!fd) return Error{fmt::format("attach_{}stream: invalid fd", data ? "data_" : "")};
  if (data) adopt_data(vm, fd.release(), AF_UNIX);
  else adopt(vm, fd.release(), AF_UNIX);
  return Ok{};
}

Status Host::attach_stream(const std::string& id, Fd fd) { return impl_->attach_vm_stream(id, std::move(fd), false); }

Status Host::listen_vsock(std::uint32_t port) { return Impl::listen_any_vsock(impl_, port, false); }

Status Host::listen_data_unix(const std::string& id, const UnixListenOptions& opt) {
  return Impl::listen_vm_unix(impl_, id, opt, true);
}

Status Host::attach_data_stream(const std::string& id, Fd fd) {
  return impl_->attach_vm_stream(id, std::move(fd), true);
}

Status Host::listen_vsock_data(std::uint32_t port) { return Impl::listen_any_vsock(impl_, port, true); }

namespace {
Error no_data(const std::string& vm) {
  return Error{fmt::format("vm '{}' has no data channel connected", vm)};
}
}  // namespace

Status Host::send_stdin(const std::string& id, std::string_view bytes, std::uint16_t proc) {
  auto vm = impl_->find(id);
  if (!vm) return no_vm(id);
  if (!vm->data) return no_data(id);
  return vm->data->send_stdin(bytes, proc);
}

Status Host::send_stdin_eof(const std::string& id, std::uint16_t proc) {
  auto vm = impl_->find(id);
  if (!vm) return no_vm(id);
  if (!vm->data && proc == 0 && vm->resume) {
    // The data channel is lost and awaited again: the eof is kept and goes out after the
    // handshake of the redialled one (DataLink's position handler), never dropped.
    vm->resume->in_eof = true;
    return Ok{};
  }
  if (!vm->data) return no_data(id);
  return vm->data->send_stdin_eof(proc);
}

int exec_exit_status(const ExecEnd& e) {
  if (auto* x = std::get_if<proto::ExecExited>(&e)) return x->signal ? 128 + *x->signal : *x->exit_code;
  if (auto* f = std::get_if<proto::ExecFailed>(&e)) return f->cls == proto::StartFailClass::not_found ? 127 : 126;
  return 125;
}

Result<std::uint16_t> Host::exec(const std::string& id, proto::Exec exec, std::optional<proto::Stdio> stdio,
                                 ExecHooks hooks, ExecWhere where) {
  auto vm = impl_->find(id);
  if (!vm) return no_vm(id);
  if (vm->core.outcome()) return Error{"exec: the workload has ended"};
  if (vm->execs.size() >= proto::kExecMax)
    return Error{fmt::format("exec: {} processes started by exec run already in VM {} (the most)", proto::kExecMax, id)};
  if (stdio && (!vm->data || !vm->data->is_open())) return no_data(id);
  // The next number not in use (65535 numbers: wraps only in a very long-lived session).
  std::uint16_t proc = vm->next_proc;
  while (proc == 0 || vm->execs.count(proc)) ++proc;
  proto::ExecProcess x{proc, std::move(exec), stdio, std::move(where.container), where.in};
  if (stdio)
    if (auto s = vm->data->open_exec(proc, *stdio); !s) return s.error();
  if (auto s = vm->core.exec(x); !s) {
    if (stdio) vm->data->close_exec(proc);
    return s.error();
  }
  vm->next_proc = static_cast<std::uint16_t>(proc + 1);
  Vm::ExecProc& e = vm->execs[proc];
  e.hooks = std::move(hooks);
  e.has_stdio = stdio.has_value();
  e.terminal = stdio && stdio->terminal;
  impl_->drain(vm);  // its answer's bound (act::ArmExecTimer)
  return proc;
}

Status Host::kill_exec(const std::string& id, std::uint16_t proc, int signal) {
  auto vm = impl_->find(id);
  if (!vm) return no_vm(id);
  if (!vm->execs.count(proc)) return Error{fmt::format("kill: no process {} running in VM {}", proc, id)};
  auto s = vm->core.kill_exec(signal, proc);
  impl_->drain(vm);
  return s;
}

Status Host::send_resize(const std::string& id, std::uint16_t rows, std::uint16_t cols, std::uint16_t proc) {
  auto vm = impl_->find(id);
  if (!vm) return no_vm(id);
  if (proc != 0) return vm->data ? vm->data->send_resize(rows, cols, proc) : no_data(id);
  if (vm->data) return vm->data->send_resize(rows, cols);
  // Before boot: the size the workload starts with. After boot, before the data channel: sent
  // once it is up (the latest size wins).
  if (vm->core.set_terminal_size(rows, cols)) return Ok{};
  const auto& st = vm->core.config().descriptor.stdio;
  if (!st || !st->terminal) return no_data(id);
  if (rows < 1 || cols < 1) return Error{"resize: rows and cols must be at least 1"};
  vm->pending_resize = std::pair{rows, cols};
  return Ok{};
}

Status Host::pause_output(const std::string& id, bool paused) {
  auto vm = impl_->find(id);
  if (!vm) return no_vm(id);
  vm->output_paused = paused;
  if (vm->data) vm->data->pause(paused);
  return Ok{};
}

Status Host::map_cid(std::uint32_t cid, const std::string& vm) {
  if (!impl_->find(vm)) return no_vm(vm);
  return impl_->cids.add(cid, vm);
}

Status Host::vm_started(const std::string& id) {
  auto vm = impl_->find(id);
  if (!vm) return no_vm(id);
  vm->core.vm_started(wall_now());
  impl_->drain(vm);
  return Ok{};
}

Status Host::vm_exited(const std::string& id) {
  auto vm = impl_->find(id);
  if (!vm) return no_vm(id);
  // Output the guest did not finish sending is reported (output_lost) on the lifecycle stream,
  // maybe just ahead of its EOF: the session reads it to the end first.
  if (vm->data && !vm->data->outputs_done()) vm->core.expect_output_reports();
  vm->core.vm_exited(wall_now());
  impl_->drain(vm);
  return Ok{};
}

Status Host::stop(const std::string& id) {
  auto vm = impl_->find(id);
  if (!vm) return no_vm(id);
  auto s = vm->core.stop();
  impl_->drain(vm);
  return s;
}

Status Host::kill(const std::string& id, int signal) {
  auto vm = impl_->find(id);
  if (!vm) return no_vm(id);
  auto s = vm->core.kill(signal);
  impl_->drain(vm);
  return s;
}

Status Host::shutdown(const std::string& id) {
  auto vm = impl_->find(id);
  if (!vm) return no_vm(id);
  auto s = vm->core.shutdown(wall_now());
  impl_->drain(vm);
  return s;
}

bool Host::output_owed(const std::string& id) const {
  auto vm = impl_->find(id);
  return vm && vm->core.outcome() && vm->data && vm->data->is_open();
}

void Host::async_list_processes(const std::string& id, std::function<void(Result<proto::Processes>)> handler) {
  auto fail = [&](Error e) { asio::post(impl_->io, [h = std::move(handler), e = std::move(e)]() { h(e); }); };
  auto vm = impl_->find(id);
  if (!vm) return fail(no_vm(id));
  if (vm->process_waiters.size() >= kListProcessesInFlight)
    return fail(Error{fmt::format("list_processes: {} requests already wait for VM {}", kListProcessesInFlight, id)});
  if (auto s = vm->core.list_processes(); !s) return fail(s.error());
  auto t = std::make_shared<asio::steady_timer>(impl_->io, kListProcessesWait);
  vm->process_waiters.push_back({std::move(handler), t});
  std::weak_ptr<Vm> weak = vm;
  t->async_wait([weak, t](error_code ec) {
    auto v = weak.lock();
    if (ec || !v) return;
    for (auto it = v->process_waiters.begin(); it != v->process_waiters.end(); ++it) {
      if (it->deadline != t) continue;
      auto h = std::move(it->handler);
      v->process_waiters.erase(it);
      // A timer's completion: not inside any caller of ours, so the handler runs right here.
      h(Error{fmt::format("list_processes: no answer within {} ms (an init that predates it does not answer)",
                          kListProcessesWait.count())});
      return;
    }
  });
  impl_->drain(vm);
}

void Host::async_container_resources(const std::string& id, const proto::ContainerResourcesRequest& r,
                                     std::function<void(Result<proto::ContainerResourcesReply>)> handler) {
  auto fail = [&](Error e) { asio::post(impl_->io, [h = std::move(handler), e = std::move(e)]() { h(e); }); };
  auto vm = impl_->find(id);
  if (!vm) return fail(no_vm(id));
  if (vm->resource_waiters.size() >= kListProcessesInFlight)
    return fail(Error{fmt::format("container_resources: {} requests already wait for VM {}", kListProcessesInFlight, id)});
  if (auto s = vm->core.container_resources(r); !s) return fail(s.error());
  auto t = std::make_shared<asio::steady_timer>(impl_->io, kListProcessesWait);
  vm->resource_waiters.push_back({std::move(handler), t});
  std::weak_ptr<Vm> weak = vm;
  t->async_wait([weak, t](error_code ec) {
    auto v = weak.lock();
    if (ec || !v) return;
    for (auto it = v->resource_waiters.begin(); it != v->resource_waiters.end(); ++it) {
      if (it->deadline != t) continue;
      auto h = std::move(it->handler);
      v->resource_waiters.erase(it);
      h(Error{fmt::format("container_resources: no answer within {} ms", kListProcessesWait.count())});
      return;
    }
  });
  impl_->drain(vm);
}

void Host::async_wait(const std::string& id, std::function<void(WaitResult)> handler) {
  auto vm = impl_->find(id);
  if (vm && vm->result) {
    asio::post(impl_->io, [h = std::move(handler), r = *vm->result]() { h(r); });
    return;
  }
  // Not settled in memory: the state dir may already hold this generation (an earlier process
  // recorded it). Look on the worker pool, never on the io_context.
  std::weak_ptr<Impl> w = impl_;
  std::optional<std::uint64_t> gen;
  if (vm) gen = vm->generation();
  asio::post(impl_->pool, [w, id, gen, h = std::move(handler), dir = impl_->opt.state_dir,
                           &io = impl_->io]() mutable {
    auto rec = read_record(dir, id);
    asio::post(io, [w, id, gen, h = std::move(h), rec = std::move(rec)]() mutable {
      auto self = w.lock();
      if (!self) return;
      auto vm = self->find(id);
      // A record of this generation (or newer) on disk is the answer, also when the session
      // settled meanwhile: a write refused as stale settles it with an error, but the newer
      // record found here is what wait() promises (independent of which finished first). With
      // no VM registered, whatever is recorded is the answer.
      if (rec && *rec && (!gen || (*rec)->generation >= *gen)) return h(**rec);
      if (vm && vm->result) return h(*vm->result);
      if (vm && vm->generation() == gen.value_or(vm->generation())) {
        vm->waiters.push_back(std::move(h));
        return;
      }
      if (!rec) return h(Error{rec.error().message});
      h(Error{fmt::format("vm '{}' is not registered and has no recorded outcome in {}", id,
                          self->opt.state_dir.string())});
    });
  });
}

asio::awaitable<WaitResult> Host::wait(std::string vm) {
  // A timer that never expires on its own is the coroutine's event: async_wait's handler stores
  // the result and cancels it.
  auto ev = std::make_shared<asio::steady_timer>(impl_->io, asio::steady_timer::time_point::max());
  auto result = std::make_shared<std::optional<WaitResult>>();
  async_wait(vm, [ev, result](WaitResult r) {
    *result = std::move(r);
    ev->cancel();
  });
  while (!*result) {
    error_code ec;
    co_await ev->async_wait(asio::redirect_error(asio::use_awaitable, ec));
  }
  co_return std::move(**result);
}

Status Host::forget_vm(const std::string& id) {
  auto vm = impl_->find(id);
  if (!vm) return no_vm(id);
  if (!vm->core.finished())
    return Error{fmt::format("vm '{}': its session is still live; shutdown() it first", id)};
  impl_->close_stream(vm);
  impl_->finished(vm);
  vm->cancel_all();
  impl_->cids.remove_vm(id);
  impl_->vms.erase(id);  // late completions hold their own shared_ptr and see !current()
  return Ok{};
}

std::size_t Host::live_sessions() const {
  std::size_t n = 0;
  for (auto& [id, vm] : impl_->vms)
    if (!vm->core.finished()) ++n;
  return n;
}

const Session* Host::session(const std::string& vm) const {
  auto v = impl_->find(vm);
  return v ? &v->core : nullptr;
}

std::size_t Host::buffered_bytes(const std::string& vm) const {
  auto v = impl_->find(vm);
  return v && v->stream ? v->stream->reader.buffered() : 0;
}

}  // namespace nes::host
