// Task events to containerd: each a containerd.services.events.ttrpc.v1.Events/Forward call on
// containerd's ttrpc socket ($TTRPC_ADDRESS), carrying an Envelope (timestamp, namespace, topic,
// the event as a google.protobuf.Any whose type URL is the event's full protobuf name, e.g.
// "containerd.events.TaskExit"), as containerd's own shims publish them. Sent in order by one
// thread so the ttrpc server's loop never waits on containerd.
#pragma once

#include <condition_variable>
#include <deque>
#include <filesystem>
#include <mutex>
#include <string>
#include <thread>

#include <google/protobuf/message.h>

namespace nes::shim {

/// Ordered, bounded, retrying event sender.
class Publisher {
 public:
  /// Events queued at most; a full queue drops the oldest (counted in dropped()).
  static constexpr std::size_t kMaxQueued = 1024;
  /// Attempts per event (each bounded by 2 s), 1, 2, 3, 4 s apart (containerd's publisher's
  /// backoff: an event outlives a daemon restart of ~15 s); once stopping, one more at most.
  static constexpr int kAttempts = 5;

  /// `ttrpc_address`: containerd's ttrpc socket (a path, "unix://" allowed); empty: events are
  /// dropped (a shim run by hand). `ns`: the namespace every envelope names.
  Publisher(std::string ttrpc_address, std::string ns);
  /// Sends what is queued, one attempt each (so at most 2 s per event), then stops.
  ~Publisher();
  Publisher(const Publisher&) = delete;
  Publisher& operator=(const Publisher&) = delete;

  /// Queue `event` under `topic` ("/tasks/exit", ...). Never blocks.
  void publish(std::string topic, const google::protobuf::Message& event);
  /// Events given up on (queue overflow or every attempt failed).
  std::size_t dropped() const;

 private:
  void run();
  struct Item {
    std::string topic, type_url, value;
    std::int64_t sec = 0;
    std::int32_t nsec = 0;
  };
  std::filesystem::path address_;
  std::string ns_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Item> queue_;
  bool stopping_ = false;
  std::size_t dropped_ = 0;
  std::thread thread_;
};

}  // namespace nes::shim
