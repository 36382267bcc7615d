// `neshost serve`: serve one VM on one endpoint, print one line per event, exit with the
// outcome's exit status.
#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <memory>

#include <fmt/format.h>

#include "host/cli/cli.hpp"
#include "host/monitor/reconcile.hpp"
#include "protocol/status.hpp"

namespace nes::cli {
namespace {

constexpr std::string_view kHelp = R"(usage: neshost serve --listen unix:PATH|vsock:PORT|fd:N --descriptor FILE --state DIR
                     [--vm ID] [--generation N] [--on-exit stop|keep|remove] [--timeout S]
                     [--ready-timeout S] [--stop-timeout S] [--cid CID]
                     [--reconnect S] [--resume] [--data-listen unix:PATH]
                     [--stdin FILE] [--log-max-size BYTES]

Serve one VM: wait for the guest's `ready`, send the boot descriptor, record the outcome durably
in DIR/ID/outcome.json, acknowledge it with `shutdown`, apply --on-exit. Prints one line per
event ("VM EVENT DETAIL") and exits with the outcome's exit status: the workload's code, 128+N if
killed by signal N, 127/126 if it could not start, 124 on --timeout, 125 for host-side failures.

  --listen unix:PATH   listen on a Unix socket (mode 0600, parent 0700; a live one is refused)
           vsock:PORT  listen on AF_VSOCK VMADDR_CID_ANY:PORT (needs --cid)
           fd:N        an already-connected stream inherited as fd N
  --descriptor FILE    boot descriptor JSON (docs/protocol.md `boot`; "type" may be omitted)
  --state DIR          state directory for outcome records
  --vm ID              VM id, [A-Za-z0-9._-], default vm0
  --generation N       generation of this VM (default 1); an older one never overwrites a newer
  --on-exit POLICY     stop (default), keep (VM stays up until SIGTERM), remove
  --timeout S          host's wall limit in seconds: outcome `timeout` (124)
  --ready-timeout S    seconds from start to the guest's `ready` (default 30)
  --stop-timeout S     seconds from `shutdown` to the VM's exit before destroy (default 10)
  --cid CID            vsock: the guest CID that names this VM
  --data-listen unix:PATH
                       the data channel (a descriptor with `stdio`): the workload's output is
                       written to DIR/ID/workload.log (`neshost logs`), stdin gets its EOF
  --stdin FILE         the workload's stdin (a descriptor with stdio.stdin true): FILE's bytes,
                       then its EOF; a --resume host goes on from the byte the guest names
  --log-max-size BYTES workload.log's size before it is rotated (default 10 MiB; 5 files kept)
  --reconnect S        channel survival: after boot, the guest redials a lost channel for up to
                       S seconds without touching the workload (boot.reconnect_ms); a host
                       started with --resume on the same state dir then takes over
  --resume             take over --generation N of --vm (default: the newest generation in DIR),
                       booted by an earlier host process that is gone: send no boot, accept
                       only the guest's resumed `ready`, record its outcome once (an earlier
                       record of N wins) and acknowledge it; --descriptor is optional,
                       --ready-timeout bounds the wait
SIGINT/SIGTERM: ask the guest to shut down; a second one gives up.
)";

constexpr FlagSpec kFlags[] = {{"listen"},        {"descriptor"},    {"state"},
                               {"vm"},            {"generation"},    {"on-exit"},
                               {"timeout"},       {"ready-timeout"}, {"stop-timeout"},
                               {"cid"},           {"reconnect"},     {"resume", false},
                               {"data-listen"},   {"stdin"},         {"log-max-size"}};

int serve_main(const Args& args) {
  auto p = parse_flags(kFlags, args);
  if (!p) return usage_error("serve", p.error().message);
  if (p->help) {
    fmt::print("{}", kHelp);
    return 0;
  }
  if (!p->positional.empty())
    return usage_error("serve", fmt::format("unexpected argument '{}'", p->positional.front()));
  const bool resume = p->has("resume");
  for (auto req : {"listen", "state"})
    if (!p->has(req)) return usage_error("serve", fmt::format("--{} is required", req));

  ServeConfig cfg;
  auto listen = host::parse_listen_spec(*p->get("listen"));
  if (!listen) return usage_error("serve", listen.error().message);
  cfg.listen = *listen;
  cfg.state_dir = *p->get("state");
  if (cfg.state_dir.empty()) return usage_error("serve", "--state: empty path");
  cfg.session.vm = p->get("vm").value_or("vm0");
  if (auto id = host::check_vm_id(cfg.session.vm); !id) return usage_error("serve", "--vm: " + id.error().message);
  if (auto g = p->get("generation")) {
    auto n = parse_uint("generation", *g, 0, UINT64_MAX);
    if (!n) return usage_error("serve", n.error().message);
    cfg.session.generation = *n;
  }
  if (auto o = p->get("on-exit")) {
    auto pol = host::on_exit_from_string(*o);
    if (!pol) return usage_error("serve", fmt::format("--on-exit: expected stop, keep or remove, got '{}'", *o));
    cfg.session.on_exit = *pol;
  }
  for (auto [flag, dst] : {std::pair{"ready-timeout", &cfg.session.ready_timeout},
                           std::pair{"stop-timeout", &cfg.session.stop_timeout}}) {
    if (auto v = p->get(flag)) {
      auto ms = parse_seconds(flag, *v);
      if (!ms) return usage_error("serve", ms.error().message);
      *dst = *ms;
    }
  }
  if (auto v = p->get("timeout")) {
    auto ms = parse_seconds("timeout", *v);
    if (!ms) return usage_error("serve", ms.error().message);
    cfg.session.wall_timeout = *ms;
  }
  if (auto v = p->get("cid")) {
    auto c = parse_uint("cid", *v, 3, 0xFFFFFFFEu);
    if (!c) return usage_error("serve", c.error().message);
    cfg.cid = static_cast<std::uint32_t>(*c);
  }
  if (cfg.listen.kind == host::ListenSpec::Kind::vsock && !cfg.cid)
    return usage_error("serve", "--listen vsock:PORT needs --cid");
  if (auto v = p->get("reconnect")) {
    auto ms = parse_seconds("reconnect", *v);
    if (!ms) return usage_error("serve", ms.error().message);
    if (ms->count() > proto::kReconnectMaxMs) return usage_error("serve", "--reconnect: at most 3600 seconds");
    cfg.session.reconnect = *ms;
  }
  cfg.session.resume = resume;
  if (resume && !p->has("generation")) {
    // The generation to take over: the newest one the state dir knows of this VM.
    auto st = host::reconcile(cfg.state_dir, cfg.session.vm);
    if (!st) return usage_error("serve", "--resume: " + st.error().message);
    if (!*st)
      return usage_error("serve", fmt::format("--resume: no VM '{}' in {} (give --generation)",
                                              cfg.session.vm, cfg.state_dir.string()));
    cfg.session.generation = (*st)->generation;
  }
  if (!p->has("descriptor") && !resume) return usage_error("serve", "--descriptor is required");
  if (auto d = p->get("descriptor")) {
    auto desc = load_descriptor(*d);
    if (!desc) return usage_error("serve", desc.error().message);
    cfg.session.descriptor = std::move(*desc);
    if (cfg.session.descriptor.exec.argv.empty())
      return usage_error("serve", "--descriptor: exec.argv is empty");
  }
  // A reader of our stdout going away (`serve | head -1`) must not kill the session mid-way:
  // the outcome is still recorded and returned. (serve starts no child that would inherit this.)
  ::signal(SIGPIPE, SIG_IGN);
  ServeEmbedder emb;
  if (auto v = p->get("log-max-size")) {
    auto n = parse_uint("log-max-size", *v, host::kMinLogSize, UINT64_MAX);
    if (!n) return usage_error("serve", n.error().message);
    emb.workload_log.max_size = *n;
  }
  if (auto f = p->get("stdin")) {
    // Fed from a file: a host taking over seeks to the guest's stdin position (nothing twice).
    host::Fd in(::open(f->c_str(), O_RDONLY | O_CLOEXEC));
    if (!in) return usage_error("serve", fmt::format("--stdin: open {}: {}", *f, std::strerror(errno)));
    struct Feed {
      host::Fd fd;
      std::uint64_t offset = 0;
      bool on = false, done = false;
      host::Host* h = nullptr;
      std::string vm;
      void pump() {
        char buf[65536];
        while (on && !done && h) {
          ssize_t n = ::pread(fd.get(), buf, sizeof buf, static_cast<off_t>(offset));
          if (n < 0 && errno == EINTR) continue;
          if (n <= 0) {
            if (h->send_stdin_eof(vm)) done = true;
            else on = false;  // the channel is away: the next stdin_position goes on
            return;
          }
          if (!h->send_stdin(vm, std::string_view(buf, static_cast<std::size_t>(n)))) {
            on = false;  // full (stdin_writable resumes) or away (stdin_position resumes)
            return;
          }
          offset += static_cast<std::uint64_t>(n);
        }
      }
    };
    auto feed = std::make_shared<Feed>();
    feed->fd = std::move(in);
    feed->vm = cfg.session.vm;
    emb.on_host = [feed](host::Host& h) { feed->h = &h; };
    emb.stdio.stdin_writable = [feed](const std::string&) {
      feed->on = true;
      feed->pump();
    };
    emb.on_event = [feed, first = true](host::Host&, const host::Event& ev) mutable {
      if (ev.kind == "stdin_position") {
        // The first one says where this host begins (a host taking over: the guest's count);
        // later ones follow a redial the host re-sent for itself.
        if (first) feed->offset = std::strtoull(ev.detail.c_str(), nullptr, 10);
        first = false;
        feed->on = true;
        feed->pump();
      }
    };
  }
  if (auto d = p->get("data-listen")) {
    auto spec = host::parse_listen_spec(*d);
    if (!spec) return usage_error("serve", "--data-listen: " + spec.error().message);
    if (spec->kind != host::ListenSpec::Kind::unix_path)
      return usage_error("serve", "--data-listen: only unix:PATH (vsock data listens on its own port)");
    emb.on_listening = [path = spec->path](host::Host& h, const std::string& id) {
      host::UnixListenOptions dl;
      dl.path = path;
      if (auto s = h.listen_data_unix(id, dl); !s) fmt::print(stderr, "neshost serve: --data-listen: {}\n", s.error().message);
      (void)h.vm_started(id);
    };
  }
  return serve_vm(cfg, std::move(emb));
}

const Registrar reg{{"serve", "serve one VM: boot it, record its outcome, apply --on-exit", serve_main}};

}  // namespace
}  // namespace nes::cli
