// Shared pieces of the neshost CLI: subcommand table, flag parsing, descriptor loading, serve_vm().
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/signal_set.hpp>
#include <cstdio>
#include <cstdlib>
#include <fmt/format.h>
#include <simdjson.h>

#include "host/cli/cli.hpp"
#include "host/monitor/adopt.hpp"
#include "host/vm/snapshot.hpp"
#include "host/lib/base.hpp"
#include "base/small_file.hpp"
#include "protocol/codec.hpp"
#include "protocol/status.hpp"

namespace nes::cli {

namespace asio = boost::asio;

namespace {
std::vector<Subcommand>& table() {
  static std::vector<Subcommand> t;  // filled before main() by Registrar objects
  return t;
}
}  // namespace

Registrar::Registrar(Subcommand s) { table().push_back(s); }

std::vector<Subcommand> subcommands() {
  auto t = table();
  std::sort(t.begin(), t.end(), [](auto& a, auto& b) { return a.name < b.name; });
  return t;
}

int usage_error(std::string_view cmd, std::string_view message) {
  fmt::print(stderr, "neshost {}: {}\nTry 'neshost {} --help'.\n", cmd, message, cmd);
  return kExitUsage;
}

host::Result<proto::Boot> load_descriptor(const std::filesystem::path& file) {
  // The user names this file: a symlink to it is as good as the file.
  auto read = base::read_small_file(file.c_str(), proto::kDefaultLineCap, {.follow_symlink = true});
  if (!read) return host::Error{"--descriptor: " + read.error().message};
  std::string text = std::move(*read);
  // A descriptor file may be pretty-printed: one JSON value, newlines are just whitespace.
  std::replace(text.begin(), text.end(), '\n', ' ');
  // A descriptor file may leave out `"type":"boot"`: decided by parsing it (a top-level object
  // without a `type` key, escapes resolved), never by looking for the text `"type"` anywhere.
  bool has_type = true;
  {
    simdjson::dom::parser parser;
    simdjson::padded_string padded(text);
    simdjson::dom::object obj;
    if (!parser.parse(padded).get(obj)) {
      has_type = false;
      for (auto field : obj)
        if (field.key == "type") has_type = true;
    }
  }
  if (!has_type) text.insert(text.find('{') + 1, "\"type\":\"boot\",");
  auto decoded = proto::decode_host(text);
  if (auto* e = std::get_if<proto::DecodeError>(&decoded))
    return host::Error{fmt::format("--descriptor: {}: {}", file.string(), e->reason)};
  if (auto* u = std::get_if<proto::UnknownMessage>(&decoded))
    return host::Error{fmt::format("--descriptor: {}: type '{}' is not boot", file.string(), u->type)};
  auto& m = std::get<proto::HostMessage>(decoded);
  if (!std::holds_alternative<proto::Boot>(m))
    return host::Error{fmt::format("--descriptor: {}: expected a boot message", file.string())};
  return std::get<proto::Boot>(m);
}

int serve_vm(const ServeConfig& cfg, ServeEmbedder emb) {
  asio::io_context own_io;
  asio::io_context& io = emb.io ? *emb.io : own_io;
  const std::string vm = cfg.session.vm;
  host::Host* hostp = nullptr;
  bool exit_posted = false;

  host::HostOptions hopt;
  hopt.state_dir = cfg.state_dir;
  hopt.hooks = emb.hooks;
  hopt.stdio = emb.stdio;
  hopt.workload_log = emb.workload_log;
  // Test-only fault injection (tests/host/survive_test.py): NESHOST_TEST_RECORD_STOP=STEP stops
  // this whole process (SIGSTOP) when an outcome record's write reaches STEP (host/lib/record.hpp
  // WriteStep: temp_written, temp_fsynced, renamed, dir_fsynced): a host stalled there, past the
  // guest's ack timeout, that the test then SIGKILLs. Unset (always, outside tests): no hook.
  if (const char* st = std::getenv("NESHOST_TEST_RECORD_STOP"); st && *st) {
    if (auto step = host::write_step_from_string(st))
      hopt.write.at_step = [s = *step](host::WriteStep w) {
        if (w == s) ::raise(SIGSTOP);
        return 0;
      };
  }
  if (!hopt.hooks.destroy && emb.channel_is_vm) {
    // No VMM to destroy: the guest's channel was the VM.
    hopt.hooks.destroy = [&](const std::string& id, std::uint64_t) {
      asio::post(io, [&, id] { if (hostp) (void)hostp->vm_exited(id); });
    };
  }
  hopt.on_event = [&](const host::Event& ev) {
    if (emb.print_events) {
      // fputs, not fmt::print: a closed stdout (`serve | head -1`) must not throw mid-session;
      // the outcome is still recorded and the exit status still returned.
      std::fputs(fmt::format("{} {}{}{}\n", ev.vm.empty() ? "-" : ev.vm, ev.kind,
                             ev.detail.empty() ? "" : " ", ev.detail)
                     .c_str(),
                 stdout);
      std::fflush(stdout);
    }
    if (!hostp) return;
    if (emb.on_event) emb.on_event(*hostp, ev);
    if (ev.milestone == host::act::Milestone::finished) io.stop();
    if (emb.channel_is_vm && !exit_posted) {
      auto* s = hostp->session(vm);
      if (s && s->outcome() && !s->stream_open() && !s->awaiting_redial()) {
        exit_posted = true;
        asio::post(io, [&] { (void)hostp->vm_exited(vm); });
      }
    }
  };
  host::Host host(io, hopt);
  hostp = &host;
  if (emb.on_host) emb.on_host(host);

  if (auto s = host.add_vm(cfg.session); !s) {
    fmt::print(stderr, "neshost: {}\n", s.error().message);
    return proto::kStatusHostFailure;
  }
  host::Status up = host::Ok{};
  switch (cfg.listen.kind) {
    case host::ListenSpec::Kind::unix_path: {
      host::UnixListenOptions u;
      u.path = cfg.listen.path;
      up = host.listen_unix(vm, u);
      break;
    }
    case host::ListenSpec::Kind::fd:
      up = host.attach_stream(vm, host::Fd{cfg.listen.fd});
      break;
    case host::ListenSpec::Kind::vsock:
      if (!cfg.cid) {
        fmt::print(stderr, "neshost: vsock:PORT needs --cid (the guest's CID names the VM)\n");
        return kExitUsage;
      }
      up = host.map_cid(*cfg.cid, vm);
      if (up) up = host.listen_vsock(cfg.listen.port);
      break;
  }
  if (!up) {
    fmt::print(stderr, "neshost: {}\n", up.error().message);
    return proto::kStatusHostFailure;
  }

  asio::signal_set signals(io, SIGINT, SIGTERM);
  int signals_seen = 0;
  std::function<void()> arm_signals = [&] {
    signals.async_wait([&](boost::system::error_code ec, int sig) {
      if (ec) return;
      // The first signal is an ordered shutdown. A later one that finds the outcome in and its
      // output still owed ends the wait for that output (counted, never silent) instead of
      // giving up at once; any other gives up.
      if (++signals_seen == 1 || host.output_owed(vm)) {
        if (emb.print_events) {
          fmt::print("{} signal {}: shutting down\n", vm, sig);
          std::fflush(stdout);
        }
        if (emb.before_shutdown) emb.before_shutdown();
        (void)host.shutdown(vm);
        arm_signals();
      } else {
        if (emb.print_events) {
          fmt::print("{} signal {}: giving up\n", vm, sig);
          std::fflush(stdout);
        }
        io.stop();
      }
    });
  };
  arm_signals();

  if (emb.on_listening) emb.on_listening(host, vm);
  else (void)host.vm_started(vm);

  io.run();
  auto* sess = host.session(vm);
  if (!sess || !sess->durable() || !sess->outcome()) {
    fmt::print(stderr, "neshost: no durable outcome for {}\n", vm);
    return proto::kStatusHostFailure;
  }
  // Output lost or truncated overrides the workload's status (host::reported_status).
  return host::reported_status(*sess->outcome());
}

void adopt_orphan(std::string_view cmd, const std::filesystem::path& state, std::string_view vm) {
  if (!host::check_vm_id(vm)) return;
  std::string said;
  auto r = ensure_monitor(state, vm, self_program(), std::chrono::seconds(15), &said);
  if (!r) said = r.error().message;
  if (!said.empty()) fmt::print(stderr, "neshost {}: {}\n", cmd, said);
}

// ---- the state dir of `neshost run` ----

std::filesystem::path snapshot_path(const std::filesystem::path& state_dir, std::string_view name) {
  return state_dir / vm::kSnapshotsDir / std::string(name);
}

std::filesystem::path default_state_dir() {
  namespace fs = std::filesystem;
  if (const char* s = std::getenv("NESHOST_STATE"); s && *s) return s;
  if (::geteuid() == 0) return "/var/lib/neshost";
  if (const char* x = std::getenv("XDG_STATE_HOME"); x && *x) return fs::path(x) / "neshost";
  const char* home = std::getenv("HOME");
  return fs::path(home && *home ? home : "/tmp") / ".local/state/neshost";
}

}  // namespace nes::cli
