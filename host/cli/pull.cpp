// `neshost pull`: an image from a registry into the store (host/image/pull.hpp), with docker's
// progress: per-layer bars on a terminal, one line per layer otherwise, the digest alone with -q.
// ^C (or SIGTERM) stops it in order: the transfers are aborted, no ref changes, the blobs already
// verified stay and the next pull reuses them.
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <fmt/format.h>

#include "host/cli/cli.hpp"
#include "host/cli/registry_flags.hpp"
#include "host/image/credentials.hpp"
#include "host/image/pull.hpp"

namespace nes::cli {
namespace {

namespace fs = std::filesystem;

constexpr std::string_view kPullHelp = R"(usage: neshost pull [--state DIR] [--platform OS/ARCH] [-q] [--cert-dir DIR] [--tls-verify=false] REF

Download image REF ([REGISTRY/]REPOSITORY[:TAG|@DIGEST], docker's names: `debian` is
docker.io/library/debian:latest) into the image store (STATE/.images, an OCI layout). Every blob's
size and digest are checked as it arrives; nothing unverified enters the store, and the ref is
set last. Several layers download at once; a layer already in the store is not downloaded again.
  --platform OS/ARCH[/VARIANT]  the image to take from a multi-platform index (default linux/amd64)
  -q, --quiet           print only the digest REF resolved to
  --cert-dir DIR        the registry's CA in DIR/*.crt (default: /etc/containers/certs.d/HOST:PORT/,
                        /etc/docker/certs.d/HOST:PORT/, then the system's CAs)
  --tls-verify=false    do not verify the registry's certificate (and allow plain HTTP)
  --state DIR           state directory (default as `neshost run`)
Credentials come from `neshost login` (STATE/.auth/config.json). Exit 125 on a failed pull (the
message names the registry and the reason), 130 when interrupted.
)";

std::atomic<bool> g_stop{false};
std::atomic<int> g_signal{0};

void on_signal(int sig) {
  g_signal.store(sig);
  g_stop.store(true);
}

/// docker's decimal sizes: "512B", "12.3kB", "4.56MB".
std::string human(std::uint64_t n) {
  if (n < 1000) return fmt::format("{}B", n);
  const char* units[] = {"kB", "MB", "GB", "TB"};
  double v = static_cast<double>(n);
  int u = -1;
  while (v >= 1000 && u < 3) {
    v /= 1000;
    ++u;
  }
  return fmt::format("{:.{}f}{}", v, v < 10 ? 2 : v < 100 ? 1 : 0, units[u]);
}

/// Progress on stdout: bars redrawn in place on a terminal (at most 10 times a second), one line
/// per finished blob otherwise.
struct Progress {
  std::FILE* out = stdout;  // run --pull: stderr (the workload's stdout stays its own)
  bool tty = false;
  std::vector<image::BlobEvent> blobs;
  std::chrono::steady_clock::time_point last{};
  bool drawn = false;

  static std::string id(const image::BlobEvent& e) { return e.digest.short_id(); }

  std::string line(const image::BlobEvent& e) const {
    switch (e.state) {
      case image::BlobState::present: return fmt::format("{}: Already exists", id(e));
      case image::BlobState::waiting: return fmt::format("{}: Waiting (another pull has it)", id(e));
      case image::BlobState::complete: return fmt::format("{}: Pull complete", id(e));
      case image::BlobState::downloading: {
        constexpr int kWidth = 40;
        int fill = e.size ? static_cast<int>(kWidth * e.done / e.size) : 0;
        std::string bar(static_cast<std::size_t>(fill), '=');
        if (fill < kWidth) bar += '>';
        bar.resize(kWidth, ' ');
        return fmt::format("{}: Downloading [{}] {}/{}", id(e), bar, human(e.done), human(e.size));
      }
    }
    return {};
  }

  void draw(bool force) {
    auto now = std::chrono::steady_clock::now();
    if (!force && now - last < std::chrono::milliseconds(100)) return;
    last = now;
    std::string text;
    if (drawn) text += fmt::format("\033[{}A", blobs.size());
    for (const auto& b : blobs) text += "\033[2K" + line(b) + "\n";
    drawn = true;
    std::fwrite(text.data(), 1, text.size(), out);
    std::fflush(out);
  }

  void plan(const std::vector<image::BlobEvent>& all) {
    blobs = all;
    if (tty) return draw(true);
    for (const auto& b : blobs)
      if (b.state == image::BlobState::present) fmt::print(out, "{}\n", line(b));
    std::fflush(out);
  }

  void update(const image::BlobEvent& e) {
    if (e.index >= blobs.size()) return;
    auto before = blobs[e.index].state;
    blobs[e.index] = e;
    if (tty) return draw(e.state != image::BlobState::downloading);
    if (e.state != before && e.state != image::BlobState::downloading) {
      fmt::print(out, "{}\n", e.state == image::BlobState::complete
                             ? fmt::format("{}: Pull complete ({})", id(e), human(e.size))
                             : line(e));
      std::fflush(out);
    }
  }
};

/// Pulls `ref` into the store under `state` with the credentials `neshost login` stored for its
/// registry; progress on `out` (docker's lines, or bars on a terminal; nullptr: none). ^C and
/// SIGTERM stop it (g_signal says which). Errors name the registry and the reason.
host::Result<image::PullResult> pull_with_progress(const fs::path& state, const image::Reference& ref,
                                                   image::PullOptions opt, std::FILE* out) {
  auto cred = image::load_credential(state, ref.registry);
  if (!cred) return cred.error();
  opt.credential = *cred;
  auto store = image::Store::open(state);
  if (!store) return store.error();
  Progress prog;
  if (out) {
    prog.out = out;
    prog.tty = ::isatty(::fileno(out));
    fmt::print(out, "{}: Pulling from {}\n", ref.digest ? ref.digest->str() : ref.tag, ref.familiar_name());
    std::fflush(out);
    opt.on_plan = [&](const std::vector<image::BlobEvent>& b) { prog.plan(b); };
    opt.on_blob = [&](const image::BlobEvent& e) { prog.update(e); };
  }
  // ^C / SIGTERM: the transfers stop within 200 ms, the store stays as it was plus verified blobs.
  struct sigaction sa {}, old_int {}, old_term {};
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  ::sigaction(SIGINT, &sa, &old_int);
  ::sigaction(SIGTERM, &sa, &old_term);
  opt.cancel = &g_stop;
  auto res = image::pull(*store, ref, opt);
  ::sigaction(SIGINT, &old_int, nullptr);
  ::sigaction(SIGTERM, &old_term, nullptr);
  if (out && prog.tty && prog.drawn) prog.draw(true);
  return res;
}

int pull_main(const Args& args) {
  static constexpr FlagSpec specs[] = {{"state", true}, {"platform", true}, {"quiet", false, "-q"}, kCertDirFlag,
                                       kTlsVerifyFlag};
  auto p = parse_flags(specs, args);
  if (!p) return usage_error("pull", p.error().message);
  if (p->help) {
    fmt::print("{}", kPullHelp);
    return 0;
  }
  if (p->positional.size() != 1) return usage_error("pull", "exactly one image reference is required");
  auto ref = image::parse_reference(p->positional[0]);
  if (!ref) return usage_error("pull", ref.error().message);
  image::PullOptions opt;
  if (auto pf = p->get("platform")) {
    auto plat = image::parse_platform(*pf);
    if (!plat) return usage_error("pull", "--platform: " + plat.error().message);
    opt.platform = plat->str();
  }
  auto tls = registry_tls(*p);
  if (!tls) return usage_error("pull", tls.error().message);
  opt.tls = *tls;
  const bool quiet = p->has("quiet");
  fs::path state = p->has("state") ? fs::path(*p->get("state")) : default_state_dir();

  auto res = pull_with_progress(state, *ref, opt, quiet ? nullptr : stdout);
  if (!res) {
    fmt::print(stderr, "neshost pull: {}\n", res.error().message);
    if (int sig = g_signal.load()) return 128 + sig;
    return 125;
  }
  if (quiet) {
    fmt::print("{}\n", res->resolved.str());
    return 0;
  }
  fmt::print("Digest: {}\n", res->resolved.str());
  fmt::print("Status: {} for {}\n", res->blobs_fetched ? "Downloaded newer image" : "Image is up to date",
             ref->familiar());
  fmt::print("{}\n", ref->str());
  return 0;
}

}  // namespace

host::Status pull_for_run(const fs::path& state, const image::Reference& ref) {
  fmt::print(stderr, "Unable to find image '{}' locally\n", ref.familiar());
  image::PullOptions opt;  // linux/amd64; the registry's CA from certs.d or the system's
  auto res = pull_with_progress(state, ref, opt, stderr);
  if (!res) return host::Error{"pull: " + res.error().message};
  fmt::print(stderr, "Digest: {}\nStatus: Downloaded newer image for {}\n", res->resolved.str(), ref.familiar());
  return host::Ok{};
}

const Registrar pull_reg{{"pull", "download an image from a registry into the image store", pull_main}};

}  // namespace nes::cli
