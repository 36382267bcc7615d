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
  std::function<Attempt()> attempt;
  std::chrono::steady_clock::time_point start, deadline;
  std::function<bool()> still_wanted;
  std::function<void(host::Status, Delivered)> done;

  void next() {
    if (!still_wanted()) return done(host::Error{"the task is no longer running"}, Delivered::unwanted);
    Attempt a = attempt();
    if (!a.again) return done(std::move(a.status), Delivered::answered);
    const auto now = std::chrono::steady_clock::now();
    if (now >= deadline) {
      const double s = std::chrono::duration<double>(now - start).count();
      const std::string why = a.status ? std::string("not ready") : a.status.error().message;
      return done(host::Error{fmt::format("{} (still not ready after {:.1f} s)", why, s)}, Delivered::gave_up);
    }
    timer.expires_after(std::chrono::milliseconds(20));
    timer.async_wait([self = shared_from_this()](boost::system::error_code ec) {
      if (!ec) self->next();
    });
  }
};

}  // namespace

void retry_when_ready(boost::asio::io_context& io, std::function<Attempt()> attempt, std::chrono::milliseconds bound,
                      std::function<bool()> still_wanted, std::function<void(host::Status, Delivered)> done) {
  auto d = std::make_shared<Delivery>(io);
  d->attempt = std::move(attempt);
  d->start = std::chrono::steady_clock::now();
  d->deadline = d->start + bound;
  d->still_wanted = std::move(still_wanted);
  d->done = std::move(done);
  d->next();
}

Attempt control_attempt(const std::filesystem::path& control, const cli::control::Targeted& request) {
  std::error_code ec;
  if (!std::filesystem::exists(control, ec))
    return Attempt{true, host::Error{fmt::format("no monitor at {} yet", control.string())}};
  auto reply = cli::control_request(control, request, std::chrono::seconds(2));
  if (!reply) return Attempt{true, reply.error()};
  if (!std::holds_alternative<cli::control::Ok>(*reply)) return Attempt{false, host::Error{cli::control::encode(*reply)}};
  return Attempt{};
}

void deliver_when_ready(boost::asio::io_context& io, std::filesystem::path control, cli::control::Targeted request,
                        std::chrono::milliseconds bound, std::function<bool()> still_wanted,
                        std::function<void(host::Status)> done) {
  retry_when_ready(
      io,
      [control = std::move(control), request = std::move(request)] {
        host::Status r = cli::control_call(control, request, std::chrono::seconds(2));
        return Attempt{!r && not_ready_yet(r.error()), std::move(r)};
      },
      bound, std::move(still_wanted), [done = std::move(done)](host::Status st, Delivered) { done(std::move(st)); });
}

Attempt control_attempt(const std::filesystem::path& control, const cli::control::Request& request) {
  return control_attempt(control, cli::control::Targeted{std::nullopt, request, std::nullopt});
}

void deliver_when_ready(boost::asio::io_context& io, std::filesystem::path control, cli::control::Request request,
                        std::chrono::milliseconds bound, std::function<bool()> still_wanted,
                        std::function<void(host::Status)> done) {
  deliver_when_ready(io, std::move(control), cli::control::Targeted{std::nullopt, std::move(request), std::nullopt}, bound,
                     std::move(still_wanted), std::move(done));
}

}  // namespace nes::shim
