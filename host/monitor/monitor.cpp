#include "host/monitor/monitor.hpp"

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <boost/asio/local/stream_protocol.hpp>
#include <boost/asio/read_until.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/streambuf.hpp>
#include <boost/asio/write.hpp>
#include <algorithm>
#include <cerrno>
#include <deque>
#include <cstring>
#include <fmt/format.h>

#include "host/lib/state_dir.hpp"
#include "host/monitor/reconcile.hpp"

namespace nes::monitor {

namespace asio = boost::asio;
namespace fs = std::filesystem;
using local = asio::local::stream_protocol;
using namespace std::chrono_literals;

namespace {

std::string errno_text(int e) { return std::strerror(e); }

/// The last `cap` bytes of a file, whole lines only.
std::string tail_of(const fs::path& p, std::size_t cap) {
  host::Fd f{::open(p.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW)};
  if (!f) return {};
  off_t end = ::lseek(f.get(), 0, SEEK_END);
  if (end <= 0) return {};
  off_t from = end > static_cast<off_t>(cap) ? end - static_cast<off_t>(cap) : 0;
  std::string s(static_cast<std::size_t>(end - from), '\0');
  ssize_t n = ::pread(f.get(), s.data(), s.size(), from);
  if (n <= 0) return {};
  s.resize(static_cast<std::size_t>(n));
  if (from > 0) {
    auto nl = s.find('\n');
    s = nl == std::string::npos ? std::string() : s.substr(nl + 1);
  }
  return s;
}

/// `sockaddr_un` for `path`, through /proc/self/fd/DIRFD when the path is too long for sun_path.
struct UnixAddr {
  sockaddr_un sa{};
  socklen_t len = 0;
  host::Fd dir;  // held while the address is used
};
host::Result<UnixAddr> unix_addr(const fs::path& path) {
  UnixAddr a;
  a.sa.sun_family = AF_UNIX;
  std::string p = path.string();
  if (p.size() >= sizeof a.sa.sun_path) {
    a.dir.reset(::open(path.parent_path().c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC));
    // No directory yet (the monitor has not made its VM's dir): no monitor, as ENOENT at connect
    // says (the shim's early controls retry on that: host/shim/deliver.hpp not_ready_yet()).
    if (!a.dir && errno == ENOENT)
      return host::Error{fmt::format("no monitor at {}: its directory does not exist yet", path.string())};
    if (!a.dir) return host::Error{fmt::format("open {}: {}", path.parent_path().string(), errno_text(errno))};
    p = fmt::format("/proc/self/fd/{}/{}", a.dir.get(), path.filename().string());
    if (p.size() >= sizeof a.sa.sun_path)
      return host::Error{fmt::format("{}: socket name too long", path.string())};
  }
  std::memcpy(a.sa.sun_path, p.data(), p.size());
  a.len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + p.size() + 1);
  return a;
}

}  // namespace

// ---- detach ----

host::Result<Detached> detach(const fs::path& state, const std::string& vm, std::chrono::milliseconds bound) {
  // A VM already running under this id is refused here, in the creator's words, rather than by a
  // monitor that was forked only to fail its claim (docker run: "name already in use"). The claim
  // (host/monitor/reconcile.hpp) still decides a race between two creators.
  if (auto s = host::reconcile(state, vm); s && *s && (*s)->status == host::VmStatus::running && (*s)->monitor)
    return host::Error{fmt::format("VM '{}' is running in {} (monitor pid {}, generation {}): stop it or rm -f it first, "
                                   "or give another --vm",
                                   vm, state.string(), (*s)->monitor->monitor.pid, (*s)->generation)};
  fs::path dir = state / vm;
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return host::Error{fmt::format("--state: cannot create {}: {}", dir.string(), ec.message())};
  ::chmod(dir.c_str(), 0700);
  const fs::path log_path = dir / host::kMonitorLog;
  // Appended across generations, restarted once it passes 1 MiB (bounded).
  int flags = O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC | O_NOFOLLOW;
  struct stat st{};
  if (::stat(log_path.c_str(), &st) == 0 && st.st_size > (1 << 20)) flags |= O_TRUNC;
  host::Fd log{::open(log_path.c_str(), flags, 0600)};
  if (!log) return host::Error{fmt::format("open {}: {}", log_path.string(), errno_text(errno))};
  host::Fd null{::open("/dev/null", O_RDWR | O_CLOEXEC)};
  if (!null) return host::Error{fmt::format("open /dev/null: {}", errno_text(errno))};
  int p[2];
  if (::pipe2(p, O_CLOEXEC) != 0) return host::Error{fmt::format("pipe: {}", errno_text(errno))};
  host::Fd rd{p[0]}, wr{p[1]};
  std::fflush(stdout);
  std::fflush(stderr);
  pid_t pid = ::fork();
  if (pid < 0) return host::Error{fmt::format("fork: {}", errno_text(errno))};
  if (pid == 0) {
    // The monitor: its own session (no controlling terminal: a hang-up there is not ours), and
    // no descriptor of the creator's terminal or pipes, so the creator's reader sees EOF as soon
    // as the creator exits.
    ::setsid();
    ::dup2(null.get(), 0);
    ::dup2(null.get(), 1);
    ::dup2(log.get(), 2);
    rd.reset();
    Detached d;
    d.notify = std::move(wr);
    return d;
  }
  wr.reset();
  Detached d;
  d.creator = true;
  pollfd pf{rd.get(), POLLIN, 0};
  auto deadline = std::chrono::steady_clock::now() + bound;
  std::string got;
  for (;;) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) break;
    int n = ::poll(&pf, 1, static_cast<int>(std::min<long long>(left.count(), 1 << 30)));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    char buf[64];
    ssize_t r = ::read(rd.get(), buf, sizeof buf);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) break;
    got.append(buf, static_cast<std::size_t>(r));
    if (got.find('\n') != std::string::npos) break;
  }
  if (got.starts_with("started\n")) {
    std::fputs((vm + "\n").c_str(), stdout);
    std::fflush(stdout);
    d.exit_status = 0;
    return d;
  }
  // No start: say why from the state dir (the one reconcile rule) and the monitor's own words.
  auto s = host::reconcile(state, vm);
  std::string why;
  d.exit_status = 125;
  if (s && *s && (*s)->status != host::VmStatus::running) {
    why = fmt::format("VM {} {}: {}", vm, host::to_string((*s)->status), (*s)->reason);
    d.exit_status = (*s)->exit_status.value_or(125);
  } else if (got.empty() && pf.revents == 0) {
    why = fmt::format("VM {}: the workload did not start within {} ms; stopping it", vm, bound.count());
    (void)control_request(host::control_path(state, vm), control::Stop{}, 2s);
  } else {
    why = fmt::format("VM {}: the monitor ended before the workload started", vm);
  }
  std::string tail = tail_of(log_path, 4096);
  std::fputs(fmt::format("{}neshost run: {}\n", tail, why).c_str(), stderr);
  return d;
}

void notify_started(host::Fd& notify) {
  if (!notify) return;
  static constexpr std::string_view kMsg = "started\n";
  [[maybe_unused]] auto n = ::write(notify.get(), kMsg.data(), kMsg.size());
  notify.reset();
}

// ---- control socket: server ----

struct ControlServer::Impl : std::enable_shared_from_this<Impl> {
  Impl(asio::io_context& io) : io(io), acceptor(io) {}
  asio::io_context& io;
  local::acceptor acceptor;
  fs::path path;
  Handler handler;
  // Connections being served: at most 8 short requests beside one `exec` and one `wait`
  // connection for each process the guest may run at once (proto::kExecMax).
  std::size_t live = 0;
  static constexpr std::size_t kLiveMax = 8 + 2 * proto::kExecMax;
  bool closed = false;
  bool accepting = true;  // false: replies only (stop_accepting)

  void accept() {
    auto self = shared_from_this();
    acceptor.async_accept([self](boost::system::error_code ec, local::socket sock) {
      if (self->closed || !self->accepting || ec == asio::error::operation_aborted) return;
      if (!ec) self->serve(std::move(sock));
      self->accept();
    });
  }

  struct Conn {
    Conn(local::socket s, asio::io_context& io) : sock(std::move(s)), timer(io) {}
    local::socket sock;
    asio::steady_timer timer;
    std::string in;
    std::vector<host::Fd> fds;
    std::deque<std::string> out;
    bool writing = false, last_queued = false, done = false;
    bool watching = false;  // a reply said more follows: the client's hang-up ends the connection
  };

  void serve(local::socket sock) {
    ucred cred{};
    socklen_t len = sizeof cred;
    if (::getsockopt(sock.native_handle(), SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0 ||
        (cred.uid != ::geteuid() && cred.uid != 0) || live >= kLiveMax)
      return;  // closed unanswered
    ++live;
    auto c = std::make_shared<Conn>(std::move(sock), io);
    bound(c, 2s);
    read_request(c);
  }

  /// Closes `c` after `after` unless re-bounded or done first.
  void bound(const std::shared_ptr<Conn>& c, std::chrono::milliseconds after) {
    c->timer.expires_after(after);
    c->timer.async_wait([self = shared_from_this(), c](boost::system::error_code ec) {
      if (!ec) self->end(c);
    });
  }

  void end(const std::shared_ptr<Conn>& c) {
    if (c->done) return;
    c->done = true;
    --live;
    c->timer.cancel();
    boost::system::error_code ig;
    c->sock.close(ig);
  }

  /// The request line, read with recvmsg(2) so the fds it carries (SCM_RIGHTS) are taken, not
  /// dropped as read(2) would drop them.
  void read_request(const std::shared_ptr<Conn>& c) {
    c->sock.async_wait(local::socket::wait_read, [self = shared_from_this(), c](boost::system::error_code ec) {
      if (ec || self->closed || !self->accepting || c->done) return self->end(c);
      char buf[4096];
      alignas(cmsghdr) char ctl[CMSG_SPACE(4 * sizeof(int))];
      iovec iov{buf, sizeof buf};
      msghdr mh{};
      mh.msg_iov = &iov;
      mh.msg_iovlen = 1;
      mh.msg_control = ctl;
      mh.msg_controllen = sizeof ctl;
      ssize_t n = ::recvmsg(c->sock.native_handle(), &mh, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
      if (n < 0 && (errno == EAGAIN || errno == EINTR)) return self->read_request(c);
      for (cmsghdr* h = CMSG_FIRSTHDR(&mh); n >= 0 && h; h = CMSG_NXTHDR(&mh, h)) {
        if (h->cmsg_level != SOL_SOCKET || h->cmsg_type != SCM_RIGHTS) continue;
        const std::size_t k = (h->cmsg_len - CMSG_LEN(0)) / sizeof(int);
        for (std::size_t i = 0; i < k; ++i) {
          int fd;
          std::memcpy(&fd, CMSG_DATA(h) + i * sizeof(int), sizeof fd);
          c->fds.emplace_back(fd);  // owned: closed with the request unless the handler keeps it
        }
      }
      if (n <= 0 || (mh.msg_flags & MSG_CTRUNC) || c->fds.size() > 3) return self->end(c);
      c->in.append(buf, static_cast<std::size_t>(n));
      auto nl = c->in.find('\n');
      if (nl == std::string::npos) {
        if (c->in.size() > kControlRequestMax) return self->end(c);
        return self->read_request(c);
      }
      if (nl > kControlRequestMax) return self->end(c);
      std::string line = c->in.substr(0, nl);
      // The answer may wait for the guest (`ps`): bounded anew, until its first line.
      self->bound(c, 5s);
      std::weak_ptr<Impl> w = self;
      self->handler(line, std::move(c->fds), [w, c](std::string reply, bool more) {
        auto self = w.lock();
        if (!self || self->closed || c->done || c->last_queued) return;
        if (more) {
          c->timer.cancel();  // the sender bounds what follows
          if (!std::exchange(c->watching, true)) self->watch_hangup(c);
        }
        c->last_queued = !more;
        c->out.push_back(std::move(reply) + "\n");
        self->write_next(c);
      });
    });
  }

  /// A connection whose answer goes on (`exec`, `wait`): the client going (EOF, a reset) ends it
  /// at once, so a SIGKILLed client frees its slot (kLiveMax) instead of holding it until the
  /// process ends. A client has nothing more to say after its request: bytes are a hang-up too.
  void watch_hangup(const std::shared_ptr<Conn>& c) {
    c->sock.async_wait(local::socket::wait_read, [self = shared_from_this(), c](boost::system::error_code ec) {
      if (ec || c->done) return;
      char b;
      const ssize_t n = ::recv(c->sock.native_handle(), &b, 1, MSG_PEEK | MSG_DONTWAIT);
      if (n < 0 && (errno == EAGAIN || errno == EINTR)) return self->watch_hangup(c);
      self->end(c);
    });
  }

  void write_next(const std::shared_ptr<Conn>& c) {
    if (c->writing || c->done) return;
    if (c->out.empty()) {
      if (c->last_queued) end(c);
      return;
    }
    c->writing = true;
    asio::async_write(c->sock, asio::buffer(c->out.front()),
                      [self = shared_from_this(), c](boost::system::error_code ec, std::size_t) {
                        c->writing = false;
                        if (ec) return self->end(c);
                        c->out.pop_front();
                        self->write_next(c);
                      });
  }
};

host::Result<std::unique_ptr<ControlServer>> ControlServer::start(asio::io_context& io, const fs::path& path,
                                                                  Handler handler) {
  auto addr = unix_addr(path);
  if (!addr) return addr.error();
  host::Fd s{::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0)};
  if (!s) return host::Error{fmt::format("socket: {}", errno_text(errno))};
  ::unlink(addr->sa.sun_path);  // a stale socket of a killed monitor of this VM
  // 0600 from the start: bind under a umask that leaves only the owner.
  mode_t old = ::umask(0177);
  int rc = ::bind(s.get(), reinterpret_cast<const sockaddr*>(&addr->sa), addr->len);
  int e = errno;
  ::umask(old);
  if (rc != 0) return host::Error{fmt::format("bind {}: {}", path.string(), errno_text(e))};
  if (::listen(s.get(), 8) != 0) return host::Error{fmt::format("listen {}: {}", path.string(), errno_text(errno))};
  auto impl = std::make_shared<Impl>(io);
  impl->path = path;
  impl->handler = std::move(handler);
  boost::system::error_code ec;
  impl->acceptor.assign(local(), s.release(), ec);
  if (ec) return host::Error{fmt::format("{}: {}", path.string(), ec.message())};
  impl->accept();
  return std::unique_ptr<ControlServer>(new ControlServer(std::move(impl)));
}

void ControlServer::stop_accepting() {
  impl_->accepting = false;
  boost::system::error_code ec;
  impl_->acceptor.close(ec);
  if (auto addr = unix_addr(impl_->path)) ::unlink(addr->sa.sun_path);
}

ControlServer::~ControlServer() {
  impl_->closed = true;
  boost::system::error_code ec;
  impl_->acceptor.close(ec);
  if (auto addr = unix_addr(impl_->path)) ::unlink(addr->sa.sun_path);
}

// ---- control socket: the dispatch ----

bool AppliedSeqs::seen(std::uint64_t seq) const { return std::find(kept.begin(), kept.end(), seq) != kept.end(); }

void AppliedSeqs::keep(std::uint64_t seq) {
  if (seen(seq)) return;
  if (kept.size() == control::kSeqsKept) kept.pop_front();
  kept.push_back(seq);
}

ControlServer::Handler control_handler(ControlHandlers handlers) {
  auto hs = std::make_shared<const ControlHandlers>(std::move(handlers));
  auto applied = std::make_shared<AppliedSeqs>();
  return [hs, applied](std::string_view line, std::vector<host::Fd> fds, ControlServer::Reply send) {
    ControlRespond respond = [send = std::move(send)](control::Reply r) {
      const bool more = !control::is_final(r);
      send(control::encode(r), more);
    };
    auto targeted = control::parse_targeted(line);
    if (!targeted) return respond(control::Error{targeted.error().message});
    // Fencing: a request aimed at another generation of this VM is not this monitor's to serve.
    if (targeted->generation && hs->generation && *targeted->generation != hs->generation)
      return respond(control::Error{fmt::format(
          "generation: this monitor serves generation {} of the VM; the request targets generation {}",
          hs->generation, *targeted->generation)});
    auto* req = &targeted->request;
    const auto seq = targeted->seq;
    // A journaled control applied before (its answer lost, the shim replaced): Ok, not again.
    if (seq && applied->seen(*seq)) return respond(control::Ok{});
    auto answer = [&](const host::Status& s) {
      if (s && seq) applied->keep(*seq);
      respond(s ? control::Reply{control::Ok{}} : control::Reply{control::Error{s.error().message}});
    };
    auto unserved = [&](std::string_view what) { respond(control::Error{fmt::format("{}: not served here", what)}); };
    if (std::holds_alternative<control::Stop>(*req)) return hs->stop ? answer(hs->stop()) : unserved("stop");
    if (auto* k = std::get_if<control::Kill>(&*req)) return hs->kill ? answer(hs->kill(*k)) : unserved("kill");
    if (auto* z = std::get_if<control::Resize>(&*req)) return hs->resize ? answer(hs->resize(*z)) : unserved("resize");
    if (std::holds_alternative<control::Pause>(*req)) return hs->pause ? answer(hs->pause()) : unserved("pause");
    if (std::holds_alternative<control::Resume>(*req)) return hs->resume ? answer(hs->resume()) : unserved("resume");
    if (std::holds_alternative<control::Ps>(*req)) {
      if (!hs->ps) return unserved("ps");
      return hs->ps([respond](host::Result<proto::Processes> r) {
        respond(r ? control::Reply{control::ProcessList{std::move(*r)}}
                  : control::Reply{control::Error{r.error().message}});
      });
    }
    if (auto* r = std::get_if<control::Resources>(&*req)) {
      if (!hs->resources) return unserved("resources");
      return hs->resources(r->request, [respond](host::Result<proto::ContainerResourcesReply> a) {
        respond(a ? control::Reply{control::ResourcesReply{std::move(*a)}}
                  : control::Reply{control::Error{a.error().message}});
      });
    }
    if (std::holds_alternative<control::CloseStdin>(*req))
      return hs->close_stdin ? answer(hs->close_stdin()) : unserved("close-stdin");
    if (auto* w = std::get_if<control::Wait>(&*req)) return hs->wait ? hs->wait(*w, std::move(respond)) : unserved("wait");
    auto& x = std::get<control::Exec>(*req);
    if (!hs->exec) return unserved("exec");
    hs->exec(std::move(x), std::move(fds), std::move(respond));
  };
}

// ---- control socket: client ----

namespace {
host::Result<control::Reply> control_request_once(const fs::path& path, const control::Targeted& request,
                                                  std::chrono::milliseconds timeout);
}  // namespace

host::Result<control::Reply> control_request(const fs::path& path, const control::Request& request,
                                             std::chrono::milliseconds timeout) {
  return control_request(path, control::Targeted{std::nullopt, request, std::nullopt}, timeout);
}

host::Result<control::Reply> control_request(const fs::path& path, const control::Targeted& request,
                                             std::chrono::milliseconds timeout) {
  if (auto v = control::validate(request); !v) return v.error();
  auto r = control_request_once(path, request, timeout);
  // A monitor that predates the generation prefix does not know it: it serves the one VM of its
  // state dir and cannot check, so the bare request goes once.
  if (request.generation && r)
    if (auto* e = std::get_if<control::Error>(&*r); e && e->message.starts_with("unknown request 'generation "))
      return control_request_once(path, control::Targeted{std::nullopt, request.request, std::nullopt}, timeout);
  // Likewise one that predates the sequence prefix: it cannot dedupe, the request goes once.
  if (request.seq && r)
    if (auto* e = std::get_if<control::Error>(&*r); e && e->message.starts_with("unknown request 'seq "))
      return control_request_once(path, control::Targeted{request.generation, request.request, std::nullopt}, timeout);
  return r;
}

namespace {
host::Result<control::Reply> control_request_once(const fs::path& path, const control::Targeted& request,
                                                  std::chrono::milliseconds timeout) {
  auto addr = unix_addr(path);
  if (!addr) return addr.error();
  host::Fd s{::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0)};
  if (!s) return host::Error{fmt::format("socket: {}", errno_text(errno))};
  timeval tv{static_cast<time_t>(timeout.count() / 1000), static_cast<suseconds_t>(timeout.count() % 1000 * 1000)};
  ::setsockopt(s.get(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  ::setsockopt(s.get(), SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
  if (::connect(s.get(), reinterpret_cast<const sockaddr*>(&addr->sa), addr->len) != 0)
    return host::Error{fmt::format("no monitor at {}: {}", path.string(), errno_text(errno))};
  std::string line = control::encode(request) + "\n";
  if (::send(s.get(), line.data(), line.size(), MSG_NOSIGNAL) != static_cast<ssize_t>(line.size()))
    return host::Error{fmt::format("{}: send: {}", path.string(), errno_text(errno))};
  std::string reply;
  char buf[4096];
  while (reply.find('\n') == std::string::npos && reply.size() < kControlReplyMax) {
    ssize_t n = ::recv(s.get(), buf, sizeof buf, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0)
      return host::Error{fmt::format("{}: {}", path.string(),
                                     errno == EAGAIN ? "no reply in time" : errno_text(errno))};
    if (n == 0) break;
    reply.append(buf, static_cast<std::size_t>(n));
  }
  if (auto nl = reply.find('\n'); nl != std::string::npos) reply.resize(nl);
  else if (reply.empty()) return host::Error{fmt::format("{}: the monitor closed without a reply", path.string())};
  auto r = control::parse_reply(reply);
  if (!r) return host::Error{fmt::format("{}: unexpected reply: {}", path.string(), r.error().message)};
  return std::move(*r);
}

}  // namespace

host::Status control_call(const fs::path& path, const control::Request& request, std::chrono::milliseconds timeout) {
  return control_call(path, control::Targeted{std::nullopt, request, std::nullopt}, timeout);
}

host::Status control_call(const fs::path& path, const control::Targeted& request, std::chrono::milliseconds timeout) {
  auto r = control_request(path, request, timeout);
  if (!r) return r.error();
  if (!std::holds_alternative<control::Ok>(*r)) return host::Error{control::encode(*r)};
  return host::Ok{};
}

host::Result<ControlSession> ControlSession::open(const fs::path& path, const control::Request& request,
                                                 const std::vector<int>& fds) {
  return open(path, control::Targeted{std::nullopt, request, std::nullopt}, fds);
}

host::Result<ControlSession> ControlSession::open(const fs::path& path, const control::Targeted& request,
                                                 const std::vector<int>& fds) {
  if (auto v = control::validate(request); !v) return v.error();
  auto addr = unix_addr(path);
  if (!addr) return addr.error();
  host::Fd s{::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0)};
  if (!s) return host::Error{fmt::format("socket: {}", errno_text(errno))};
  if (::connect(s.get(), reinterpret_cast<const sockaddr*>(&addr->sa), addr->len) != 0)
    return host::Error{fmt::format("no monitor at {}: {}", path.string(), errno_text(errno))};
  std::string line = control::encode(request) + "\n";
  if (line.size() > kControlRequestMax + 1)
    return host::Error{fmt::format("request over {} bytes", kControlRequestMax)};
  if (fds.size() > 3) return host::Error{"at most 3 fds per request"};
  alignas(cmsghdr) char ctl[CMSG_SPACE(3 * sizeof(int))] = {};
  std::size_t off = 0;
  while (off < line.size()) {
    iovec iov{line.data() + off, line.size() - off};
    msghdr mh{};
    mh.msg_iov = &iov;
    mh.msg_iovlen = 1;
    if (off == 0 && !fds.empty()) {  // the fds ride with the first byte
      mh.msg_control = ctl;
      mh.msg_controllen = CMSG_SPACE(fds.size() * sizeof(int));
      cmsghdr* h = CMSG_FIRSTHDR(&mh);
      h->cmsg_level = SOL_SOCKET;
      h->cmsg_type = SCM_RIGHTS;
      h->cmsg_len = CMSG_LEN(fds.size() * sizeof(int));
      std::memcpy(CMSG_DATA(h), fds.data(), fds.size() * sizeof(int));
    }
    ssize_t n = ::sendmsg(s.get(), &mh, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return host::Error{fmt::format("{}: send: {}", path.string(), errno_text(errno))};
    off += static_cast<std::size_t>(n);
  }
  return ControlSession(std::move(s));
}

host::Result<control::Reply> ControlSession::read_reply(std::optional<std::chrono::milliseconds> timeout) {
  const auto until = timeout ? std::optional(std::chrono::steady_clock::now() + *timeout) : std::nullopt;
  for (;;) {
    if (auto nl = buf_.find('\n'); nl != std::string::npos) {
      auto r = control::parse_reply(std::string_view(buf_).substr(0, nl));
      buf_.erase(0, nl + 1);
      if (!r) return host::Error{"unexpected answer: " + r.error().message};
      return std::move(*r);
    }
    if (buf_.size() > kControlReplyMax) return host::Error{"a reply line over the cap"};
    int ms = -1;
    if (until) {
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(*until - std::chrono::steady_clock::now());
      if (left.count() <= 0) return host::Error{"no reply in time", ETIMEDOUT};
      ms = static_cast<int>(left.count());
    }
    pollfd p{sock_.get(), POLLIN, 0};
    int r = ::poll(&p, 1, ms);
    if (r < 0 && errno == EINTR) continue;
    if (r == 0) return host::Error{"no reply in time", ETIMEDOUT};
    char b[4096];
    ssize_t n = ::recv(sock_.get(), b, sizeof b, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return host::errno_error(errno);
    if (n == 0) return host::Error{"the monitor closed without a reply", ECONNRESET};
    buf_.append(b, static_cast<std::size_t>(n));
  }
}

host::Result<proto::Processes> guest_processes(const fs::path& path) {
  auto r = control_request(path, control::Ps{});
  if (!r) return r.error();
  if (auto* e = std::get_if<control::Error>(&*r)) return host::Error{e->message};
  if (auto* l = std::get_if<control::ProcessList>(&*r)) return std::move(l->processes);
  return host::Error{fmt::format("{}: the reply to ps is not a process list", path.string())};
}

host::Result<proto::ContainerResourcesReply> container_resources(const fs::path& path,
                                                                 const proto::ContainerResourcesRequest& req) {
  auto r = control_request(path, control::Resources{req});
  if (!r) return r.error();
  if (auto* e = std::get_if<control::Error>(&*r)) return host::Error{e->message};
  if (auto* a = std::get_if<control::ResourcesReply>(&*r)) return std::move(a->reply);
  return host::Error{fmt::format("{}: the reply to resources is not a container_resources answer", path.string())};
}

}  // namespace nes::monitor
