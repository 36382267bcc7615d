// Image references (host/image/reference.hpp) against docker's normalisation rules, and digests.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include "host/image/digest.hpp"
#include "host/image/reference.hpp"

using namespace nes::image;

namespace {
const std::string kHex = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";
}

TEST_CASE("docker's normalisation") {
  struct Case { const char* in; const char* registry; const char* repo; const char* tag; const char* str; const char* familiar; };
  const Case cases[] = {
      {"debian", "docker.io", "library/debian", "latest", "docker.io/library/debian:latest", "debian:latest"},
      {"debian:12", "docker.io", "library/debian", "12", "docker.io/library/debian:12", "debian:12"},
      {"user/app", "docker.io", "user/app", "latest", "docker.io/user/app:latest", "user/app:latest"},
      {"index.docker.io/library/busybox:1.36", "docker.io", "library/busybox", "1.36", "docker.io/library/busybox:1.36", "busybox:1.36"},
      {"localhost/app", "localhost", "app", "latest", "localhost/app:latest", "localhost/app:latest"},
      {"localhost:5000/a/b:v1", "localhost:5000", "a/b", "v1", "localhost:5000/a/b:v1", "localhost:5000/a/b:v1"},
      {"127.0.0.1:5000/x", "127.0.0.1:5000", "x", "latest", "127.0.0.1:5000/x:latest", "127.0.0.1:5000/x:latest"},
      {"quay.io/a-b/c__d.e", "quay.io", "a-b/c__d.e", "latest", "quay.io/a-b/c__d.e:latest", "quay.io/a-b/c__d.e:latest"},
      {"[::1]:5000/x:t", "[::1]:5000", "x", "t", "[::1]:5000/x:t", "[::1]:5000/x:t"},
  };
  for (const auto& c : cases) {
    CAPTURE(c.in);
    auto r = parse_reference(c.in);
    REQUIRE(r.ok());
    CHECK(r->registry == c.registry);
    CHECK(r->repository == c.repo);
    CHECK(r->tag == c.tag);
    CHECK(!r->digest);
    CHECK(r->str() == c.str);
    CHECK(r->familiar() == c.familiar);
    auto again = parse_reference(r->str());
    REQUIRE(again.ok());
    CHECK(*again == *r);
  }
  CHECK(parse_reference("debian")->api_host() == "registry-1.docker.io");
  CHECK(parse_reference("localhost:5000/x")->api_host() == "localhost:5000");
}

TEST_CASE("digests: alone, and beside a tag") {
  auto r = parse_reference("busybox@sha256:" + kHex);
  REQUIRE(r.ok());
  CHECK(r->tag.empty());
  REQUIRE(r->digest);
  CHECK(r->digest->hex == kHex);
  CHECK(r->str() == "docker.io/library/busybox@sha256:" + kHex);
  auto both = parse_reference("reg.example:443/a/b:v2@sha256:" + kHex);
  REQUIRE(both.ok());
  CHECK(both->tag == "v2");
  CHECK(both->str() == "reg.example:443/a/b:v2@sha256:" + kHex);
}

TEST_CASE("bad references: each names what is wrong") {
  struct Case { std::string in, says; };
  const Case cases[] = {
      {"", "empty reference"},
      {"Debian", "must be lowercase"},
      {"docker.io/Library/x", "must be lowercase"},
      {"a//b", "path component ''"},
      {"a/-b", "path component '-b'"},
      {"a:", "tag ''"},
      {"a:-x", "tag '-x'"},
      {"a:" + std::string(129, 'x'), "tag"},
      {"a@sha256:abc", "digest"},
      {"a@md5:" + kHex, "digest"},
      {kHex, "image ID"},
      {"bad_host:5000/x", "registry 'bad_host:5000'"},
      {"reg:/x", "registry 'reg:'"},
      {"a/b.", "path component 'b.'"},
  };
  for (const auto& c : cases) {
    CAPTURE(c.in);
    auto r = parse_reference(c.in);
    REQUIRE(!r.ok());
    CHECK(r.error().message.find("invalid reference format") == 0);
    CHECK(r.error().message.find(c.says) != std::string::npos);
  }
}

TEST_CASE("Digest and Sha256") {
  CHECK(sha256_of("").hex == kHex);
  nes::vm::Sha256 h;
  h.update("hello ");
  h.update("world");
  CHECK(sha256_digest(h).str() == "sha256:b94d27b9934d3e08a52e52d7da7dabfac484efe37a5380ee9088f7ace2efcde9");
  CHECK(sha256_digest(h) == sha256_digest(h));
  CHECK(Digest::parse("sha256:" + kHex)->hex == kHex);
  CHECK(Digest::parse("sha256:" + kHex)->short_id() == "e3b0c44298fc");
  CHECK(!Digest::parse("sha256:" + kHex.substr(1)).ok());
  CHECK(!Digest::parse("sha256:" + std::string(64, 'A')).ok());
  CHECK(!Digest::parse("sha512:" + kHex).ok());
  CHECK(Digest::parse("nope").error().message == "digest 'nope': expected sha256:<64 lowercase hex digits>");
  CHECK(!Digest::from_hex("zz").ok());
}
