// FileRendezvous: a Rendezvous in a temporary directory, for ranks in separate (forked) processes.
#pragma once

#include <dirent.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>

#include "core/error.h"
#include "core/rendezvous.h"

namespace tunedist::test {

// A rendezvous in a directory, for ranks in separate (forked) processes.
class FileRendezvous final : public core::Rendezvous {
 public:
  FileRendezvous() {
    char tmpl[] = "/tmp/tunedist_p2p_test_XXXXXX";
    TD_CHECK(mkdtemp(tmpl) != nullptr, "mkdtemp failed");
    dir_ = tmpl;
  }
  ~FileRendezvous() override {
    // Every key, including those a forked child set.
    if (DIR* dir = opendir(dir_.c_str())) {
      while (struct dirent* ent = readdir(dir)) {
        if (ent->d_name[0] != '.') {
          std::remove((dir_ + "/" + ent->d_name).c_str());
        }
      }
      closedir(dir);
    }
    rmdir(dir_.c_str());
  }
  void set(const std::string& key, const std::string& value) override {
    std::string path = dir_ + "/" + key;
    std::ofstream(path + ".tmp") << value;
    TD_CHECK(std::rename((path + ".tmp").c_str(), path.c_str()) == 0, "rename failed");
  }
  std::string get(const std::string& key, std::chrono::milliseconds timeout) override {
    auto until = std::chrono::steady_clock::now() + timeout;
    while (!check(key)) {
      TD_CHECK(std::chrono::steady_clock::now() < until, "FileRendezvous: key ", key, " not set in time");
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    std::ifstream in(dir_ + "/" + key);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
  }
  bool check(const std::string& key) override {
    struct stat st {};
    return stat((dir_ + "/" + key).c_str(), &st) == 0;
  }

 private:
  std::string dir_;
};

}  // namespace tunedist::test
