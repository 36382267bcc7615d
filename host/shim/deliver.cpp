#include "host/shim/deliver.hpp"

#include <memory>
#include <string>

#include <boost/asio/steady_timer.hpp>
#include <fmt/format.h>

namespace nes::shim {

bool not_ready_yet(const host::Error& e) {
  const std::string& m = e.message;
  return m.starts_with("no monitor at ") || m.find("the guest is not ready yet") != std::string::npos ||
         m.find("no booted session") != std::string::npos;
}

namespace {

struct Delivery : std::enable_shared_from_this<Delivery> {
  Delivery(boost::asio::io_context& io) : timer(io) {}
  boost::asio::steady_timer timer;
  std::filesystem::path control;
  cli::control::Request request;
  std::chrono::steady_clock::time_point start, deadline;
  std::function<bool()> still_wanted;
  std::function<void(host::Status)> done;

  void attempt() {
    if (!still_wanted()) return done(host::Error{"the task is no longer running"});
    host::Status r = cli::control_call(control, request, std::chrono::seconds(2));
    if (r || !not_ready_yet(r.error())) return done(std::move(r));
    const auto now = std::chrono::steady_clock::now();
    if (now >= deadline) {
      const double s = std::chrono::duration<double>(now - start).count();
      return done(host::Error{fmt::format("{} (still not ready after {:.1f} s)", r.error().message, s)});
    }
    timer.expires_after(std::chrono::milliseconds(20));
    timer.async_wait([self = shared_from_this()](boost::system::error_code ec) {
      if (!ec) self->attempt();
    });
  }
};

}  // namespace

void deliver_when_ready(boost::asio::io_context& io, std::filesystem::path control, cli::control::Request request,
                        std::chrono::milliseconds bound, std::function<bool()> still_wanted,
                        std::function<void(host::Status)> done) {
  auto d = std::make_shared<Delivery>(io);
  d->control = std::move(control);
  d->request = std::move(request);
  d->start = std::chrono::steady_clock::now();
  d->deadline = d->start + bound;
  d->still_wanted = std::move(still_wanted);
  d->done = std::move(done);
  d->attempt();
}

}  // namespace nes::shim
