// The Monitor's run entry, its serve loop and its end (host/monitor/vm_monitor.hpp).
#include <sys/signalfd.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include <fmt/format.h>

#include "host/lib/state_dir.hpp"
#include "host/monitor/boot_files.hpp"
#include "host/monitor/daemons.hpp"
#include "host/monitor/owed_output.hpp"
#include "host/monitor/reconcile.hpp"
#include "host/monitor/removal.hpp"
#include "host/monitor/say.hpp"
#include "host/monitor/vm_monitor.hpp"
#include "protocol/status.hpp"

namespace nes::monitor {

int Monitor::run(cli::RunPlan& plan, cli::RuntimeDir& rt, RunStart start) {
  auto fail = [](std::string_view msg) {
    say("neshost run: {}\n", msg);
    return proto::kStatusHostFailure;
  };
  if (auto s = prepare_boot_files(plan); !s) return fail(s.error().message);
  VmResources run;
  run.netns_fd = start.netns_fd;
  if (auto s = start_passt(plan, run); !s) return fail(s.error().message);
  if (auto s = open_vm_state(plan, run); !s) return fail(s.error().message);
  // --rm: however the run ends from here, the VM's state goes with it (`neshost rm`'s removal, by
  // its own monitor). A detached VM whose workload never started is kept: its creator reads why
  // from it (then `neshost rm` it).
  const auto self = host::self_identity().value_or(host::ProcessIdentity{::getpid(), 0, {}});
  auto end = [&](int status) {
    if (plan.rm && !(start.detached && start.started_notify))
      if (auto r = host::remove_vm(plan.state_dir, plan.vm, self); !r) say("neshost run: --rm: {}\n", r.error().message);
    return status;
  };
  if (auto s = start_daemons(plan, run); !s) return end(fail(s.error().message));
  if (start.snapshot) {
    // QEMU maps the RAM we checked: the snapshot's file itself (copy-on-write), or with shares a
    // private copy of it (shared with their daemons); it loads the state we checked.
    if (plan.hotplug_shares.empty()) {
      run.snapshot_ram = std::move(start.snapshot->ram);
    } else {
      auto copy = vm::copy_ram(start.snapshot->ram);
      if (!copy) return end(fail(fmt::format("--snapshot: {}", copy.error().message)));
      run.snapshot_ram = std::move(*copy);
    }
    run.snapshot_state = std::move(start.snapshot->state);
  }
  auto argv = launch_argv(plan);
  if (!argv) return end(fail(argv.error().message));
  Monitor m(plan, rt, run, start.started_notify, std::move(*argv));
  return end(m.serve());
}

Monitor::Monitor(const cli::RunPlan& plan, cli::RuntimeDir& rt, VmResources& run, host::Fd& started_notify,
                 std::vector<std::string> argv, std::function<void()> on_resumed)
    : plan_(plan),
      cfg_(plan.serve),
      vmid_(plan.vm),
      rt_(rt),
      run_(run),
      started_notify_(started_notify),
      argv_(std::move(argv)),
      on_resumed_(std::move(on_resumed)),
      out_(io_, run.out_sink ? run.out_sink.get() : 1, cli::kOutputQueueCap),
      err_(io_, run.err_sink ? run.err_sink.get() : 2, cli::kOutputQueueCap),
      execs_(io_, plan.vm, [this] { update_pause(); }),
      winch_(io_),
      pause_(plan.sandbox ? std::filesystem::path() : plan.runtime_dir / "qmp.sock", plan.serve.state_dir, plan.vm,
             plan.serve.session.generation,
             host::paused_generation(plan.serve.state_dir, plan.vm) == plan.serve.session.generation) {
  sigemptyset(&stop_signals_);
  sigaddset(&stop_signals_, SIGINT);
  sigaddset(&stop_signals_, SIGTERM);
  setup_stdio();
}

Monitor::~Monitor() = default;

int Monitor::serve() {
  int status = cli::serve_vm(cfg_, embedder());
  return finish(status);
}

/// serve_vm()'s embedder: every callback one of this Monitor's members.
cli::ServeEmbedder Monitor::embedder() {
  cli::ServeEmbedder emb;
  emb.io = &io_;
  emb.on_host = [this](host::Host& h) {
    host_ = &h;
    execs_.set_host(&h);
  };
  emb.stdio.data = [this](const std::string&, proto::Stream st, std::string_view b) {
    // A replacement: what the sink already has of the guest's replay is not written again.
    std::uint64_t& skip = st == proto::Stream::err ? run_.skip_err : run_.skip_out;
    const std::size_t drop = static_cast<std::size_t>(std::min<std::uint64_t>(skip, b.size()));
    skip -= drop;
    b.remove_prefix(drop);
    (st == proto::Stream::err ? err_ : out_).write(b);
    update_pause();
  };
  emb.stdio.stdin_writable = [this](const std::string&) {
    if (pump_) pump_->resume();
    execs_.resume_stdin();
  };
  emb.workload_log = plan_.workload_log;
  emb.print_events = false;
  emb.channel_is_vm = false;
  emb.before_shutdown = [this] {
    stopping_ = true;
    if (auto r = pause_.resume(); !r)
      say("neshost monitor: VM {}: resume before shutting down: {}\n", vmid_, r.error().message);
  };
  emb.on_listening = [this](host::Host& h, const std::string& id) { on_listening(h, id); };
  emb.hooks.destroy = [this](const std::string&, std::uint64_t) {
    if (vmm_) vmm_->kill();  // the exit watch reaps it and reports vm_exited
  };
  emb.hooks.remove = [this](const std::string&, std::uint64_t) { remove_scratch_ = true; };
  emb.on_event = [this](host::Host& h, const host::Event& ev) { on_event(h, ev); };
  return emb;
}

/// After the session: the VMM gone, the output still owed delivered, the daemons reaped, --on-exit
/// remove's scratch files removed. Returns the exit status.
int Monitor::finish(int status) {
  // The Host is gone with serve_vm(): nothing may reach it any more.
  host_ = nullptr;
  execs_.host_gone();
  // SIGINT/SIGTERM end the waits below (blocked at `finished`; here too after a give-up).
  ::sigprocmask(SIG_BLOCK, &stop_signals_, nullptr);
  host::Fd stop_fd{::signalfd(-1, &stop_signals_, SFD_CLOEXEC | SFD_NONBLOCK)};

  // Whatever happened (a second signal, a library error): QEMU is gone before we return, and its
  // console drained.
  if (vmm_) vmm_->stop();
  if (control_) control_->stop_accepting();  // its handler needs the Host; replies still go out
  stop_vmm();
  if (pump_) pump_->stop();
  {
    boost::system::error_code bec;
    winch_.clear(bec);
  }
  raw_.reset();  // the terminal as it was (^C is a signal again), before the last writes
  drain_exec_clients(io_, execs_, stop_fd.get());
  control_.reset();
  status = deliver_owed_output(out_, err_, stop_fd.get(), final_record_, plan_.grace, status);
  reap_daemons(plan_, run_);
  // --on-exit remove: its intent first, so a crash mid-removal is finished by the next command
  // (host/monitor/removal.hpp).
  if (remove_scratch_)
    if (auto r = host::remove_scratch(plan_.state_dir, vmid_, cfg_.session.generation); !r)
      say("neshost monitor: VM {}: --on-exit remove: {}\n", vmid_, r.error().message);
  return status;
}

}  // namespace nes::monitor
