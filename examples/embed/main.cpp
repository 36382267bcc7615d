// nes-embed: serve several microVMs' nesinit guests on Firecracker-style vsock sockets.
//   nes-embed DIR STATE VM[,VM...] -- ARGV...
// listens on DIR/<vm>.vsock_7000 for each VM, boots each guest with ARGV (env NES_VM=<vm>),
// prints "<vm> <outcome> <exit status>" per VM as each becomes durable in STATE, and exits once
// every VM is done: 0 if every workload exited 0, 1 otherwise, 2 on a usage or set-up error.
#include <cstdio>
#include <string>
#include <string_view>

#include <boost/asio/io_context.hpp>

#include "daemon.hpp"

int main(int argc, char** argv) {
  embed::Options o;
  int i = 1;
  for (; i < argc && std::string_view(argv[i]) != "--"; ++i) {
    if (o.dir.empty()) o.dir = argv[i];
    else if (o.state.empty()) o.state = argv[i];
    else {
      std::string list = argv[i];
      for (std::size_t p = 0, q; p <= list.size(); p = q + 1) {
        q = list.find(',', p);
        if (q == std::string::npos) q = list.size();
        if (q > p) o.vms.push_back(list.substr(p, q - p));
      }
    }
  }
  for (++i; i < argc; ++i) o.argv.push_back(argv[i]);
  if (o.state.empty() || o.vms.empty() || o.argv.empty()) {
    std::fprintf(stderr, "usage: nes-embed DIR STATE VM[,VM...] -- ARGV...\n");
    return 2;
  }
  boost::asio::io_context io;
  embed::Daemon d(io, o, [](const std::string& line) {
    std::printf("%s\n", line.c_str());
    std::fflush(stdout);
  });
  if (auto s = d.start(); !s) {
    std::fprintf(stderr, "nes-embed: %s\n", s.error().message.c_str());
    return 2;
  }
  for (const auto& vm : o.vms) std::printf("listening %s\n", d.socket_path(vm).c_str());
  std::fflush(stdout);
  while (!d.done() && io.run_one() > 0) {
  }
  return d.failures() ? 1 : 0;
}
