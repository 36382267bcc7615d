// Task events to containerd (host/shim/events.hpp).
#include "host/shim/events.hpp"

#include <chrono>

#include "containerd_pb.h"
#include "host/shim/ttrpc.hpp"

namespace nes::shim {

Publisher::Publisher(std::string ttrpc_address, std::string ns) : ns_(std::move(ns)) {
  std::string_view a = ttrpc_address;
  if (a.starts_with("unix://")) a.remove_prefix(7);
  address_ = std::string(a);
  thread_ = std::thread([this] { run(); });
}

Publisher::~Publisher() {
  {
    std::lock_guard lk(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void Publisher::publish(std::string topic, const google::protobuf::Message& event) {
  Item it;
  it.topic = std::move(topic);
  it.type_url = event.GetDescriptor()->full_name();
  it.value = event.SerializeAsString();
  auto now = std::chrono::system_clock::now().time_since_epoch();
  it.sec = std::chrono::duration_cast<std::chrono::seconds>(now).count();
  it.nsec = static_cast<std::int32_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(now).count() % 1000000000);
  {
    std::lock_guard lk(mu_);
    if (queue_.size() >= kMaxQueued) {
      queue_.pop_front();
      ++dropped_;
    }
    queue_.push_back(std::move(it));
  }
  cv_.notify_all();
}

std::size_t Publisher::dropped() const {
  std::lock_guard lk(mu_);
  return dropped_;
}

void Publisher::run() {
  using namespace std::chrono_literals;
  std::unique_lock lk(mu_);
  while (true) {
    cv_.wait(lk, [&] { return stopping_ || !queue_.empty(); });
    if (queue_.empty()) return;
    Item it = std::move(queue_.front());
    queue_.pop_front();
    lk.unlock();
    bool sent = false;
    if (!address_.empty()) {
      containerd::services::events::ttrpc::v1::ForwardRequest req;
      auto* env = req.mutable_envelope();
      env->mutable_timestamp()->set_seconds(it.sec);
      env->mutable_timestamp()->set_nanos(it.nsec);
      env->set_namespace_(ns_);
      env->set_topic(it.topic);
      env->mutable_event()->set_type_url(it.type_url);
      env->mutable_event()->set_value(it.value);
      ttrpc::Call c{"containerd.services.events.ttrpc.v1.Events", "Forward", req.SerializeAsString(), 0, {}};
      // A stopping shim tries each remaining event once: its exit is bounded by 2 s per event.
      int attempts = kAttempts;
      {
        std::lock_guard w(mu_);
        if (stopping_) attempts = 1;
      }
      for (int i = 0; i < attempts && !sent; ++i) {
        auto r = ttrpc::call(address_, c, 2s);
        sent = r && r->status.ok();
        if (!sent && i + 1 < attempts) {
          std::unique_lock w(mu_);
          // 1 s, 2 s, 3 s, 4 s between attempts, as containerd's own publisher backs off: a
          // TaskExit outlives a containerd restart. A stop cuts the pause short.
          cv_.wait_for(w, std::chrono::seconds(i + 1), [&] { return stopping_; });
          if (stopping_) attempts = std::min(attempts, i + 2);
        }
      }
    }
    lk.lock();
    if (!sent) ++dropped_;
  }
}

}  // namespace nes::shim
