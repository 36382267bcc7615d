// ttrpc framing, envelope and the Asio server/client (host/shim/ttrpc.hpp).
#include "host/shim/ttrpc.hpp"

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <cstring>
#include <deque>
#include <list>

#include <boost/asio/local/stream_protocol.hpp>
#include <boost/asio/write.hpp>
#include <fmt/format.h>

#include "ttrpc.pb.h"

namespace nes::ttrpc {
namespace asio = boost::asio;
using host::Error;
using host::Fd;
using host::Result;

std::string encode_request(const Call& c) {
  wire::Request r;
  r.set_service(c.service);
  r.set_method(c.method);
  r.set_payload(c.payload);
  r.set_timeout_nano(c.timeout_ns);
  for (const auto& [k, v] : c.metadata) {
    auto* kv = r.add_metadata();
    kv->set_key(k);
    kv->set_value(v);
  }
  return r.SerializeAsString();
}

std::string encode_response(const Reply& rep) {
  wire::Response r;
  r.mutable_status()->set_code(static_cast<std::int32_t>(rep.status.code));
  r.mutable_status()->set_message(rep.status.message);
  if (rep.status.ok()) r.set_payload(rep.payload);
  return r.SerializeAsString();
}

Result<Reply> decode_response(std::string_view bytes) {
  wire::Response r;
  if (!r.ParseFromArray(bytes.data(), static_cast<int>(bytes.size())))
    return Error{"ttrpc: malformed Response"};
  Reply rep;
  rep.status.code = static_cast<Code>(r.status().code());
  rep.status.message = r.status().message();
  rep.payload = r.payload();
  return rep;
}

// ---- server ----

namespace {

using Key = std::pair<std::string, std::string>;

struct Conn;

}  // namespace

struct Server::Impl : std::enable_shared_from_this<Server::Impl> {
  explicit Impl(asio::io_context& io) : io(io) {}
  asio::io_context& io;
  std::map<Key, Method, std::less<>> methods;
  std::set<std::string, std::less<>> services;
  std::optional<asio::local::stream_protocol::acceptor> acceptor;
  std::list<std::shared_ptr<Conn>> conns;
  bool closed = false;

  void accept();
  void adopt(Fd fd);
  void dispatch(const std::shared_ptr<Conn>& c, std::uint32_t stream, Call&& call);
};

namespace {

struct Conn : std::enable_shared_from_this<Conn> {
  Conn(asio::io_context& io, int fd, std::weak_ptr<Server::Impl> srv)
      : sock(io, asio::local::stream_protocol(), fd), server(std::move(srv)) {}
  asio::local::stream_protocol::socket sock;
  std::weak_ptr<Server::Impl> server;
  FrameReader reader;
  std::array<char, 64 * 1024> rbuf{};
  std::deque<std::string> outq;
  std::size_t outq_bytes = 0;
  bool writing = false;
  bool reading = false;  // a read is outstanding
  bool open = true;
  std::size_t in_flight = 0;

  // Reading stops while the answers queued for the peer exceed kMaxQueuedBytes (a peer that sends
  // and never reads cannot grow the queue), and resumes as it drains.
  void read() {
    if (reading || !open || outq_bytes > Server::kMaxQueuedBytes) return;
    reading = true;
    auto self = shared_from_this();
    sock.async_read_some(asio::buffer(rbuf), [self](boost::system::error_code ec, std::size_t n) {
      self->reading = false;
      if (ec || !self->open) return self->shutdown();
      self->reader.feed(std::string_view(self->rbuf.data(), n));
      while (self->open) {
        auto f = self->reader.next();
        if (!f) break;
        self->on_frame(std::move(*f));
      }
      if (self->open) self->read();
    });
  }

  void on_frame(Frame f) {
    auto reply_now = [&](Code code, std::string msg) {
      send(f.stream, Reply{Status{code, std::move(msg)}, {}});
    };
    if (f.oversized)
      return reply_now(Code::resource_exhausted,
                       fmt::format("message length {} exceed maximum message size of {}", f.length,
                                   kMaxMessageBytes));
    if (f.type != static_cast<std::uint8_t>(MsgType::request)) return;  // ttrpc: ignored
    wire::Request r;
    if (!r.ParseFromString(f.payload)) return reply_now(Code::invalid_argument, "unmarshal request error");
    if (f.stream % 2 != 1)
      return reply_now(Code::invalid_argument, "StreamID must be odd for client initiated streams");
    // Over the limit: that call is refused, never the connection (containerd multiplexes every
    // client's Wait on its one connection, and a closed one means a dead shim to it).
    if (in_flight >= Server::kMaxInFlight)
      return reply_now(Code::resource_exhausted,
                       fmt::format("more than {} calls in flight on this connection", Server::kMaxInFlight));
    auto srv = server.lock();
    if (!srv) return shutdown();
    Call c;
    c.service = r.service();
    c.method = r.method();
    c.payload = std::move(*r.mutable_payload());
    c.timeout_ns = r.timeout_nano();
    for (const auto& kv : r.metadata()) c.metadata.emplace_back(kv.key(), kv.value());
    srv->dispatch(shared_from_this(), f.stream, std::move(c));
  }

  void send(std::uint32_t stream, const Reply& rep) {
    if (!open) return;
    std::string payload = encode_response(rep);
    if (payload.size() > kMaxMessageBytes)
      payload = encode_response(Reply{Status{Code::resource_exhausted, "response too large"}, {}});
    outq.push_back(encode_frame(stream, MsgType::response, payload));
    outq_bytes += outq.back().size();
    flush();
  }

  void flush() {
    if (writing || outq.empty() || !open) return;
    writing = true;
    auto self = shared_from_this();
    asio::async_write(sock, asio::buffer(outq.front()), [self](boost::system::error_code ec, std::size_t) {
      self->writing = false;
      if (ec) return self->shutdown();
      self->outq_bytes -= self->outq.front().size();
      self->outq.pop_front();
      self->flush();
      self->read();
    });
  }

  void shutdown() {
    if (!open) return;
    open = false;
    boost::system::error_code ec;
    sock.close(ec);
    if (auto srv = server.lock()) srv->conns.remove(shared_from_this());
  }
};

}  // namespace

void Server::Impl::accept() {
  if (!acceptor || closed) return;
  auto self = shared_from_this();
  acceptor->async_accept([self](boost::system::error_code ec, asio::local::stream_protocol::socket s) {
    if (self->closed) return;
    if (!ec) self->adopt(Fd(s.release()));
    // EMFILE and the like: keep accepting; the peer sees its connection closed.
    self->accept();
  });
}

void Server::Impl::adopt(Fd fd) {
  // Asio's accept does not set close-on-exec: a connection inherited by a child would outlive us
  // and containerd would never see the shim's death.
  ::fcntl(fd.get(), F_SETFD, FD_CLOEXEC);
  auto c = std::make_shared<Conn>(io, fd.release(), weak_from_this());
  conns.push_back(c);
  c->read();
}

void Server::Impl::dispatch(const std::shared_ptr<Conn>& c, std::uint32_t stream, Call&& call) {
  auto it = methods.find(Key{call.service, call.method});
  if (it == methods.end()) {
    std::string msg = services.count(call.service) ? fmt::format("method {}", call.method)
                                                   : fmt::format("service {}", call.service);
    c->send(stream, Reply{Status{Code::unimplemented, std::move(msg)}, {}});
    return;
  }
  ++c->in_flight;
  auto answered = std::make_shared<bool>(false);
  std::weak_ptr<Conn> wc = c;
  it->second(std::move(call), [wc, stream, answered](Reply rep) {
    if (*answered) return;
    *answered = true;
    auto conn = wc.lock();
    if (!conn) return;
    --conn->in_flight;
    conn->send(stream, rep);
  });
}

Server::Server(asio::io_context& io) : impl_(std::make_shared<Impl>(io)) {}
Server::~Server() { close(); }

void Server::add(std::string service, std::string method, Method m) {
  impl_->services.insert(service);
  impl_->methods[Key{std::move(service), std::move(method)}] = std::move(m);
}

void Server::serve(Fd listener) {
  impl_->acceptor.emplace(impl_->io, asio::local::stream_protocol(), listener.release());
  impl_->accept();
}

void Server::serve_connection(Fd conn) { impl_->adopt(std::move(conn)); }

std::size_t Server::connections() const { return impl_->conns.size(); }

void Server::stop_accepting() {
  impl_->closed = true;
  if (impl_->acceptor) {
    boost::system::error_code ec;
    impl_->acceptor->close(ec);
  }
}

void Server::close() {
  stop_accepting();
  auto conns = impl_->conns;
  for (auto& c : conns) c->shutdown();
}

// ---- sockets and the client ----

namespace {

Result<sockaddr_un> unix_addr(const std::filesystem::path& path) {
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  const std::string& p = path.native();
  if (p.empty() || p.size() >= sizeof a.sun_path)
    return Error{fmt::format("socket path '{}' is longer than {} bytes", p, sizeof a.sun_path - 1)};
  std::memcpy(a.sun_path, p.data(), p.size());
  return a;
}

}  // namespace

Result<Fd> listen_unix(const std::filesystem::path& path) {
  auto a = unix_addr(path);
  if (!a) return a.error();
  std::error_code ec;
  std::filesystem::create_directories(path.parent_path(), ec);
  ::chmod(path.parent_path().c_str(), 0711);
  ::unlink(path.c_str());
  Fd s(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!s) return Error{fmt::format("socket: {}", std::strerror(errno))};
  // Created 0600 (no window in which another user could connect), as the monitor's socket is.
  mode_t old = ::umask(0177);
  int rc = ::bind(s.get(), reinterpret_cast<const sockaddr*>(&*a), sizeof *a);
  int e = errno;
  ::umask(old);
  if (rc != 0) return Error{fmt::format("bind {}: {}", path.string(), std::strerror(e))};
  if (::listen(s.get(), 64) != 0) return Error{fmt::format("listen {}: {}", path.string(), std::strerror(errno))};
  return s;
}

Result<Reply> call(const std::filesystem::path& path, const Call& c, std::chrono::milliseconds timeout) {
  using clock = std::chrono::steady_clock;
  const auto deadline = clock::now() + timeout;
  auto left_ms = [&] {
    auto l = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - clock::now()).count();
    return static_cast<int>(std::max<long long>(0, l));
  };
  auto a = unix_addr(path);
  if (!a) return a.error();
  Fd s(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  if (!s) return Error{fmt::format("socket: {}", std::strerror(errno))};
  if (::connect(s.get(), reinterpret_cast<const sockaddr*>(&*a), sizeof *a) != 0 && errno != EINPROGRESS)
    return Error{fmt::format("connect {}: {}", path.string(), std::strerror(errno))};
  std::string out = encode_frame(1, MsgType::request, encode_request(c));
  std::size_t sent = 0;
  FrameReader reader;
  char buf[64 * 1024];
  while (true) {
    pollfd p{s.get(), static_cast<short>(POLLIN | (sent < out.size() ? POLLOUT : 0)), 0};
    int ms = left_ms();
    if (ms == 0) return Error{fmt::format("ttrpc {}/{}: no answer from {} within {} ms", c.service, c.method,
                                          path.string(), timeout.count())};
    int r = ::poll(&p, 1, ms);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return Error{fmt::format("poll: {}", std::strerror(errno))};
    if (r == 0) continue;
    if ((p.revents & POLLOUT) && sent < out.size()) {
      ssize_t n = ::send(s.get(), out.data() + sent, out.size() - sent, MSG_NOSIGNAL);
      if (n < 0 && errno != EAGAIN && errno != EINTR)
        return Error{fmt::format("send to {}: {}", path.string(), std::strerror(errno))};
      if (n > 0) sent += static_cast<std::size_t>(n);
    }
    if (p.revents & (POLLIN | POLLHUP | POLLERR)) {
      ssize_t n = ::recv(s.get(), buf, sizeof buf, 0);
      if (n < 0 && (errno == EAGAIN || errno == EINTR)) continue;
      if (n < 0) return Error{fmt::format("recv from {}: {}", path.string(), std::strerror(errno))};
      if (n == 0) return Error{fmt::format("ttrpc {}/{}: {} closed the connection", c.service, c.method, path.string())};
      reader.feed(std::string_view(buf, static_cast<std::size_t>(n)));
      while (auto f = reader.next()) {
        if (f->stream != 1 || f->type != static_cast<std::uint8_t>(MsgType::response)) continue;
        if (f->oversized) return Error{"ttrpc: oversized response"};
        return decode_response(f->payload);
      }
    }
  }
}

}  // namespace nes::ttrpc
