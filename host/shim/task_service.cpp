// containerd.task.v2.Task for one microVM task (host/shim/task_service.hpp): the RPC dispatch.
// Each call is parsed, the task, pod container or exec it names looked up, and handed to its
// Container (host/shim/container.hpp: Create, Start, Kill, State, Delete, CloseIO, ResizePty,
// Pause, Resume; its execs host/shim/exec_proc.hpp); what no single container answers (Wait,
// Pids, Stats, Update, Connect, Shutdown) is answered here.
#include "host/shim/task_service.hpp"

#include <unistd.h>

#include <thread>
#include <vector>

#include <boost/asio/post.hpp>
#include <fmt/format.h>
#include <simdjson.h>

#include "containerd_pb.h"
#include "host/monitor/monitor.hpp"
#include "host/shim/container.hpp"
#include "host/shim/pod.hpp"
#include "host/shim/resources.hpp"
#include "host/shim/rpc.hpp"

namespace nes::shim {
namespace asio = boost::asio;
namespace v2 = containerd::task::v2;
using rpc::empty;
using rpc::fail;
using rpc::ok;
using rpc::parse;

constexpr std::string_view kService = "containerd.task.v2.Task";

struct TaskService::Impl : Shim {
  using Shim::Shim;

  /// The container `id` names (the shim's own task, which must exist, or one of the pod's
  /// containers) and, for a non-empty `exec_id`, its exec `*x` (else null). NOT_FOUND naming
  /// the one that is not there.
  ttrpc::Reply lookup(const std::string& id, const std::string& exec_id, Container** c, ExecProc** x) {
    *c = nullptr;
    *x = nullptr;
    if (id == cfg.id) {
      const Phase ph = own().task.phase;
      if (ph == Phase::none || ph == Phase::deleted) return fail(ttrpc::Code::not_found, fmt::format("task {}: not found", id));
      *c = &own();
    } else {
      *c = pod_container(id);
      if (!*c) return fail(ttrpc::Code::not_found, fmt::format("task {}: not found", id));
    }
    if (exec_id.empty()) return empty();
    auto it = (*c)->execs.find(exec_id);
    if (it == (*c)->execs.end()) return fail(ttrpc::Code::not_found, fmt::format("exec {}: not found", exec_id));
    *x = it->second.get();
    return empty();
  }

  ttrpc::Reply create(const std::string& p) {
    auto req = parse<v2::CreateTaskRequest>(p);
    if (!req) return fail(ttrpc::Code::invalid_argument, "CreateTaskRequest: malformed");
    // Another task's id first: a pod's container sent to its sandbox's shim (host/shim/pod.hpp)
    // is not "already exists" because the sandbox is.
    if (req->id() != cfg.id) return Container::create_in_pod(*this, *req);
    return own().create(*req);
  }

  void start(ttrpc::Call&& call, ttrpc::Respond respond) {
    auto req = parse<v2::StartRequest>(call.payload);
    if (!req) return respond(fail(ttrpc::Code::invalid_argument, "StartRequest: malformed"));
    Container* c = nullptr;
    ExecProc* x = nullptr;
    if (auto r = lookup(req->id(), req->exec_id(), &c, &x); !r.status.ok()) return respond(std::move(r));
    c->start(x, std::move(respond));
  }

  ttrpc::Reply exec_add(const std::string& p) {
    auto req = parse<v2::ExecProcessRequest>(p);
    if (!req) return fail(ttrpc::Code::invalid_argument, "ExecProcessRequest: malformed");
    Container* c = nullptr;
    ExecProc* x = nullptr;
    if (auto r = lookup(req->id(), {}, &c, &x); !r.status.ok()) return r;
    return c->add_exec(*req);
  }

  ttrpc::Reply state(const std::string& p) {
    auto req = parse<v2::StateRequest>(p);
    if (!req) return fail(ttrpc::Code::invalid_argument, "StateRequest: malformed");
    Container* c = nullptr;
    ExecProc* x = nullptr;
    if (auto r = lookup(req->id(), req->exec_id(), &c, &x); !r.status.ok()) {
      // A deleted exec answers from its receipt (STOPPED, its status and time), so a retried
      // DeleteProcess, which containerd sends after a State, gets the receipt, identical.
      auto& by_key = receipts.by_key;
      auto it = req->exec_id().empty() ? by_key.end() : by_key.find({req->id(), req->exec_id()});
      if (it == by_key.end()) return r;
      v2::StateResponse st;
      st.set_id(req->exec_id());
      st.set_exec_id(req->exec_id());
      st.set_bundle(cfg.bundle.string());
      st.set_pid(it->second.pid());
      st.set_status(containerd::v1::types::Status::STOPPED);
      st.set_exit_status(it->second.exit_status());
      *st.mutable_exited_at() = it->second.exited_at();
      return ok(st);
    }
    return ok(c->state(x));
  }

  /// Kill: Container::kill; a signal (other than SIGKILL and SIGTERM, which end a booting VM at
  /// once) to the task of a VM that still boots is delivered once its guest runs, waiting at
  /// most 30 s (deliver_when_ready), and answered then.
  void kill(ttrpc::Call&& call, ttrpc::Respond respond) {
    auto req = parse<v2::KillRequest>(call.payload);
    if (!req) return respond(fail(ttrpc::Code::invalid_argument, "KillRequest: malformed"));
    Container* c = nullptr;
    ExecProc* x = nullptr;
    if (auto r = lookup(req->id(), req->exec_id(), &c, &x); !r.status.ok()) return respond(std::move(r));
    const std::uint32_t sig = req->signal();
    if (sig < 1 || sig > 64) return respond(fail(ttrpc::Code::invalid_argument, fmt::format("signal: {} is not 1..64", sig)));
    ttrpc::Reply r = c->kill(x, sig, req->all());
    if (r.status.code == ttrpc::Code::unavailable && r.status.message == Container::kKillNotReadyYet)
      return c->kill_later(sig, std::move(respond));
    respond(std::move(r));
  }

  ttrpc::Reply del(const std::string& p) {
    auto req = parse<v2::DeleteRequest>(p);
    if (!req) return fail(ttrpc::Code::invalid_argument, "DeleteRequest: malformed");
    // A retried Delete gets the first one's answer (a receipt), not NOT_FOUND.
    if (req->id() == cfg.id && req->exec_id().empty() && own().task.phase == Phase::deleted)
      return ok(own().task.delete_response());
    if (auto it = receipts.by_key.find({req->id(), req->exec_id()}); it != receipts.by_key.end()) return ok(it->second);
    Container* c = nullptr;
    ExecProc* x = nullptr;
    if (auto r = lookup(req->id(), req->exec_id(), &c, &x); !r.status.ok()) return r;
    return c->del(x);
  }

  /// Pause / Resume (`resume`): the task's VM's vCPUs, through its monitor (QMP stop/cont). A pod's
  /// container shares the pod's VM: only the sandbox task pauses it. Publishes /tasks/paused or
  /// /tasks/resumed, as runc's shim. One that comes while the VM boots (containerd reports the task
  /// RUNNING once Start answered) waits for its guest, at most 30 s (deliver.hpp).
  void pause_resume(const std::string& id, bool resume, ttrpc::Respond respond) {
    const char* what = resume ? "resume" : "pause";
    Container* c = nullptr;
    ExecProc* x = nullptr;
    if (auto r = lookup(id, "", &c, &x); !r.status.ok()) return respond(std::move(r));
    if (!c->own)
      return respond(fail(ttrpc::Code::failed_precondition,
                          fmt::format("{}: container {} runs in its pod's VM: {} the pod's sandbox task (every "
                                      "container of the pod with it)", what, id, what)));
    c->pause_resume(resume, std::move(respond));
  }
  void pause(ttrpc::Call&& c, ttrpc::Respond respond) {
    auto req = parse<v2::PauseRequest>(c.payload);
    if (!req) return respond(fail(ttrpc::Code::invalid_argument, "PauseRequest: malformed"));
    pause_resume(req->id(), false, std::move(respond));
  }
  void resume(ttrpc::Call&& c, ttrpc::Respond respond) {
    auto req = parse<v2::ResumeRequest>(c.payload);
    if (!req) return respond(fail(ttrpc::Code::invalid_argument, "ResumeRequest: malformed"));
    pause_resume(req->id(), true, std::move(respond));
  }

  ttrpc::Reply resize(const std::string& p) {
    auto req = parse<v2::ResizePtyRequest>(p);
    if (!req) return fail(ttrpc::Code::invalid_argument, "ResizePtyRequest: malformed");
    Container* c = nullptr;
    ExecProc* x = nullptr;
    if (auto r = lookup(req->id(), req->exec_id(), &c, &x); !r.status.ok()) return r;
    if (req->width() < 1 || req->height() < 1 || req->width() > 0xffff || req->height() > 0xffff)
      return fail(ttrpc::Code::invalid_argument, fmt::format("width {} height {}: each must be 1..65535", req->width(), req->height()));
    return c->resize(x, req->height(), req->width());
  }

  ttrpc::Reply close_io(const std::string& p) {
    auto req = parse<v2::CloseIORequest>(p);
    if (!req) return fail(ttrpc::Code::invalid_argument, "CloseIORequest: malformed");
    // The stdin FIFO's reader is `neshost run`: once the shim's writer is closed too, the last
    // client's close is the EOF the workload sees (ctr sends CloseIO when its stdin ends).
    Container* c = nullptr;
    ExecProc* x = nullptr;
    if (auto r = lookup(req->id(), req->exec_id(), &c, &x); !r.status.ok() || !req->stdin()) return r;
    return c->close_stdin(x);
  }

  void wait(ttrpc::Call&& call, ttrpc::Respond respond) {
    auto req = parse<v2::WaitRequest>(call.payload);
    if (!req) return respond(fail(ttrpc::Code::invalid_argument, "WaitRequest: malformed"));
    // A task stopped or deleted still answers (deleted: with its last exit).
    const Process& t = own().task;
    if (req->id() == cfg.id && req->exec_id().empty() && (t.phase == Phase::stopped || t.phase == Phase::deleted))
      return respond(ok(t.wait_response()));
    Container* c = nullptr;
    ExecProc* x = nullptr;
    if (auto r = lookup(req->id(), req->exec_id(), &c, &x); !r.status.ok()) return respond(std::move(r));
    Process& pr = x ? *x : c->process();
    if (pr.phase == Phase::stopped) return respond(ok(pr.wait_response()));
    pr.waiters.push_back(std::move(respond));
  }

  ttrpc::Reply connect(const std::string& p) {
    auto req = parse<v2::ConnectRequest>(p);
    if (!req) return fail(ttrpc::Code::invalid_argument, "ConnectRequest: malformed");
    v2::ConnectResponse r;
    r.set_shim_pid(static_cast<std::uint32_t>(::getpid()));
    r.set_task_pid(own().task.state(cfg.bundle.string()).pid());  // as State says it (the shim's before Start)
    r.set_version(NESINIT_SHIM_VERSION);
    return ok(r);
  }

  ttrpc::Reply shutdown(const std::string& p) {
    auto req = parse<v2::ShutdownRequest>(p);
    if (!req) return fail(ttrpc::Code::invalid_argument, "ShutdownRequest: malformed");
    // A task not yet deleted keeps its shim (containerd's own shims exit only with no task left).
    const Phase ph = own().task.phase;
    if (ph != Phase::none && ph != Phase::deleted) return empty();
    if (containers.size() > 1) return empty();  // a pod's container not yet deleted
    asio::post(io, [this] { if (cfg.shutdown) cfg.shutdown(); });
    return empty();
  }

  /// Update: a microVM's memory and vCPUs are fixed when it boots and the guest applies no cgroup
  /// limits of its own, so nothing can be changed live: an Update that asks for anything answers
  /// FAILED_PRECONDITION naming each resource it asked for (the LinuxResources JSON containerd
  /// sends: `memory.limit`, `cpu.quota`, ...; an annotation by its key). One that asks for nothing
  /// is OK.
  void update(ttrpc::Call&& call, ttrpc::Respond respond) {
    auto req = parse<v2::UpdateTaskRequest>(call.payload);
    if (!req) return respond(fail(ttrpc::Code::invalid_argument, "UpdateTaskRequest: malformed"));
    Container* c = nullptr;
    ExecProc* x = nullptr;
    if (auto r = lookup(req->id(), "", &c, &x); !r.status.ok()) return respond(std::move(r));
    if (!c->own) return update_container(*c, *req, std::move(respond));
    respond(update_vm(*req));
  }

  /// Update of a pod's container (docs/containerd.md "Resources of a pod's containers"): its
  /// LinuxResources checked (errors name the container and the field), the pod's sum checked
  /// against its VM (fits_vm), then written to its cgroup in the guest (control `resources`),
  /// whose refusal (a memory limit below what it uses) is INVALID_ARGUMENT naming both.
  void update_container(Container& c, const v2::UpdateTaskRequest& req, ttrpc::Respond respond) {
    const std::string& cid = c.id;
    auto bad = [&](ttrpc::Code code, const std::string& m) { respond(fail(code, fmt::format("container '{}': {}", cid, m))); };
    for (const auto& [k, v] : req.annotations())
      return bad(ttrpc::Code::invalid_argument, fmt::format("annotations.{}: not applied to a running container", k.substr(0, 128)));
    if (!req.has_resources() || req.resources().value().empty()) return respond(empty());
    auto res = parse_resources_json(req.resources().value(), "linux.resources");
    if (!res) return bad(ttrpc::Code::invalid_argument, res.error().message);
    if (!*res) return respond(empty());
    if (c.process().phase != Phase::running || !c.init || c.init->proc == 0)
      return bad(ttrpc::Code::failed_precondition, "not running: its limits are set at its Start");
    std::vector<proto::ContainerResources> pod;
    for (const auto& [id, other] : containers)
      if (!other->own && other.get() != &c && other->init && other->process().phase == Phase::running && other->init->spec.resources)
        pod.push_back(*other->init->spec.resources);
    const proto::ContainerResources next = merged(c.init->spec.resources, **res);
    pod.push_back(next);
    if (auto f = fits_vm(pod, own().spec.mem_mib.value_or(kPodBaseMemMib), own().spec.cpus.value_or(kPodBaseCpus)); !f)
      return bad(ttrpc::Code::failed_precondition, f.error().message);
    proto::ContainerResourcesRequest r{c.init->proc, **res};
    ask_resources(cid, r, [this, cid, next, respond = std::move(respond)](host::Result<proto::ContainerResourcesReply> a) {
      if (!a) return respond(fail(ttrpc::Code::unavailable, fmt::format("container '{}': update: {}", cid, a.error().message)));
      if (a->error)
        return respond(fail(ttrpc::Code::invalid_argument,
                            fmt::format("container '{}': linux.resources: {} (in its cgroup in the pod's VM)", cid, *a->error)));
      if (Container* now = pod_container(cid); now && now->init) now->init->spec.resources = next;
      respond(empty());
    });
  }

  /// Asks the VM's monitor about container `cid`'s cgroup on a thread of its own (the shim's
  /// loop never waits for a guest); `done` runs on the loop.
  void ask_resources(const std::string& cid, const proto::ContainerResourcesRequest& r,
                     std::function<void(host::Result<proto::ContainerResourcesReply>)> done) {
    const auto path = control();
    askers.emplace_back([this, path, r, done = std::move(done)]() mutable {
      auto a = monitor::container_resources(path, r);
      asio::post(io, [this, id = std::this_thread::get_id(), a = std::move(a), done = std::move(done)]() mutable {
        for (auto it = askers.begin(); it != askers.end(); ++it)
          if (it->get_id() == id) {
            it->join();
            askers.erase(it);
            break;
          }
        done(std::move(a));
      });
    });
  }

  /// Update of the shim's own task (a VM of its own, or the pod's sandbox).
  ttrpc::Reply update_vm(const v2::UpdateTaskRequest& r) {
    const v2::UpdateTaskRequest* req = &r;
    std::vector<std::string> asked;
    if (req->has_resources() && !req->resources().value().empty()) {
      simdjson::dom::parser jp;
      simdjson::dom::object o;
      if (jp.parse(simdjson::padded_string(req->resources().value())).get(o)) {
        asked.push_back(fmt::format("resources of type {}", req->resources().type_url()));
      } else {
        for (auto [k, v] : o) {
          if (v.is_null()) continue;
          simdjson::dom::object sub;
          if (v.get(sub) == simdjson::SUCCESS) {
            for (auto [k2, v2] : sub)
              if (!v2.is_null()) asked.push_back(fmt::format("{}.{}", std::string_view(k), std::string_view(k2)));
          } else {
            asked.push_back(std::string(k));
          }
          if (asked.size() >= 16) break;  // bounded: the message names the first ones
        }
      }
    }
    for (const auto& [k, v] : req->annotations()) {
      if (asked.size() >= 16) break;
      asked.push_back("annotation " + k.substr(0, 128));
    }
    if (asked.empty()) return empty();
    std::string list;
    for (const auto& a : asked) list += (list.empty() ? "" : ", ") + a;
    return fail(ttrpc::Code::failed_precondition,
                fmt::format("Update: cannot change {} of task {} live: a microVM's memory and vCPUs are fixed when it "
                            "boots and the guest applies no cgroup limits of its own (recreate the task)",
                            list, req->id()));
  }

  // The guest's processes (pids as the guest sees them, 1 = nesinit), asked of `neshost run`
  // through its control socket on a thread of its own, so the shim's loop never waits for a
  // guest. A guest that cannot answer (not booted yet, an older init) gives the VM's monitor
  // process instead, as before.
  void pids(ttrpc::Call&& call, ttrpc::Respond respond) {
    auto req = parse<v2::PidsRequest>(call.payload);
    if (!req) return respond(fail(ttrpc::Code::invalid_argument, "PidsRequest: malformed"));
    if (req->id() != cfg.id) {  // a pod's container: its own process (its pid in the guest)
      Container* c = nullptr;
      ExecProc* x = nullptr;
      if (auto r = lookup(req->id(), {}, &c, &x); !r.status.ok()) return respond(std::move(r));
      v2::PidsResponse r;
      if (c->process().phase == Phase::running) r.add_processes()->set_pid(c->process().pid);
      return respond(ok(r));
    }
    Container* c = nullptr;
    ExecProc* x = nullptr;
    if (auto r = lookup(req->id(), {}, &c, &x); !r.status.ok()) return respond(std::move(r));
    if (own().task.phase != Phase::running) return respond(ok(v2::PidsResponse{}));
    const auto path = control();
    const std::uint32_t monitor = static_cast<std::uint32_t>(own().rec.pid);
    askers.emplace_back([this, path, monitor, respond = std::move(respond)]() mutable {
      auto list = cli::guest_processes(path);
      asio::post(io, [this, id = std::this_thread::get_id(), list = std::move(list), monitor,
                      respond = std::move(respond)]() {
        // The asking thread is done but for returning: joined here, on the loop.
        for (auto it = askers.begin(); it != askers.end(); ++it)
          if (it->get_id() == id) {
            it->join();
            askers.erase(it);
            break;
          }
        v2::PidsResponse r;
        if (list) {
          for (const auto& pi : list->processes) r.add_processes()->set_pid(static_cast<std::uint32_t>(pi.pid));
        } else {
          r.add_processes()->set_pid(monitor);
        }
        respond(ok(r));
      });
    });
  }

  /// Stats: containerd's `io.containerd.cgroups.v2.Metrics`, filled with the guest's own figures
  /// (its init's totals beside the process list, docs/protocol.md "Process list"): pids.current
  /// its user-space processes, cpu usage/user/system µs since boot over all vCPUs, memory usage
  /// (MemTotal - MemAvailable) and usage_limit (MemTotal). What the workload uses, as runc's
  /// cgroup would say; what the VMM costs the host is `neshost stats`'. A paused or stopped task:
  /// FAILED_PRECONDITION (its guest cannot answer). A pod's container: the pod VM's figures.
  void stats(ttrpc::Call&& call, ttrpc::Respond respond) {
    auto req = parse<v2::StatsRequest>(call.payload);
    if (!req) return respond(fail(ttrpc::Code::invalid_argument, "StatsRequest: malformed"));
    Container* c = nullptr;
    ExecProc* x = nullptr;
    if (auto r = lookup(req->id(), "", &c, &x); !r.status.ok()) return respond(std::move(r));
    if (own().task.phase != Phase::running || !own().monitor_alive() || (!c->own && c->process().phase != Phase::running))
      return respond(fail(ttrpc::Code::failed_precondition, fmt::format("stats: task {} is not running", req->id())));
    if (own().vm_paused())
      return respond(fail(ttrpc::Code::failed_precondition,
                          fmt::format("stats: task {} is paused: its guest cannot answer", req->id())));
    if (!c->own && c->init && c->init->proc != 0) {
      // A pod's container: its own cgroup's figures (an init without them: the VM's, as before).
      const std::string cid = c->id;
      proto::ContainerResourcesRequest r{c->init->proc, std::nullopt};
      return ask_resources(cid, r, [this, cid, respond = std::move(respond)](host::Result<proto::ContainerResourcesReply> a) mutable {
        if (!a || !a->stats) return vm_stats(std::move(respond));
        respond(ok(container_metrics(*a->stats)));
      });
    }
    vm_stats(std::move(respond));
  }

  /// containerd's cgroups v2 Metrics of one container's cgroup in the guest, as runc's shim
  /// fills them from the container's own cgroup (memory usage = memory.current, usage_limit =
  /// memory.max or 0 for none, anon, file, oom_kill; cpu.stat's; pids).
  static v2::StatsResponse container_metrics(const proto::CgroupStats& s) {
    ::io::containerd::cgroups::v2::Metrics m;
    m.mutable_pids()->set_current(s.pids_current);
    m.mutable_pids()->set_limit(s.pids_max);
    auto* cpu = m.mutable_cpu();
    cpu->set_usage_usec(s.cpu_usage_usec);
    cpu->set_user_usec(s.cpu_user_usec);
    cpu->set_system_usec(s.cpu_system_usec);
    cpu->set_nr_periods(s.cpu_nr_periods);
    cpu->set_nr_throttled(s.cpu_nr_throttled);
    cpu->set_throttled_usec(s.cpu_throttled_usec);
    auto* mem = m.mutable_memory();
    mem->set_usage(s.memory_current);
    mem->set_usage_limit(s.memory_max);
    mem->set_anon(s.memory_anon);
    mem->set_file(s.memory_file);
    m.mutable_memory_events()->set_oom_kill(s.oom_kills);
    v2::StatsResponse r;
    r.mutable_stats()->set_type_url("io.containerd.cgroups.v2.Metrics");
    r.mutable_stats()->set_value(m.SerializeAsString());
    return r;
  }

  /// Stats from the guest's totals (the shim's own task, or a container of an older init).
  void vm_stats(ttrpc::Respond respond) {
    const auto path = control();
    askers.emplace_back([this, path, respond = std::move(respond)]() mutable {
      auto list = cli::guest_processes(path);
      asio::post(io, [this, id = std::this_thread::get_id(), list = std::move(list), respond = std::move(respond)]() {
        for (auto it = askers.begin(); it != askers.end(); ++it)
          if (it->get_id() == id) {
            it->join();
            askers.erase(it);
            break;
          }
        if (!list) return respond(fail(ttrpc::Code::unavailable, fmt::format("stats: {}", list.error().message)));
        ::io::containerd::cgroups::v2::Metrics m;
        m.mutable_pids()->set_current(list->processes.size() + list->truncated);
        if (const auto& t = list->totals) {
          auto* cpu = m.mutable_cpu();
          cpu->set_user_usec(t->cpu_user_usec);
          cpu->set_system_usec(t->cpu_system_usec);
          cpu->set_usage_usec(t->cpu_user_usec + t->cpu_system_usec);
          auto* mem = m.mutable_memory();
          mem->set_usage(t->mem_total > t->mem_available ? t->mem_total - t->mem_available : 0);
          mem->set_usage_limit(t->mem_total);
        }
        v2::StatsResponse r;
        r.mutable_stats()->set_type_url("io.containerd.cgroups.v2.Metrics");
        r.mutable_stats()->set_value(m.SerializeAsString());
        respond(ok(r));
      });
    });
  }

  /// Answers each call of `server`'s Task service with `h` (called on the loop's thread).
  using Sync = ttrpc::Reply (Impl::*)(const std::string& payload);
  using Async = void (Impl::*)(ttrpc::Call&& c, ttrpc::Respond r);
};

TaskService::TaskService(asio::io_context& io, ServiceConfig cfg, Publisher& events)
    : impl_(std::make_unique<Impl>(io, std::move(cfg), events)) {}
TaskService::~TaskService() = default;

std::optional<std::string> TaskService::restore() { return impl_->own().restore(); }

void TaskService::register_on(ttrpc::Server& server) {
  Impl* im = impl_.get();
  const std::string svc(kService);
  auto sync = [&](const char* name, Impl::Sync h) {
    server.add(svc, name, [im, h](ttrpc::Call&& c, ttrpc::Respond r) { r((im->*h)(c.payload)); });
  };
  auto async = [&](const char* name, Impl::Async h) {
    server.add(svc, name, [im, h](ttrpc::Call&& c, ttrpc::Respond r) { (im->*h)(std::move(c), std::move(r)); });
  };
  sync("Create", &Impl::create);
  async("Start", &Impl::start);
  sync("Exec", &Impl::exec_add);
  sync("State", &Impl::state);
  async("Kill", &Impl::kill);
  sync("Delete", &Impl::del);
  async("Pids", &Impl::pids);
  async("Stats", &Impl::stats);
  sync("Connect", &Impl::connect);
  sync("ResizePty", &Impl::resize);
  sync("CloseIO", &Impl::close_io);
  sync("Shutdown", &Impl::shutdown);
  async("Pause", &Impl::pause);
  async("Resume", &Impl::resume);
  async("Update", &Impl::update);
  async("Wait", &Impl::wait);
  // Known, and answered clearly: containerd maps UNIMPLEMENTED to ErrNotImplemented.
  for (const char* m : {"Checkpoint"}) {
    std::string why = fmt::format("{}: not supported by the nesinit shim", m);
    server.add(svc, m, [why](ttrpc::Call&&, ttrpc::Respond r) { r(ttrpc::Reply{{ttrpc::Code::unimplemented, why}, {}}); });
  }
}

}  // namespace nes::shim
