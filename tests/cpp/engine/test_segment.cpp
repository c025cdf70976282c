// ShmSegment: names, permissions, exclusivity, unlinking, the stale sweep and the out-of-room error. Every test
// ends by checking that it left no name with this user's prefix in /dev/shm.
#include <catch2/catch.hpp>

#include <fcntl.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <string>

#include "shm_test_util.h"

namespace tunedist::test {
namespace {

using shm::ShmSegment;

bool shmExists(const std::string& name) {
  struct stat st {};
  return stat(("/dev/shm" + name).c_str(), &st) == 0;
}

// A segment made by hand (as a crashed rank would leave it): `name` starts with '/'. Returns the open fd.
int makeByHand(const std::string& name, mode_t mode, size_t bytes) {
  int fd = shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, mode);
  REQUIRE(fd >= 0);
  REQUIRE(fchmod(fd, mode) == 0);
  REQUIRE(ftruncate(fd, off_t(bytes)) == 0);
  return fd;
}

std::string handName(const char* tag) {
  return core::detail::str("/", ShmSegment::userPrefix(), tag, "_", getpid(), "_",
                           Clock::now().time_since_epoch().count());
}

}  // namespace

TEST_CASE("create makes a 0600 segment of ours under the user prefix, whatever the umask", "[shm][segment]") {
  ShmLeakCheck leaks;
  CHECK(ShmSegment::userPrefix() == core::detail::str("tunedist_", getuid(), "_"));
  const mode_t umaskValue = GENERATE(mode_t(0), mode_t(022), mode_t(0277));
  INFO("umask " << std::oct << umaskValue);
  const mode_t old = umask(umaskValue);
  {
    ShmSegment seg = ShmSegment::create("t", 8192, "/dev/shm");
    umask(old);
    REQUIRE(seg.valid());
    CHECK(seg.size() == 8192);
    CHECK(seg.name().rfind(core::detail::str("/", ShmSegment::userPrefix(), "t_"), 0) == 0);
    struct stat st {};
    REQUIRE(stat(("/dev/shm" + seg.name()).c_str(), &st) == 0);
    CHECK(S_ISREG(st.st_mode));
    CHECK((st.st_mode & 07777) == 0600);
    CHECK(st.st_uid == getuid());
    CHECK(size_t(st.st_size) == 8192);
    // The whole mapping is usable.
    std::memset(seg.data(), 0x5a, seg.size());
    CHECK(static_cast<unsigned char*>(seg.data())[8191] == 0x5a);
  }
  umask(old);
  CHECK(leaks.report() == "");
}

TEST_CASE("two creates never share a segment; open() maps the same one", "[shm][segment]") {
  ShmLeakCheck leaks;
  {
    ShmSegment a = ShmSegment::create("t", 4096, "/dev/shm");
    ShmSegment b = ShmSegment::create("t", 4096, "/dev/shm");
    CHECK(a.name() != b.name());
    std::memset(a.data(), 0xaa, 4096);
    CHECK(static_cast<unsigned char*>(b.data())[0] == 0);
    ShmSegment a2 = ShmSegment::open(a.name(), 4096);
    CHECK(a2.data() != a.data());
    CHECK(static_cast<unsigned char*>(a2.data())[4095] == 0xaa);
    static_cast<unsigned char*>(a2.data())[0] = 0x11;
    CHECK(static_cast<unsigned char*>(a.data())[0] == 0x11);
  }
  CHECK(leaks.report() == "");
}

TEST_CASE("open() refuses foreign names and foreign files", "[shm][segment]") {
  ShmLeakCheck leaks;
  CHECK_THROWS_WITH(ShmSegment::open("/not_tunedist", 4096), Catch::Contains("refusing"));
  CHECK_THROWS_WITH(ShmSegment::open(core::detail::str("/tunedist_", getuid() + 1, "_x"), 4096),
                    Catch::Contains("refusing"));
  CHECK_THROWS_AS(ShmSegment::open(ShmSegment::userPrefix(), 4096), core::Error);  // no leading '/'

  SECTION("a name that does not exist") {
    bool notFound = false;
    ShmSegment missing = ShmSegment::open(handName("missing"), 4096, &notFound);
    CHECK(notFound);
    CHECK_FALSE(missing.valid());
    CHECK_THROWS_AS(ShmSegment::open(handName("missing"), 4096), core::Error);
  }
  SECTION("a file with our prefix but a permissive mode") {
    const std::string name = handName("mode");
    int fd = makeByHand(name, 0644, 4096);
    CHECK_THROWS_WITH(ShmSegment::open(name, 4096), Catch::Contains("mode"));
    shm_unlink(name.c_str());
    close(fd);
  }
  SECTION("a file of the wrong size") {
    ShmSegment seg = ShmSegment::create("t", 4096, "/dev/shm");
    CHECK_THROWS_WITH(ShmSegment::open(seg.name(), 8192), Catch::Contains("size"));
  }
  CHECK(leaks.report() == "");
}

TEST_CASE("the name disappears after unlink() and after destruction, not after a move", "[shm][segment]") {
  ShmLeakCheck leaks;
  std::string name;
  {
    ShmSegment seg = ShmSegment::create("t", 4096, "/dev/shm");
    name = seg.name();
    REQUIRE(shmExists(name));
    seg.unlink();
    CHECK_FALSE(shmExists(name));
    seg.unlink();                                       // idempotent
    static_cast<unsigned char*>(seg.data())[4095] = 1;  // the mapping outlives the name
    CHECK(static_cast<unsigned char*>(seg.data())[4095] == 1);
  }
  {
    ShmSegment outer;
    {
      ShmSegment seg = ShmSegment::create("t", 4096, "/dev/shm");
      name = seg.name();
      outer = std::move(seg);
    }
    CHECK(shmExists(name));  // the moved-from segment must not unlink it
    CHECK(outer.name() == name);
  }
  CHECK_FALSE(shmExists(name));
  CHECK(leaks.report() == "");
}

TEST_CASE("sweepStale removes unlocked names and never one a live segment holds", "[shm][segment]") {
  ShmLeakCheck leaks;
  const std::string stale = handName("stale");
  close(makeByHand(stale, 0600, 4096));  // nobody holds it, as after a crash between create and unlink
  {
    ShmSegment live = ShmSegment::create("live", 4096, "/dev/shm");
    ShmSegment opened = ShmSegment::open(live.name(), 4096);
    const std::string lockedByHand = handName("locked");
    int fd = makeByHand(lockedByHand, 0600, 4096);
    REQUIRE(flock(fd, LOCK_SH) == 0);

    // Fresh names are left alone while they are younger than minAge.
    ShmSegment::sweepStale("/dev/shm", std::chrono::seconds(3600));
    CHECK(shmExists(stale));

    CHECK(ShmSegment::sweepStale("/dev/shm", std::chrono::seconds(0)) >= 1);
    CHECK_FALSE(shmExists(stale));
    CHECK(shmExists(live.name()));
    CHECK(shmExists(lockedByHand));
    shm_unlink(lockedByHand.c_str());
    close(fd);
  }
  shm_unlink(stale.c_str());  // only matters when the sweep failed
  CHECK(leaks.report() == "");
}

TEST_CASE("asking for more than /dev/shm holds fails clearly and leaves nothing behind", "[shm][segment]") {
  ShmLeakCheck leaks;
  struct statvfs vfs {};
  REQUIRE(statvfs("/dev/shm", &vfs) == 0);
  if (vfs.f_blocks == 0) {
    WARN("/dev/shm has no size limit here; nothing to test");
    return;
  }
  // More than the whole filesystem (hence more than is free): tmpfs refuses it up front, without first filling
  // the machine's memory the way a request between the free and the total size could.
  const size_t total = size_t(vfs.f_blocks) * size_t(vfs.f_frsize);
  const size_t bytes = total + (size_t(64) << 20);
  INFO("free " << size_t(vfs.f_bavail) * size_t(vfs.f_frsize) << " bytes, total " << total << ", asking " << bytes);
  std::string message;
  try {
    ShmSegment::create("t", bytes, "/dev/shm");
  } catch (const core::Error& e) {
    message = e.what();
  }
  CHECK_THAT(message, Catch::Contains("--shm-size") && Catch::Contains(std::to_string(bytes)));
  CHECK(leaks.report() == "");
}

}  // namespace tunedist::test
