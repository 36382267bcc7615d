#include "host/vm/qmp.hpp"

#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <thread>

#include <fmt/format.h>
#include <simdjson.h>

namespace nes::vm {

namespace {
constexpr std::size_t kMaxReply = 1u << 20;  // bytes: QMP's replies here are a few hundred
using Clock = std::chrono::steady_clock;

int ms_left(Clock::time_point deadline) {
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
  return left < 0 ? 0 : static_cast<int>(left);
}
}  // namespace

host::Result<Qmp> Qmp::connect(const std::filesystem::path& socket, std::chrono::milliseconds within) {
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  if (socket.native().size() >= sizeof a.sun_path)
    return host::Error{fmt::format("qmp: '{}' is longer than sun_path", socket.native())};
  std::memcpy(a.sun_path, socket.c_str(), socket.native().size());
  const auto deadline = Clock::now() + within;
  int last = 0;
  for (;;) {
    // Non-blocking: a connect to a full backlog (QEMU serves one QMP client at a time) fails
    // with EAGAIN instead of waiting unbounded.
    base::Fd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
    if (!fd) return host::errno_error(errno, "qmp: socket");
    if (::connect(fd.get(), reinterpret_cast<sockaddr*>(&a), sizeof a) == 0) {
      Qmp q(std::move(fd));
      auto greeting = q.read_line(deadline + std::chrono::seconds(1));
      if (!greeting) return greeting.error();
      simdjson::dom::parser p;
      simdjson::dom::element e;
      std::uint64_t major = 0, minor = 0, micro = 0;
      if (p.parse(simdjson::padded_string(*greeting)).get(e) ||
          e["QMP"]["version"]["qemu"]["major"].get_uint64().get(major) ||
          e["QMP"]["version"]["qemu"]["minor"].get_uint64().get(minor) ||
          e["QMP"]["version"]["qemu"]["micro"].get_uint64().get(micro))
        return host::Error{fmt::format("qmp: {}: not QMP's greeting", socket.native())};
      q.version_ = fmt::format("{}.{}.{}", major, minor, micro);
      if (auto r = q.execute("qmp_capabilities", "", std::chrono::milliseconds(ms_left(deadline)) + std::chrono::seconds(1)); !r)
        return r.error();
      return q;
    }
    last = errno;
    if ((last != ENOENT && last != ECONNREFUSED && last != EAGAIN) || Clock::now() >= deadline)
      return host::errno_error(last, fmt::format("qmp: connect {}", socket.native()));
    std::this_thread::sleep_for(std::chrono::milliseconds(10));  // QEMU has not made it yet
  }
}

host::Result<std::string> Qmp::read_line(Clock::time_point deadline) {
  for (;;) {
    if (auto nl = buf_.find('\n'); nl != std::string::npos) {
      std::string line = buf_.substr(0, nl);
      buf_.erase(0, nl + 1);
      return line;
    }
    if (buf_.size() > kMaxReply) return host::Error{"qmp: a reply longer than 1 MiB"};
    pollfd p{fd_.get(), POLLIN, 0};
    int n = ::poll(&p, 1, ms_left(deadline));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return host::errno_error(errno, "qmp: poll");
    if (n == 0) return host::Error{"qmp: no reply in time"};
    char chunk[4096];
    ssize_t got = ::read(fd_.get(), chunk, sizeof chunk);
    if (got < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (got < 0) return host::errno_error(errno, "qmp: read");
    if (got == 0) return host::Error{"qmp: QEMU closed the socket"};
    buf_.append(chunk, static_cast<std::size_t>(got));
  }
}

host::Result<std::string> Qmp::execute(std::string_view command, std::string_view arguments_json,
                                       std::chrono::milliseconds within, int pass_fd) {
  const auto deadline = Clock::now() + within;
  const std::uint64_t id = next_id_++;
  std::string req = arguments_json.empty()
                        ? fmt::format(R"({{"execute":"{}","id":{}}})", command, id)
                        : fmt::format(R"({{"execute":"{}","arguments":{},"id":{}}})", command, arguments_json, id);
  req += '\n';
  for (std::size_t off = 0; off < req.size();) {
    ssize_t w;
    if (pass_fd >= 0 && off == 0) {
      // The descriptor rides on the request's first byte(s): QEMU takes it with the command.
      iovec iov{req.data(), req.size()};
      alignas(cmsghdr) char ctl[CMSG_SPACE(sizeof(int))]{};
      msghdr mh{};
      mh.msg_iov = &iov;
      mh.msg_iovlen = 1;
      mh.msg_control = ctl;
      mh.msg_controllen = sizeof ctl;
      cmsghdr* c = CMSG_FIRSTHDR(&mh);
      c->cmsg_level = SOL_SOCKET;
      c->cmsg_type = SCM_RIGHTS;
      c->cmsg_len = CMSG_LEN(sizeof(int));
      std::memcpy(CMSG_DATA(c), &pass_fd, sizeof(int));
      w = ::sendmsg(fd_.get(), &mh, MSG_NOSIGNAL);
    } else {
      w = ::send(fd_.get(), req.data() + off, req.size() - off, MSG_NOSIGNAL);
    }
    if (w < 0 && errno == EINTR) continue;
    if (w < 0 && errno == EAGAIN) {
      pollfd p{fd_.get(), POLLOUT, 0};
      if (::poll(&p, 1, ms_left(deadline)) == 0) return host::Error{fmt::format("qmp: {}: QEMU takes no request", command)};
      continue;
    }
    if (w < 0) return host::errno_error(errno, fmt::format("qmp: {}", command));
    off += static_cast<std::size_t>(w);
  }
  simdjson::dom::parser p;
  for (;;) {
    auto line = read_line(deadline);
    if (!line) return host::Error{fmt::format("{} ({})", line.error().message, command)};
    simdjson::dom::object o;
    if (p.parse(simdjson::padded_string(*line)).get(o)) return host::Error{fmt::format("qmp: {}: a reply that is not JSON", command)};
    if (o["event"].error() == simdjson::SUCCESS) continue;  // asynchronous: not our answer
    if (std::uint64_t got = 0; o["id"].get_uint64().get(got) || got != id) continue;  // an earlier request's
    if (simdjson::dom::element r; !o["return"].get(r)) return std::string(simdjson::minify(r));
    std::string_view cls, desc;
    if (o["error"]["class"].get_string().get(cls)) cls = "?";
    if (o["error"]["desc"].get_string().get(desc)) desc = "(no desc)";
    return host::Error{fmt::format("qmp: {}: {} ({})", command, desc, cls)};
  }
}

}  // namespace nes::vm
