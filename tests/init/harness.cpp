#include "harness.hpp"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <stdexcept>

namespace nes::init::test {

namespace {
void close_fd(int& fd) {
  if (fd >= 0) ::close(fd);
  fd = -1;
}
}  // namespace

std::string init_bin() {
  const char* b = std::getenv("NESINIT_BIN");
  if (!b || !*b) throw std::runtime_error("NESINIT_BIN is not set");
  return b;
}

Sandbox::Sandbox(SandboxOptions o) : hold_receipt_(o.hold_receipt) {
  char tmpl[] = "/tmp/nesinit-e2e-XXXXXX";
  if (!::mkdtemp(tmpl)) throw std::runtime_error("mkdtemp failed");
  dir_ = tmpl;
  sock_path_ = (dir_ / "host.sock").string();
  if (o.listen) {
    listen_fd_ = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_un a{};
    a.sun_family = AF_UNIX;
    std::strncpy(a.sun_path, sock_path_.c_str(), sizeof a.sun_path - 1);
    if (::bind(listen_fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 ||
        ::listen(listen_fd_, o.full_backlog ? 0 : 1) != 0)
      throw std::runtime_error("listen failed");
    if (o.full_backlog) {
      // Backlog 0 holds one pending connection: ours. The init's connect then finds it full.
      filler_ = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
      if (::connect(filler_, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0)
        throw std::runtime_error("filler connect failed");
    }
  }
  if (o.data) {
    const std::string data_path = (dir_ / "data.sock").string();
    data_listen_ = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_un a{};
    a.sun_family = AF_UNIX;
    std::strncpy(a.sun_path, data_path.c_str(), sizeof a.sun_path - 1);
    if (::bind(data_listen_, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 || ::listen(data_listen_, 1) != 0)
      throw std::runtime_error("data listen failed");
    o.init_args.insert(o.init_args.begin(), "--data-channel=unix:" + data_path);
    data_dec_ = proto::FrameDecoder(o.data_rules);
  }
  std::vector<std::string> args = {"unshare", "--pid", "--fork", "--mount-proc", "--kill-child"};
  for (auto& a : o.unshare_args) args.push_back(a);
  for (auto& a : o.wrapper) args.push_back(a);
  args.push_back(init_bin());
  args.push_back("--channel=unix:" + sock_path_);
  args.push_back("--log=" + o.log);
  for (auto& a : o.init_args) args.push_back(a);

  int op[2], ep[2];
  if (::pipe2(op, O_CLOEXEC) != 0 || ::pipe2(ep, O_CLOEXEC) != 0) throw std::runtime_error("pipe failed");
  if (o.stderr_unread) {
    // One page, filled by us: the init's first log line finds no room.
    int sz = ::fcntl(ep[1], F_SETPIPE_SZ, 4096);
    if (sz < 0) throw std::runtime_error("F_SETPIPE_SZ failed");
    std::string fill(static_cast<std::size_t>(sz), '.');
    ::fcntl(ep[1], F_SETFL, O_NONBLOCK);
    if (::write(ep[1], fill.data(), fill.size()) != static_cast<ssize_t>(fill.size()))
      throw std::runtime_error("filling the stderr pipe failed");
    ::fcntl(ep[1], F_SETFL, 0);
    err_paused_ = true;
  }
  pid_ = ::fork();
  if (pid_ < 0) throw std::runtime_error("fork failed");
  if (pid_ == 0) {
    ::dup2(op[1], 1);
    ::dup2(ep[1], 2);
    int devnull = ::open("/dev/null", O_RDONLY);
    ::dup2(devnull, 0);
    sigset_t none;
    sigemptyset(&none);
    ::sigprocmask(SIG_SETMASK, &none, nullptr);
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    ::execvp("unshare", argv.data());
    ::_exit(127);
  }
  ::close(op[1]);
  ::close(ep[1]);
  out_fd_ = op[0];
  err_fd_ = ep[0];
  ::fcntl(out_fd_, F_SETFL, O_NONBLOCK);
  ::fcntl(err_fd_, F_SETFL, O_NONBLOCK);
  pidfd_ = static_cast<int>(::syscall(SYS_pidfd_open, pid_, 0));
  if (pidfd_ < 0) throw std::runtime_error("pidfd_open failed");
}

Sandbox::~Sandbox() {
  if (!status_ && pid_ > 0) {
    // --kill-child: unshare's death takes the namespace's init (and so the namespace) with it.
    ::kill(pid_, SIGKILL);
    int st;
    while (::waitpid(pid_, &st, 0) < 0 && errno == EINTR) {
    }
  }
  close_fd(listen_fd_);
  close_fd(out_fd_);
  close_fd(err_fd_);
  close_fd(pidfd_);
  close_fd(filler_);
  close_fd(data_fd_);
  close_fd(data_listen_);
  std::error_code ec;
  std::filesystem::remove_all(dir_, ec);
}

std::uint64_t Sandbox::clock_ms() { return now_ms(); }

std::size_t Sandbox::when(std::string_view what) const {
  auto it = std::find(timeline_.begin(), timeline_.end(), what);
  return it == timeline_.end() ? std::string::npos : timeline_round_[static_cast<std::size_t>(it - timeline_.begin())];
}

void Sandbox::on_send(const proto::HostMessage& m) {
  if (auto* b = std::get_if<proto::Boot>(&m)) terminal_ = b->stdio && b->stdio->terminal;
  // A process started by exec: its frames are legal from now on, as a host's decoder must know.
  if (auto* x = std::get_if<proto::ExecProcess>(&m); x && x->stdio)
    data_dec_.open_process(x->proc, proto::FrameRules{proto::FrameSender::guest, x->stdio->terminal.has_value(), false,
                                                      x->stdio->mode == proto::StdioMode::lossy});
}

void Sandbox::on_bytes(std::string_view bytes) {
  timeline_reader_.feed(bytes);
  while (auto l = timeline_reader_.next()) {
    auto d = proto::decode_guest(l->text);
    auto* m = std::get_if<proto::GuestMessage>(&d);
    timeline_.push_back(m ? "msg:" + std::string(proto::type_name(*m)) : "msg:?");
  }
}

bool Sandbox::pump(int timeout_ms) {
  pollfd p[7];
  int n = 0;
  int idx_listen = -1, idx_chan = -1, idx_out = -1, idx_err = -1, idx_pid = -1, idx_dl = -1, idx_data = -1;
  if (data_listen_ >= 0 && data_fd_ < 0 && !data_closed_) { idx_dl = n; p[n++] = {data_listen_, POLLIN, 0}; }
  if (data_fd_ >= 0) {
    short ev = static_cast<short>((data_paused_ ? 0 : POLLIN) | (data_tx_.empty() ? 0 : POLLOUT));
    if (ev) { idx_data = n; p[n++] = {data_fd_, ev, 0}; }
  }
  if (listen_fd_ >= 0 && !attached() && filler_ < 0) { idx_listen = n; p[n++] = {listen_fd_, POLLIN, 0}; }
  if (channel_fd() >= 0) { idx_chan = n; p[n++] = {channel_fd(), POLLIN, 0}; }
  if (out_fd_ >= 0) { idx_out = n; p[n++] = {out_fd_, POLLIN, 0}; }
  if (err_fd_ >= 0 && !err_paused_) { idx_err = n; p[n++] = {err_fd_, POLLIN, 0}; }
  if (!status_) { idx_pid = n; p[n++] = {pidfd_, POLLIN, 0}; }
  int r = ::poll(p, static_cast<nfds_t>(n), timeout_ms);
  if (r <= 0) return false;
  ++round_;
  struct RoundStamp {  // stamps what this round added to the timeline with its round
    Sandbox& sb;
    ~RoundStamp() { sb.timeline_round_.resize(sb.timeline_.size(), sb.round_); }
  } stamp{*this};
  char buf[65536];
  auto drain = [&](int& fd, std::string& into) {
    for (;;) {
      ssize_t k = ::read(fd, buf, sizeof buf);
      if (k > 0) { into.append(buf, static_cast<std::size_t>(k)); continue; }
      if (k < 0 && errno == EINTR) continue;
      if (k == 0) close_fd(fd);
      break;
    }
  };
  if (idx_out >= 0 && p[idx_out].revents) drain(out_fd_, out_);
  if (idx_err >= 0 && p[idx_err].revents) drain(err_fd_, err_);
  if (idx_listen >= 0 && (p[idx_listen].revents & POLLIN)) {
    int c = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (c >= 0) attach(host::Fd(c));
  }
  if (idx_dl >= 0 && (p[idx_dl].revents & POLLIN)) {
    data_fd_ = ::accept4(data_listen_, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
  }
  if (idx_data >= 0 && (p[idx_data].revents & POLLOUT)) {
    ssize_t k = ::send(data_fd_, data_tx_.data(), data_tx_.size(), MSG_NOSIGNAL);
    if (k > 0) data_tx_.erase(0, static_cast<std::size_t>(k));
    else if (k < 0 && errno != EAGAIN && errno != EINTR) data_tx_.clear();  // the guest closed it
  }
  if (idx_data >= 0 && (p[idx_data].revents & (POLLIN | POLLHUP | POLLERR)) && !data_paused_) {
    for (int round = 0; round < 64; ++round) {  // bounded, so the other fds get their turn
      ssize_t k = ::read(data_fd_, buf, sizeof buf);
      if (k < 0 && errno == EINTR) continue;
      if (k < 0 && errno == EAGAIN) break;
      if (k <= 0) {
        close_fd(data_fd_);
        data_closed_ = true;
        timeline_.push_back("data:closed");
        break;
      }
      std::string_view in(buf, static_cast<std::size_t>(k));
      while (auto f = data_dec_.next(in)) {
        const auto si = static_cast<std::size_t>(f->stream);
        if (f->proc != 0) {
          if (f->kind == proto::FrameKind::data) proc_data_[f->proc][si] += f->data;
          if (f->kind == proto::FrameKind::eof)
            timeline_.push_back("data:" + std::to_string(f->proc) + ":" + std::string(proto::to_string(f->stream)) + ":eof");
          continue;
        }
        switch (f->kind) {
          case proto::FrameKind::data: data_[si] += f->data; break;
          case proto::FrameKind::eof:
            timeline_.push_back("data:" + std::string(proto::to_string(f->stream)) + ":eof");
            break;
          case proto::FrameKind::dropped:
            dropped_ += f->dropped;
            timeline_.push_back("data:dropped");
            break;
          case proto::FrameKind::resize: break;
        }
      }
      if (data_dec_.failed()) {
        close_fd(data_fd_);
        data_closed_ = true;
        timeline_.push_back("data:error");
        break;
      }
      // As a host must (docs/protocol.md "Data channel"): every output stream at EOF, close.
      if (!hold_receipt_ && data_dec_.at_eof(proto::Stream::out) && (data_dec_.at_eof(proto::Stream::err) || terminal_)) {
        close_fd(data_fd_);
        data_closed_ = true;
        timeline_.push_back("data:closed");
        break;
      }
    }
  }
  if (idx_chan >= 0 && p[idx_chan].revents) read_channel();
  if (idx_pid >= 0 && (p[idx_pid].revents & POLLIN)) {
    int st = 0;
    if (::waitpid(pid_, &st, WNOHANG) == pid_) status_ = st;
  }
  return true;
}

bool Sandbox::accept(int timeout_ms) {
  const std::uint64_t until = now_ms() + static_cast<std::uint64_t>(timeout_ms);
  while (!attached()) {
    std::uint64_t now = now_ms();
    if (now >= until || status_) {
      last_error_ = status_ ? "the init exited" : "timeout";
      return attached();
    }
    pump(static_cast<int>(until - now));
  }
  return true;
}

bool Sandbox::wait_stdout(std::string_view needle, int timeout_ms) {
  const std::uint64_t until = now_ms() + static_cast<std::uint64_t>(timeout_ms);
  while (out_.find(needle) == std::string::npos) {
    std::uint64_t now = now_ms();
    if (now >= until || (out_fd_ < 0)) return out_.find(needle) != std::string::npos;
    pump(static_cast<int>(until - now));
  }
  return true;
}

bool Sandbox::wait_stderr(std::string_view needle, int timeout_ms) {
  const std::uint64_t until = now_ms() + static_cast<std::uint64_t>(timeout_ms);
  while (err_.find(needle) == std::string::npos) {
    std::uint64_t now = now_ms();
    if (now >= until || err_fd_ < 0 || err_paused_) return err_.find(needle) != std::string::npos;
    pump(static_cast<int>(until - now));
  }
  return true;
}

bool Sandbox::signal_init(int sig) {
  if (status_ || pid_ <= 0) return false;
  std::string path = "/proc/" + std::to_string(pid_) + "/task/" + std::to_string(pid_) + "/children";
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  char buf[64] = {};
  ssize_t n = ::read(fd, buf, sizeof buf - 1);
  ::close(fd);
  if (n <= 0) return false;
  pid_t child = static_cast<pid_t>(std::strtol(buf, nullptr, 10));
  return child > 0 && ::kill(child, sig) == 0;
}

void Sandbox::read_stderr() {
  if (!err_paused_) return;
  err_paused_ = false;
  // Discard the page we wrote ourselves; what follows is the init's.
  std::size_t skip = 4096;
  char buf[4096];
  while (skip > 0) {
    pollfd p{err_fd_, POLLIN, 0};
    if (::poll(&p, 1, 10000) <= 0) break;
    ssize_t k = ::read(err_fd_, buf, std::min(skip, sizeof buf));
    if (k <= 0) break;
    skip -= static_cast<std::size_t>(k);
  }
}

std::optional<int> Sandbox::wait_exit(int timeout_ms) {
  const std::uint64_t until = now_ms() + static_cast<std::uint64_t>(timeout_ms);
  // Until the process is gone and its output is drained.
  while (!status_ || out_fd_ >= 0 || (err_fd_ >= 0 && !err_paused_)) {
    std::uint64_t now = now_ms();
    if (now >= until) break;
    if (!pump(static_cast<int>(until - now)) && status_) break;
  }
  return status_;
}

proto::Boot make_boot(std::vector<std::string> argv, bool terminal) {
  proto::Boot b;
  b.exec.argv = std::move(argv);
  b.geometry = {1280, 720, 30, false};
  b.on_exit.terminal = terminal;
  return b;
}

bool in_order(const std::string& hay, const std::vector<std::string>& needles, std::string* missing) {
  std::size_t pos = 0;
  for (auto& n : needles) {
    auto f = hay.find(n, pos);
    if (f == std::string::npos) {
      if (missing) *missing = n;
      return false;
    }
    pos = f + n.size();
  }
  return true;
}

}  // namespace nes::init::test
