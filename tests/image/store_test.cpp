// The image store (host/image/store.hpp) on a real temp dir: verified ingest (size, digest, the
// disk's errors), nothing visible before commit, two writers of one blob, refs in index.json, GC.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <stdlib.h>

#include <cerrno>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <thread>

#include <fmt/format.h>

#include "tests/support/temp_dir.hpp"

#include "host/image/store.hpp"

using namespace nes::image;
namespace fs = std::filesystem;

namespace {

using nes::test::TempDir;  // tests/support/temp_dir.hpp

/// Every file under `dir` (relative path -> content), lock files aside (they are the store's
/// flock(2) files, never content): what "the store is unchanged" compares.
std::map<std::string, std::string> snapshot(const fs::path& dir) {
  std::map<std::string, std::string> out;
  for (auto& e : fs::recursive_directory_iterator(dir)) {
    std::string rel = fs::relative(e.path(), dir).string();
    if (e.is_regular_file() && rel.find("lock") == std::string::npos) {
      std::ifstream f(e.path(), std::ios::binary);
      std::stringstream ss;
      ss << f.rdbuf();
      out[rel] = ss.str();
    } else if (e.is_directory()) {
      out[rel + "/"] = "";
    }
  }
  return out;
}

size_t ingest_files(const Store& s) {
  size_t n = 0;
  for (auto& e : fs::directory_iterator(s.root() / "ingest"))
    if (e.path().extension() != ".lock") ++n;
  return n;
}

Digest put(Store& s, std::string_view data) {
  Digest d = sha256_of(data);
  auto w = s.begin_blob(d, data.size());
  REQUIRE(w.ok());
  REQUIRE(w->write(data).ok());
  auto c = w->commit();
  REQUIRE(c.ok());
  return *c;
}

Descriptor manifest_for(Store& s, std::string_view tag) {
  Digest cfg = put(s, fmt::format(R"({{"architecture":"amd64","os":"linux","rootfs":{{"type":"layers","diff_ids":[]}},"tag":"{}"}})", tag));
  Digest layer = put(s, fmt::format("layer of {}", tag));
  std::string m = fmt::format(R"({{"schemaVersion":2,"mediaType":"{}","config":{{"mediaType":"{}","digest":"{}","size":{}}},"layers":[{{"mediaType":"{}","digest":"{}","size":{}}}]}})",
                              media::kOciManifest, media::kOciConfig, cfg.str(), s.read_blob(cfg, 1 << 20)->size(),
                              media::kOciLayer, layer.str(), s.read_blob(layer, 1 << 20)->size());
  Digest md = put(s, m);
  return Descriptor{std::string(media::kOciManifest), md, m.size(), {}, {}};
}

}  // namespace

TEST_CASE("a fresh store is an OCI layout") {
  TempDir t;
  auto s = Store::open(t.path);
  REQUIRE(s.ok());
  CHECK(fs::is_regular_file(t.path / ".images/oci-layout"));
  CHECK(fs::is_directory(t.path / ".images/blobs/sha256"));
  CHECK(s->refs()->empty());
  auto again = Store::open(t.path);
  REQUIRE(again.ok());
  fs::remove(t.path / ".images/oci-layout");
  std::ofstream(t.path / ".images/oci-layout") << "{}";
  CHECK(Store::open(t.path).error().message.find("oci-layout has no imageLayoutVersion") != std::string::npos);
}

TEST_CASE("ingest: only a verified blob becomes visible") {
  TempDir t;
  auto s = Store::open(t.path);
  REQUIRE(s.ok());
  const std::string data = "hello blob";
  const Digest d = sha256_of(data);

  SUBCASE("good") {
    auto w = s->begin_blob(d, data.size());
    REQUIRE(w.ok());
    CHECK(!w->present());
    REQUIRE(w->write(data.substr(0, 3)).ok());
    CHECK(!s->has_blob(d));  // nothing visible before commit
    REQUIRE(w->write(data.substr(3)).ok());
    CHECK(w->commit().ok());
    CHECK(s->has_blob(d));
    CHECK(*s->read_blob(d, 100) == data);
    CHECK(!s->read_blob(d, 5).ok());
    // a second writer of a present blob is a no-op success
    auto w2 = s->begin_blob(d, data.size());
    REQUIRE(w2.ok());
    CHECK(w2->present());
    CHECK(w2->commit().ok());
  }
  SUBCASE("wrong digest") {
    auto before = snapshot(s->root());
    Digest other = sha256_of("something else");
    auto w = s->begin_blob(other, data.size());
    REQUIRE(w->write(data).ok());
    auto c = w->commit();
    REQUIRE(!c.ok());
    CHECK(c.error().message == fmt::format("blob {}: digest mismatch: the 10 bytes received hash to {}", other.str(), d.str()));
    CHECK(!s->has_blob(other));
    CHECK(!s->has_blob(d));
    CHECK(snapshot(s->root()) == before);
  }
  SUBCASE("short, and too long") {
    auto before = snapshot(s->root());
    {
      auto w = s->begin_blob(d, data.size());
      REQUIRE(w->write(data.substr(0, 4)).ok());
      auto c = w->commit();
      CHECK(c.error().message == fmt::format("blob {}: size mismatch: expected 10 bytes, got 4", d.str()));
    }
    {
      auto w = s->begin_blob(d, 4);
      auto wr = w->write(data);
      CHECK(wr.error().message == fmt::format("blob {}: more than the expected 4 bytes", d.str()));
      CHECK(!w->commit().ok());
    }
    {
      auto w = s->begin_blob(d, data.size());
      REQUIRE(w->write(data.substr(0, 2)).ok());
      // destroyed without commit: an interrupted download
    }
    CHECK(!s->has_blob(d));
    CHECK(ingest_files(*s) == 0);
    CHECK(snapshot(s->root()) == before);
  }
  SUBCASE("altered on disk: read_blob says so") {
    put(*s, data);
    fs::permissions(s->blob_path(d), fs::perms::owner_write, fs::perm_options::add);
    std::ofstream(s->blob_path(d), std::ios::trunc) << "hello blub";
    CHECK(s->read_blob(d, 100).error().message.find("does not match its digest") != std::string::npos);
  }
}

TEST_CASE("ingest: a blob larger than a write piece, in uneven writes, lands whole") {
  // 2.5 write pieces of a pseudo-random pattern, fed as a download does (odd sizes, one write
  // larger than a piece, one that ends exactly on a piece's edge), committed without the
  // directory fsync (a pull's way), then the directory fsynced once.
  TempDir t;
  auto s = Store::open(t.path);
  REQUIRE(s.ok());
  const std::size_t piece = BlobWriter::kWriteChunk;
  std::string data(piece * 5 / 2, '\0');
  std::uint32_t x = 2463534242u;
  for (auto& c : data) {
    x ^= x << 13, x ^= x >> 17, x ^= x << 5;
    c = static_cast<char>(x);
  }
  Digest d = sha256_of(data);
  auto w = s->begin_blob(d, data.size());
  REQUIRE(w.ok());
  const std::size_t cuts[] = {1, 16383, piece - 16384, piece + 7, 100000};  // the rest after
  std::size_t at = 0;
  for (std::size_t n : cuts) {
    REQUIRE(w->write(std::string_view(data).substr(at, n)).ok());
    at += n;
  }
  REQUIRE(w->write(std::string_view(data).substr(at)).ok());
  CHECK(w->written() == data.size());
  CHECK(!s->has_blob(d));
  auto c = w->commit(false);
  REQUIRE(c.ok());
  CHECK(*c == d);
  REQUIRE(s->sync_blobs().ok());
  auto back = s->read_blob(d, data.size());
  REQUIRE(back.ok());
  CHECK(back->size() == data.size());
  CHECK((*back == data));
  CHECK(ingest_files(*s) == 0);

  // One byte wrong in the middle piece: refused, nothing visible.
  std::string bad = data;
  bad[piece + 5] ^= 1;
  Digest d2 = sha256_of(std::string_view(data).substr(1));
  auto w2 = s->begin_blob(d2, bad.size());
  REQUIRE(w2.ok());
  REQUIRE(w2->write(bad).ok());
  CHECK(!w2->commit(false).ok());
  CHECK(!s->has_blob(d2));
}

TEST_CASE("two writers of one blob: the second waits for the first, or says busy") {
  TempDir t;
  auto s = Store::open(t.path);
  REQUIRE(s.ok());
  const std::string data(1 << 20, 'x');
  const Digest d = sha256_of(data);
  auto first = s->begin_blob(d, data.size());
  REQUIRE(first.ok());
  auto busy = s->begin_blob(d, data.size(), /*wait=*/false);
  REQUIRE(!busy.ok());
  CHECK(busy.error().err == EWOULDBLOCK);
  // A waiting second writer (another thread) gets in once the first committed, and finds it present.
  bool second_present = false;
  std::thread other([&] {
    auto second = s->begin_blob(d, data.size());
    REQUIRE(second.ok());
    second_present = second->present();
    CHECK(second->commit().ok());
  });
  REQUIRE(first->write(data).ok());
  REQUIRE(first->commit().ok());
  other.join();
  CHECK(second_present);
  CHECK(*s->read_blob(d, data.size()) == data);
}

TEST_CASE("refs in index.json, and GC") {
  TempDir t;
  auto s = Store::open(t.path);
  REQUIRE(s.ok());
  Descriptor a = manifest_for(*s, "a"), b = manifest_for(*s, "b");
  REQUIRE(s->set_ref("docker.io/library/a:latest", a).ok());
  REQUIRE(s->set_ref("docker.io/library/b:latest", b).ok());
  REQUIRE(s->set_ref("docker.io/library/b:v2", b).ok());
  auto r = s->refs();
  REQUIRE(r->size() == 3);
  CHECK((*r)[0].name == "docker.io/library/a:latest");
  CHECK((*r)[0].desc.digest == a.digest);
  // replacing a name keeps one entry
  REQUIRE(s->set_ref("docker.io/library/a:latest", b).ok());
  CHECK(s->refs()->size() == 3);
  CHECK(s->find_ref("docker.io/library/a:latest")->value().digest == b.digest);
  CHECK(!s->find_ref("nope")->has_value());
  // the index on disk carries the annotation skopeo and umoci read
  std::ifstream f(s->root() / "index.json");
  std::stringstream ss;
  ss << f.rdbuf();
  CHECK(ss.str().find(R"("org.opencontainers.image.ref.name":"docker.io/library/b:v2")") != std::string::npos);

  auto reach_a = s->reachable(a);
  REQUIRE(reach_a.ok());
  CHECK(reach_a->size() == 3);  // manifest, config, layer
  fs::create_directories(s->root() / "roots" / reach_a->at(1).hex / "rootfs");

  // a was renamed away: its manifest, config and layer are garbage, b's stay
  {
    auto hold = s->hold();
    REQUIRE(hold.ok());
    auto busy = s->gc();
    REQUIRE(!busy.ok());
    CHECK(busy.error().message.find("busy") != std::string::npos);
  }
  auto rep = s->gc();
  REQUIRE(rep.ok());
  CHECK(rep->blobs.size() == 3);
  CHECK(rep->roots.size() == 1);
  for (auto& d : *reach_a) CHECK(!s->has_blob(d));
  CHECK(s->has_blob(b.digest));
  CHECK(!fs::exists(s->root() / "roots" / reach_a->at(1).hex));

  CHECK(s->remove_ref("docker.io/library/b:v2").ok());
  CHECK(s->remove_ref("docker.io/library/b:v2").error().message == "no such image: docker.io/library/b:v2");
  CHECK(s->remove_ref("docker.io/library/a:latest").ok());
  CHECK(s->gc()->blobs.empty());  // b:latest still names them
  CHECK(s->remove_ref("docker.io/library/b:latest").ok());
  CHECK(s->gc()->blobs.size() == 3);
  CHECK(fs::is_empty(s->root() / "blobs/sha256"));
}
