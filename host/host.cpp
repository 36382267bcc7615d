#include "host/host.hpp"

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
#include <fmt/format.h>
#include <map>

namespace nes::host {

namespace asio = boost::asio;
using boost::system::error_code;
using generic_stream = asio::generic::stream_protocol;
using unix_acceptor = asio::local::stream_protocol::acceptor;
using generic_acceptor = asio::basic_socket_acceptor<generic_stream>;

namespace detail {

/// One guest byte stream (Unix, vsock, or handed-in fd).
struct Stream {
  Stream(asio::io_context& io, int fd, int family) : sock(io), flush_timer(io) {
    error_code ec;
    sock.assign(generic_stream(family, 0), fd, ec);
    if (ec) ::close(fd);
  }
  generic_stream::socket sock;
  asio::steady_timer flush_timer;  // bounds the final flush before close
  std::deque<std::string> outq;
  std::size_t out_bytes = 0;
  bool writing = false;
  bool closed = false;          // the session is done with it (no more events from it)
  bool close_after_flush = false;
};

/// One registered VM generation and its I/O objects.
struct Vm {
  Vm(asio::io_context& io, SessionConfig cfg)
      : core(std::move(cfg)), ready_timer(io), wall_timer(io), stop_timer(io), grace_timer(io) {}
  Session core;
  std::shared_ptr<Stream> stream;
  std::shared_ptr<unix_acceptor> acceptor;
  std::string socket_path;  // unlinked when the session finishes
  asio::steady_timer ready_timer, wall_timer, stop_timer, grace_timer;
  std::uint64_t timer_seq[4] = {0, 0, 0, 0};  // one per TimerKind
  std::vector<std::function<void(WaitResult)>> waiters;
  std::optional<WaitResult> result;  // settled: durable record, or why not
  bool draining = false;

  const std::string& id() const { return core.config().vm; }
  std::uint64_t generation() const { return core.config().generation; }
  asio::steady_timer& timer(TimerKind k) {
    switch (k) {
      case TimerKind::ready: return ready_timer;
      case TimerKind::wall: return wall_timer;
      case TimerKind::stop: return stop_timer;
      case TimerKind::grace: return grace_timer;
    }
    return stop_timer;
  }
};

}  // namespace detail

using detail::Stream;
using detail::Vm;

struct Host::Impl : std::enable_shared_from_this<Host::Impl> {
  Impl(asio::io_context& io_, HostOptions opt_)
      : io(io_), opt(std::move(opt_)), pool(std::max<std::size_t>(1, opt.writer_threads)) {}

  asio::io_context& io;
  HostOptions opt;
  asio::thread_pool pool;
  std::map<std::string, std::shared_ptr<Vm>> vms;
  CidRegistry cids;
  std::shared_ptr<generic_acceptor> vsock;

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
  }

  void execute(const std::shared_ptr<Vm>& vm, Action& a) {
    std::visit(
        [&](auto& x) {
          using T = std::decay_t<decltype(x)>;
          if constexpr (std::is_same_v<T, act::Send>) {
            send(vm, std::move(x.line));
          } else if constexpr (std::is_same_v<T, act::CloseStream>) {
            close_stream(vm);
          } else if constexpr (std::is_same_v<T, act::ArmTimer>) {
            arm(vm, x.kind, x.after);
          } else if constexpr (std::is_same_v<T, act::CancelTimer>) {
            ++vm->timer_seq[static_cast<int>(x.kind)];
            vm->timer(x.kind).cancel();
          } else if constexpr (std::is_same_v<T, act::WriteRecord>) {
            write(vm, std::move(x.record));
          } else if constexpr (std::is_same_v<T, act::CallDestroy>) {
            if (opt.hooks.destroy) opt.hooks.destroy(vm->id(), vm->generation());
          } else if constexpr (std::is_same_v<T, act::CallRemove>) {
            if (opt.hooks.remove) opt.hooks.remove(vm->id(), vm->generation());
          } else if constexpr (std::is_same_v<T, act::Log>) {
            emit(*vm, std::move(x.kind), std::move(x.detail), x.milestone);
          } else if constexpr (std::is_same_v<T, act::Finished>) {
            finished(vm);
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
    auto seq = ++vm->timer_seq[static_cast<int>(k)];
    auto& t = vm->timer(k);
    t.expires_after(after);
    std::weak_ptr<Impl> w = shared_from_this();
    t.async_wait([w, vm, k, seq](error_code ec) {
      auto self = w.lock();
      if (ec || !self || vm->timer_seq[static_cast<int>(k)] != seq || !self->current(vm)) return;
      vm->core.timer_fired(k, wall_now());
      self->drain(vm);
    });
  }

  void write(const std::shared_ptr<Vm>& vm, Record rec) {
    std::weak_ptr<Impl> w = shared_from_this();
    asio::post(pool, [w, vm, rec = std::move(rec), dir = opt.state_dir, wopt = opt.write,
                      &io = io]() mutable {
      auto res = write_record(dir, rec, wopt);
      asio::post(io, [w, vm, res = std::move(res), rec = std::move(rec)]() mutable {
        auto self = w.lock();
        if (!self) return;
        self->record_done(vm, rec, res);
      });
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

  void finished(const std::shared_ptr<Vm>& vm) {
    if (vm->acceptor) {
      error_code ec;
      vm->acceptor->close(ec);
      vm->acceptor.reset();
    }
    if (!vm->socket_path.empty()) {
      ::unlink(vm->socket_path.c_str());
      vm->socket_path.clear();
    }
  }

  // ---- streams ----

  void adopt(const std::shared_ptr<Vm>& vm, int fd, int family) {
    if (!vm->core.stream_opened(wall_now())) {
      ::close(fd);
      drain(vm);
      return;
    }
    auto st = std::make_shared<Stream>(io, fd, family);
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
    vm->core.stream_closed(wall_now());
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
        vm->core.received(std::string_view(buf.data(), n), wall_now());
        self->drain(vm);
        if (st->closed) co_return;
      }
      if (ec) {
        self->stream_gone(vm, st);
        co_return;
      }
    }
  }

  static asio::awaitable<void> accept_loop(std::weak_ptr<Impl> w, std::shared_ptr<Vm> vm,
                                           std::shared_ptr<unix_acceptor> acc) {
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
      self->adopt(vm, s.release(), AF_UNIX);
    }
  }

  static asio::awaitable<void> vsock_accept_loop(std::weak_ptr<Impl> w,
                                                 std::shared_ptr<generic_acceptor> acc) {
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
      self->adopt(vm, s.release(), AF_VSOCK);
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
      vm->ready_timer.cancel();
      vm->wall_timer.cancel();
      vm->stop_timer.cancel();
      vm->grace_timer.cancel();
      if (!vm->socket_path.empty()) ::unlink(vm->socket_path.c_str());
    }
    if (vsock) {
      error_code ec;
      vsock->close(ec);
    }
    pool.join();
  }
};

Host::Host(asio::io_context& io, HostOptions opt)
    : impl_(std::make_shared<Impl>(io, std::move(opt))) {}

Host::~Host() { impl_->teardown(); }

Status Host::add_vm(SessionConfig cfg) {
  if (auto p = vm_id_problem(cfg.vm)) return Error{"vm: " + *p};
  if (cfg.descriptor.exec.argv.empty()) return Error{"descriptor: exec.argv is empty"};
  if (auto old = impl_->find(cfg.vm)) {
    if (old->generation() >= cfg.generation)
      return Error{fmt::format("vm '{}': generation {} is registered; a new one must be newer than "
                               "that, got {}",
                               cfg.vm, old->generation(), cfg.generation)};
    // Superseded: close its I/O; its late completions see !current() and are dropped.
    impl_->close_stream(old);
    impl_->finished(old);
    old->ready_timer.cancel();
    old->wall_timer.cancel();
    old->stop_timer.cancel();
    old->grace_timer.cancel();
    impl_->settle(old, Error{fmt::format("vm '{}': generation {} superseded by {}", cfg.vm,
                                         old->generation(), cfg.generation)});
  }
  auto vm = std::make_shared<Vm>(impl_->io, std::move(cfg));
  impl_->vms[vm->id()] = vm;
  impl_->emit(*vm, "registered", fmt::format("generation={} on_exit={}", vm->generation(),
                                             to_string(vm->core.config().on_exit)));
  return Ok{};
}

namespace {
Error no_vm(const std::string& vm) { return Error{fmt::format("vm '{}' is not registered", vm)}; }
}  // namespace

Status Host::listen_unix(const std::string& id, const UnixListenOptions& opt) {
  auto vm = impl_->find(id);
  if (!vm) return no_vm(id);
  if (vm->acceptor) return Error{fmt::format("vm '{}' already has a listener", id)};
  auto fd = nes::host::listen_unix(opt);
  if (!fd) return fd.error();
  auto acc = std::make_shared<unix_acceptor>(impl_->io);
  error_code ec;
  acc->assign(asio::local::stream_protocol(), fd->get(), ec);
  if (ec) {
    ::unlink(opt.path.c_str());
    return Error{fmt::format("listen {}: {}", opt.path, ec.message())};
  }
  fd->release();
  vm->acceptor = acc;
  vm->socket_path = opt.path;
  impl_->emit(*vm, "listening", "unix:" + opt.path);
  asio::co_spawn(impl_->io, Impl::accept_loop(impl_, vm, acc), asio::detached);
  return Ok{};
}

Status Host::attach_stream(const std::string& id, Fd fd) {
  auto vm = impl_->find(id);
  if (!vm) return no_vm(id);
  if (!fd) return Error{"attach_stream: invalid fd"};
  impl_->adopt(vm, fd.release(), AF_UNIX);
  return Ok{};
}

Status Host::listen_vsock(std::uint32_t port) {
  if (impl_->vsock) return Error{"a vsock listener is already open"};
  auto fd = nes::host::listen_vsock(port);
  if (!fd) return fd.error();
  auto acc = std::make_shared<generic_acceptor>(impl_->io);
  error_code ec;
  acc->assign(generic_stream(AF_VSOCK, 0), fd->get(), ec);
  if (ec) return Error{fmt::format("vsock:{}: {}", port, ec.message())};
  fd->release();
  impl_->vsock = acc;
  asio::co_spawn(impl_->io, Impl::vsock_accept_loop(impl_, acc), asio::detached);
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
      if (vm && vm->result) return h(*vm->result);
      if (rec && *rec && (!gen || (*rec)->generation >= *gen)) {
        // A record of this generation (or newer) exists: immediate. With no VM registered,
        // whatever is recorded is the answer.
        return h(**rec);
      }
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
  vm->ready_timer.cancel();
  vm->wall_timer.cancel();
  vm->stop_timer.cancel();
  vm->grace_timer.cancel();
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

}  // namespace nes::host
