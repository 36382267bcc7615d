#include "host/lib/testing.hpp"

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <time.h>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/local/stream_protocol.hpp>
#include <cerrno>
#include <cstring>

#include "protocol/codec.hpp"

namespace nes::host::testing {

namespace asio = boost::asio;

Result<std::pair<Fd, Fd>> stream_pair() {
  int sv[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0)
    return Error{std::string("socketpair: ") + std::strerror(errno)};
  return std::pair<Fd, Fd>{Fd(sv[0]), Fd(sv[1])};
}

std::string ready_line(std::uint32_t v) {
  return proto::encode_line(proto::GuestMessage{proto::Ready{v, std::nullopt, proto::all_features()}});
}
std::string mounted_line() { return proto::encode_line(proto::GuestMessage{proto::Mounted{}}); }
std::string started_line(int pid) { return proto::encode_line(proto::GuestMessage{proto::Started{pid}}); }
std::string exited_line(int code) {
  return proto::encode_line(proto::GuestMessage{proto::WorkloadExited::code(static_cast<std::uint8_t>(code))});
}
std::string signalled_line(int sig) {
  return proto::encode_line(proto::GuestMessage{proto::WorkloadExited::killed(static_cast<std::uint8_t>(sig))});
}
std::string host_type(std::string_view line) {
  auto d = proto::decode_host(line);
  if (auto* m = std::get_if<proto::HostMessage>(&d)) return std::string(proto::type_name(*m));
  return "";
}

namespace {
std::vector<Step> booted_then(std::string last) {
  return {step::Send{ready_line()}, step::Expect{"boot"}, step::Send{mounted_line() + started_line()},
          step::Send{std::move(last)}, step::WaitClose{}};
}
}  // namespace

std::vector<Step> exits_with(int code) { return booted_then(exited_line(code)); }
std::vector<Step> killed_by(int signal) { return booted_then(signalled_line(signal)); }
std::vector<Step> silent_after_boot() { return {step::Send{ready_line()}, step::Expect{"boot"}, step::WaitClose{}}; }
std::vector<Step> silent() { return {step::WaitClose{}}; }
std::vector<Step> hostile(std::string bytes) { return {step::Send{std::move(bytes)}, step::WaitClose{}}; }

asio::awaitable<void> guest_at(std::string path, std::vector<Step> script, std::shared_ptr<GuestLog> log) {
  asio::local::stream_protocol::socket sock(co_await asio::this_coro::executor);
  boost::system::error_code ec;
  co_await sock.async_connect(asio::local::stream_protocol::endpoint(path),
                              asio::redirect_error(asio::use_awaitable, ec));
  if (ec) {
    log->error = "connect: " + ec.message();
    log->done = true;
    co_return;
  }
  co_await run_script(std::move(sock), std::move(script), log);
}

std::shared_ptr<GuestLog> spawn_guest(asio::io_context& io, Fd stream, std::vector<Step> script) {
  auto log = std::make_shared<GuestLog>();
  asio::local::stream_protocol::socket sock(io);
  boost::system::error_code ec;
  sock.assign(asio::local::stream_protocol(), stream.get(), ec);
  if (ec) {
    log->error = "assign: " + ec.message();
    log->done = true;
    return log;
  }
  stream.release();
  asio::co_spawn(io, run_script(std::move(sock), std::move(script), log), asio::detached);
  return log;
}

std::shared_ptr<GuestLog> spawn_guest_at(asio::io_context& io, std::string path, std::vector<Step> script) {
  auto log = std::make_shared<GuestLog>();
  asio::co_spawn(io, guest_at(std::move(path), std::move(script), log), asio::detached);
  return log;
}

// ---- ScriptedHost ------------------------------------------------------------------------------

ScriptedHost::ScriptedHost(Fd channel) { attach(std::move(channel)); }

void ScriptedHost::attach(Fd channel) {
  if (channel) ::fcntl(channel.get(), F_SETFL, ::fcntl(channel.get(), F_GETFL) | O_NONBLOCK);
  chan_ = std::move(channel);
  eof_ = false;
}

std::uint64_t ScriptedHost::now_ms() {
  timespec ts{};
  ::clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<std::uint64_t>(ts.tv_sec) * 1000u + static_cast<std::uint64_t>(ts.tv_nsec) / 1000000u;
}

std::string ScriptedHost::describe(const proto::GuestMessage& m) { return proto::encode(m); }

void ScriptedHost::read_channel() {
  char buf[65536];
  while (chan_ && !eof_) {
    ssize_t k = ::read(chan_.get(), buf, sizeof buf);
    if (k > 0) {
      std::string_view got(buf, static_cast<std::size_t>(k));
      on_bytes(got);
      reader_.feed(got);
      continue;
    }
    if (k < 0 && errno == EINTR) continue;
    if (k == 0 || (k < 0 && errno != EAGAIN && errno != EWOULDBLOCK)) eof_ = true;
    break;
  }
}

bool ScriptedHost::pump(int timeout_ms) {
  int fd = channel_fd();
  if (fd < 0) return false;
  pollfd p{fd, POLLIN, 0};
  if (::poll(&p, 1, timeout_ms) <= 0) return false;
  read_channel();
  return true;
}

std::optional<proto::GuestMessage> ScriptedHost::next(int timeout_ms) {
  const std::uint64_t until = now_ms() + static_cast<std::uint64_t>(timeout_ms);
  for (;;) {
    if (auto l = reader_.next()) {
      if (l->kind != proto::Line::Kind::text) {
        last_error_ = "over-long line from the guest";
        return std::nullopt;
      }
      auto d = proto::decode_guest(l->text);
      if (auto* m = std::get_if<proto::GuestMessage>(&d)) return *m;
      last_error_ = "undecodable guest line: " + l->text;
      return std::nullopt;
    }
    if (eof_) {
      last_error_ = "EOF";
      return std::nullopt;
    }
    std::uint64_t now = now_ms();
    if (now >= until) {
      last_error_ = "timeout";
      return std::nullopt;
    }
    pump(static_cast<int>(until - now));
  }
}

bool ScriptedHost::open(const proto::Boot& boot, int timeout_ms) {
  auto fail = [&](const char* step) {
    last_error_ = std::string(step) + ": " + last_error_;
    return false;
  };
  auto r = expect<proto::Ready>(timeout_ms);
  if (!r) return fail("ready");
  if (r->protocol_version != proto::kProtocolVersion) {
    last_error_ = "protocol_version " + std::to_string(r->protocol_version);
    return fail("ready");
  }
  if (!send(boot)) return fail("boot");
  if (!expect<proto::Mounted>(timeout_ms)) return fail("mounted");
  if (!expect<proto::Started>(timeout_ms)) return fail("started");
  return true;
}

bool ScriptedHost::send(const proto::HostMessage& m) {
  on_send(m);
  return send_raw(proto::encode_line(m));
}

bool ScriptedHost::send_raw(std::string_view rest, int timeout_ms) {
  const std::uint64_t until = now_ms() + static_cast<std::uint64_t>(timeout_ms);
  while (chan_ && !rest.empty()) {
    ssize_t k = ::send(chan_.get(), rest.data(), rest.size(), MSG_NOSIGNAL);
    if (k > 0) { rest.remove_prefix(static_cast<std::size_t>(k)); continue; }
    if (k < 0 && errno == EINTR) continue;
    if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      std::uint64_t now = now_ms();
      if (now >= until) break;
      pollfd p{chan_.get(), POLLOUT, 0};
      ::poll(&p, 1, static_cast<int>(until - now));
      continue;
    }
    last_error_ = std::string("send: ") + std::strerror(errno);
    break;
  }
  if (!rest.empty() && last_error_.rfind("send: ", 0) != 0) last_error_ = chan_ ? "send: timeout" : "send: no channel";
  return rest.empty();
}

void ScriptedHost::close() {
  chan_.reset();
  eof_ = true;
}

bool ScriptedHost::wait_eof(int timeout_ms) {
  const std::uint64_t until = now_ms() + static_cast<std::uint64_t>(timeout_ms);
  while (!eof_) {
    std::uint64_t now = now_ms();
    if (now >= until || !chan_) return eof_;
    pump(static_cast<int>(until - now));
  }
  return true;
}

}  // namespace nes::host::testing
