// The image store: an OCI image layout (image-spec image-layout.md) under STATE/.images/, so that
// skopeo (`oci:STATE/.images:REF`) and umoci read and write it too (docs/images.md "The store"):
//
//   STATE/.images/oci-layout        {"imageLayoutVersion":"1.0.0"}
//   STATE/.images/index.json        the refs: one descriptor per ref, named by the annotation
//                                  org.opencontainers.image.ref.name (Reference::str() form)
//   STATE/.images/blobs/sha256/HEX  every blob, its name its verified SHA-256
//   STATE/.images/ingest/           blobs being written (O_TMPFILE: nothing left by a crash) and
//                                  the per-digest lock files that make two writers of one blob wait
//   STATE/.images/roots/CONFIGHEX/  unpacked roots (host/image/unpack.hpp), one per image config
//   STATE/.images/lock, gc.lock     flock(2) files: index.json updates; writers (shared) vs GC
//
// Nothing unverified is ever visible: a blob appears in blobs/ only after its size and digest
// matched what the writer expected (BlobWriter), index.json is replaced by temp + fsync + rename.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "host/image/digest.hpp"
#include "host/image/manifest.hpp"

namespace nes::image {

/// An flock(2) held until destroyed (or moved from).
class Lock {
 public:
  Lock() = default;
  explicit Lock(host::Fd fd) : fd_(std::move(fd)) {}
  bool held() const { return bool(fd_); }
  /// The lock's fd (still locked), handed over; the Lock holds nothing after.
  host::Fd take() { return std::move(fd_); }

 private:
  host::Fd fd_;
};

/// One blob being written into the store. Made by Store::begin_blob(); write() the bytes, then
/// commit(). Destroyed without a commit (an error, an interrupted download) it leaves nothing.
class BlobWriter {
 public:
  BlobWriter(BlobWriter&&) noexcept = default;
  BlobWriter& operator=(BlobWriter&&) noexcept = default;
  ~BlobWriter() = default;
  /// Appends bytes (hashed now, written to the file in kWriteChunk pieces, each handed to the
  /// kernel's writeback at once: sync_file_range(2), so the commit's fsync waits for the last
  /// piece only, not the whole blob). Fails (naming the digest) once more than the expected size
  /// arrived, or on a write error (ENOSPC: the disk is full); the writer is then spent.
  Status write(std::span<const std::byte> bytes);
  Status write(std::string_view s) { return write(std::as_bytes(std::span(s.data(), s.size()))); }
  /// Checks size and digest against the expected ones, fsyncs, and links the blob into
  /// blobs/sha256/, whose directory is fsynced too unless `sync_dir` is false: a caller
  /// committing several blobs then calls Store::sync_blobs() once before a ref names them (a
  /// pull: one directory fsync instead of one per blob). A blob already present (present(), or
  /// written meanwhile by another writer) is a success. Errors name the digest, what was
  /// expected and what came.
  Result<Digest> commit(bool sync_dir = true);
  /// The blob was already in the store when this writer began: write() discards, commit() is a no-op.
  bool present() const { return present_; }
  /// Bytes accepted so far.
  std::uint64_t written() const { return written_; }
  const Digest& expected() const { return expected_; }
  /// Bytes gathered per write(2) to the file: 4100 16 KiB TLS records of a 67 MB layer become
  /// 67 writes, and each MiB starts its writeback while the next arrives.
  static constexpr std::size_t kWriteChunk = 1u << 20;

 private:
  friend class Store;
  BlobWriter() = default;
  std::filesystem::path root_;
  Digest expected_;
  std::uint64_t expected_size_ = 0, written_ = 0;
  host::Fd file_, lock_;  // the O_TMPFILE, and the per-digest lock (ingest/HEX.lock)
  std::unique_ptr<vm::Sha256> hash_;
  std::vector<std::byte> buf_;     // bytes hashed, not yet written (< kWriteChunk)
  std::uint64_t in_file_ = 0;      // bytes written to file_ (and handed to writeback)
  Status flush();                  // buf_ -> put()
  Status put(std::span<const std::byte> piece);  // write(2), then sync_file_range(SYNC_FILE_RANGE_WRITE)
  bool present_ = false, failed_ = false;
};

/// A ref of the store: its name (the annotation; "" for a descriptor without one) and descriptor.
struct StoreRef {
  std::string name;
  Descriptor desc;
};

/// What Store::gc removed.
struct GcReport {
  std::vector<Digest> blobs;    // removed blobs
  std::vector<std::string> roots;  // removed unpacked roots (config hex)
  std::uint64_t bytes = 0;      // blob bytes freed
};

/// The store under STATE/.images (see the file comment).
class Store {
 public:
  /// Whether STATE/.images holds a store (its index.json): what a reader that must not create
  /// one checks first (`run sh` is not an image run and leaves the state dir as it was).
  static bool exists(const std::filesystem::path& state_dir);
  /// Opens (and on first use creates) STATE/.images. Errors name the path.
  static Result<Store> open(const std::filesystem::path& state_dir);
  const std::filesystem::path& root() const { return root_; }
  std::filesystem::path blob_path(const Digest& d) const { return root_ / "blobs/sha256" / d.hex; }
  /// The unpacked root of the image whose config is `config`: roots/HEX/rootfs.
  std::filesystem::path root_path(const Digest& config) const { return root_ / "roots" / config.hex / "rootfs"; }

  /// Starts writing the blob `expected` of `expected_size` bytes. With another writer of the same
  /// digest active, waits for it (`wait`) or fails at once with err EWOULDBLOCK (!wait: a loop
  /// that multiplexes many downloads in one thread must not block). Present already: the writer is
  /// present() and discards what it is given.
  Result<BlobWriter> begin_blob(const Digest& expected, std::uint64_t expected_size, bool wait = true);
  bool has_blob(const Digest& d) const;
  /// fsyncs blobs/sha256 (the links of blobs committed with commit(false)); what a writer calls
  /// before a ref names its blobs. Errors name the directory.
  Status sync_blobs() const;
  /// The blob's bytes, at most `max` (an error beyond), digest checked again.
  Result<std::string> read_blob(const Digest& d, std::uint64_t max) const;
  /// The blob opened read-only (streamed by the unpacker, which checks the digest as it reads).
  Result<host::Fd> open_blob(const Digest& d) const;

  /// Names `desc` (a manifest or index) `name` in index.json, replacing that name's descriptor.
  Status set_ref(std::string_view name, const Descriptor& desc);
  /// Removes ref `name`; an error naming it when there is none.
  Status remove_ref(std::string_view name);
  /// Every descriptor of index.json, in its order.
  Result<std::vector<StoreRef>> refs() const;
  /// Ref `name`'s descriptor, or nullopt.
  Result<std::optional<Descriptor>> find_ref(std::string_view name) const;

  /// A shared hold that keeps gc() away while a writer ingests blobs not yet named by a ref
  /// (take it before begin_blob, drop it after set_ref). Blocks while a gc() runs (bounded: gc
  /// never waits on anything).
  Result<Lock> hold() const;
  /// Removes every blob not reachable from index.json (through indexes, manifests, configs and
  /// layers), every unpacked root whose config is unreachable and not in `keep_roots`, and stale
  /// ingest lock files. Refused ("the store is busy") while a writer holds the store (hold()).
  Result<GcReport> gc(const std::set<Digest>& keep_roots = {});
  /// The blob digests reachable from `desc` (itself, and for a manifest its config and layers;
  /// for an index each manifest's). Missing blobs are skipped (a partial image), errors only for
  /// documents that do not parse.
  Result<std::vector<Digest>> reachable(const Descriptor& desc) const;

 private:
  explicit Store(std::filesystem::path root) : root_(std::move(root)) {}
  Result<Lock> lock_index() const;
  Result<std::vector<Descriptor>> read_index() const;
  Status write_index(const std::vector<Descriptor>& manifests) const;
  std::filesystem::path root_;
};

/// Writes `data` to `path` durably: a temp beside it, fsync, rename, fsync of the directory
/// (unless `sync_dir` is false: the caller fsyncs the directory once after several files).
Status write_file_durable(const std::filesystem::path& path, std::string_view data, unsigned mode = 0644,
                          bool sync_dir = true);

}  // namespace nes::image
