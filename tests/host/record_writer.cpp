// Test helper: write one outcome record with host/lib/record.hpp, optionally stopping itself
// (SIGSTOP) right after a given step so a test can SIGKILL it there.
// usage: record_writer STATE VM GENERATION EXIT_CODE [STEP]
#include <signal.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "host/lib/record.hpp"

int main(int argc, char** argv) {
  if (argc < 5) {
    std::fprintf(stderr, "usage: record_writer STATE VM GENERATION EXIT_CODE [STEP]\n");
    return 2;
  }
  nes::host::Record r;
  r.vm = argv[2];
  r.generation = std::strtoull(argv[3], nullptr, 10);
  r.outcome = nes::proto::Outcome::exited;
  int code = std::atoi(argv[4]);
  r.exit_code = static_cast<std::uint8_t>(code);
  r.exit_status = code;
  r.reason = "written by record_writer generation " + std::string(argv[3]);
  r.started_at = r.finished_at = nes::host::wall_now();
  nes::host::WriteOptions o;
  if (argc > 5) {
    auto stop_at = nes::host::write_step_from_string(argv[5]);
    if (!stop_at) {
      std::fprintf(stderr, "record_writer: unknown step %s\n", argv[5]);
      return 2;
    }
    o.at_step = [s = *stop_at](nes::host::WriteStep step) {
      if (step == s) ::raise(SIGSTOP);  // the test SIGKILLs us here
      return 0;
    };
  }
  auto w = nes::host::write_record(argv[1], r, o);
  if (!w) {
    std::fprintf(stderr, "record_writer: %s\n", w.error().message.c_str());
    return 1;
  }
  return 0;
}
