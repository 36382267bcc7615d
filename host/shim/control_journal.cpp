// Controls journaled (host/shim/control_journal.hpp).
#include "host/shim/control_journal.hpp"

#include <algorithm>
#include <memory>

#include <fmt/format.h>

#include "host/shim/container.hpp"
#include "host/shim/deliver.hpp"
#include "host/shim/durable.hpp"
#include "host/shim/fault_point.hpp"
#include "host/shim/log.hpp"

namespace nes::shim {
namespace control = monitor::control;
using namespace std::chrono_literals;

namespace {
host::Status write_record(Container& own, std::string_view point) {
  return write_durable_at(point, own.bundle, kTaskFile, encode_task_record(own.rec));
}
}  // namespace

host::Result<control::Targeted> record_control(Container& own, const control::Request& request) {
  if (own.rec.controls.size() >= kPendingControlsMax)
    return host::Error{fmt::format("task {}: {} controls already wait for the monitor's answer", own.id,
                                   own.rec.controls.size())};
  if (own.rec.control_seq >= control::kSeqMax) return host::Error{fmt::format("task {}: control sequence exhausted", own.id)};
  const std::uint64_t seq = ++own.rec.control_seq;
  own.rec.controls.push_back(PendingControl{seq, control::encode(request)});
  if (auto w = write_record(own, "record:control"); !w) {
    own.rec.controls.pop_back();
    return w.error();
  }
  fault_point("control:recorded");
  return control::Targeted{std::nullopt, request, seq};
}

void control_answered(Container& own, std::uint64_t seq) {
  fault_point("control:sent");
  auto& cs = own.rec.controls;
  const auto it = std::find_if(cs.begin(), cs.end(), [seq](const PendingControl& c) { return c.seq == seq; });
  if (it == cs.end()) return;
  cs.erase(it);
  if (auto w = write_record(own, "record:control-answered"); !w)
    log("task {}: control {} answered; its record not updated ({}): a replacement sends it again, applied once",
        own.id, seq, w.error().message);
}

host::Status journaled_call(Container& own, const control::Request& request, std::chrono::milliseconds timeout) {
  auto t = record_control(own, request);
  if (!t) return t.error();
  host::Status r = monitor::control_call(own.shim.control(), *t, timeout);
  control_answered(own, *t->seq);
  return r;
}

std::size_t replay_controls(Container& own, std::function<void(const control::Request&, host::Status)> replayed) {
  const std::vector<PendingControl> pending = own.rec.controls;
  auto done = std::make_shared<std::function<void(const control::Request&, host::Status)>>(std::move(replayed));
  for (const PendingControl& c : pending) {
    auto req = control::parse_request(c.request);
    if (!req) {  // not ours to guess at: said and dropped
      log("task {}: recorded control {} '{}' not sent again: {}", own.id, c.seq, c.request, req.error().message);
      control_answered(own, c.seq);
      continue;
    }
    const control::Targeted t{std::nullopt, *req, c.seq};
    Container* o = &own;
    deliver_when_ready(own.shim.io, own.shim.control(), t, 30s, [o] { return o->task.phase == Phase::running; },
                       [o, t, done](host::Status st) {
                         log("task {}: recorded control {} '{}' sent again: {}", o->id, *t.seq,
                             control::encode(t.request), st ? std::string("ok") : st.error().message);
                         const std::uint64_t seq = *t.seq;
                         auto& cs = o->rec.controls;
                         const auto it = std::find_if(cs.begin(), cs.end(), [seq](const PendingControl& p) { return p.seq == seq; });
                         if (it != cs.end()) {
                           cs.erase(it);
                           if (auto w = write_record(*o, "record:control-answered"); !w)
                             log("task {}: control {}: its record not updated ({})", o->id, seq, w.error().message);
                         }
                         (*done)(t.request, std::move(st));
                       });
  }
  return pending.size();
}

}  // namespace nes::shim
