// core/files.h: outputs appear whole or not at all and never replace an input; inputs are
// regular files, opened without blocking.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "seqpar/core/error.h"
#include "seqpar/core/files.h"

namespace seqpar {
namespace {

namespace fs = std::filesystem;

class FilesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/seqpar-files-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    files::forget_inputs();
    files::guard_inputs(true);
  }
  void TearDown() override {
    files::guard_inputs(false);
    files::forget_inputs();
    fs::remove_all(dir_);
  }
  std::string path(const std::string& name) const { return dir_ + "/" + name; }
  static void put(const std::string& p, const std::string& text) { std::ofstream(p) << text; }
  static std::string get(const std::string& p) {
    std::ifstream f(p);
    std::stringstream ss;
    ss << f.rdbuf();
    return ss.str();
  }
  std::vector<std::string> listing() const {
    std::vector<std::string> names;
    for (const auto& e : fs::directory_iterator(dir_)) names.push_back(e.path().filename());
    std::sort(names.begin(), names.end());
    return names;
  }
  // The message of the InvalidArgument fn throws ("" if none).
  template <typename Fn>
  static std::string refusal(Fn&& fn) {
    try {
      fn();
    } catch (const InvalidArgument& e) {
      return e.what();
    }
    return "";
  }
  std::string dir_;
};

TEST_F(FilesTest, NothingAppearsBeforeCommit) {
  {
    files::AtomicOutput out("output", path("a.bin"));
    out.write("hello");
    EXPECT_EQ(listing(), std::vector<std::string>{}) << "the file shows before commit()";
    out.commit();
  }
  EXPECT_EQ(get(path("a.bin")), "hello");
  EXPECT_EQ(listing(), std::vector<std::string>{"a.bin"});
}

TEST_F(FilesTest, UncommittedLeavesNothingAndKeepsTheOldFile) {
  {
    files::AtomicOutput out("output", path("new.bin"));
    out.write("partial");
  }
  EXPECT_EQ(listing(), std::vector<std::string>{});
  put(path("old.bin"), "old");
  {
    files::AtomicOutput out("output", path("old.bin"));
    out.write("new but failed");
  }
  EXPECT_EQ(get(path("old.bin")), "old");
  EXPECT_EQ(listing(), std::vector<std::string>{"old.bin"});
}

TEST_F(FilesTest, CommitReplacesAndKeepsTheMode) {
  put(path("f"), "old");
  ASSERT_EQ(::chmod(path("f").c_str(), 0640), 0);
  files::write_atomically("output", path("f"), "new");
  EXPECT_EQ(get(path("f")), "new");
  struct stat st {};
  ASSERT_EQ(::stat(path("f").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0640u);
}

TEST_F(FilesTest, ASymbolicLinkIsFollowed) {
  put(path("target"), "old");
  fs::create_symlink(path("target"), path("link"));
  files::write_atomically("output", path("link"), "new");
  EXPECT_TRUE(fs::is_symlink(path("link")));
  EXPECT_EQ(get(path("target")), "new");
}

TEST_F(FilesTest, AnInputIsRefusedByEveryPath) {
  put(path("in"), "weights");
  fs::create_directory(path("sub"));
  const int fd = files::open_input("model", path("in"), "a file");
  ::close(fd);
  fs::create_symlink(path("in"), path("link"));
  fs::create_hard_link(path("in"), path("hard"));
  for (const std::string& p :
       {path("in"), path("sub/../in"), path("./in"), path("link"), path("hard")}) {
    const std::string why = refusal([&] { files::AtomicOutput out("output", p); });
    EXPECT_NE(why.find("output '" + p + "' is the input '" + path("in") + "' of this run"),
              std::string::npos)
        << p << ": " << why;
  }
  EXPECT_EQ(get(path("in")), "weights");
  // A file that is not an input is written.
  files::write_atomically("output", path("other"), "x");
  EXPECT_EQ(get(path("other")), "x");
}

TEST_F(FilesTest, WithoutTheGuardAnInputMayBeRewritten) {
  put(path("in"), "old");
  EXPECT_EQ(files::read_input("config", path("in"), "a file", 100), "old");
  files::guard_inputs(false);
  files::write_atomically("output", path("in"), "new");
  EXPECT_EQ(get(path("in")), "new");
}

TEST_F(FilesTest, AnInputReadAfterTheCheckIsRefusedAtCommit) {
  put(path("late"), "kept");
  files::AtomicOutput out("output", path("late"));
  out.write("replacement");
  EXPECT_EQ(files::read_input("config", path("late"), "a file", 100), "kept");
  EXPECT_NE(refusal([&] { out.commit(); }).find("is the input"), std::string::npos);
  EXPECT_EQ(get(path("late")), "kept");
}

TEST_F(FilesTest, TwoOutputsOfOneFileAreRefused) {
  files::AtomicOutput first("output", path("same"));
  EXPECT_NE(refusal([&] {
              files::AtomicOutput second("trace", path("./same"));
            }).find("trace '" + path("./same") + "' is also the file of output"),
            std::string::npos);
  first.commit();
  files::write_atomically("trace", path("same"), "after");  // the first one is done
}

TEST_F(FilesTest, NonRegularInputsAreRefusedWithoutBlocking) {
  ASSERT_EQ(::mkfifo(path("fifo").c_str(), 0600), 0);
  EXPECT_NE(refusal([&] { files::read_input("inputs", path("fifo"), "a safetensors file", 100); })
                .find("inputs '" + path("fifo") +
                      "' is a FIFO, not a regular file; give a safetensors file"),
            std::string::npos);
  EXPECT_NE(refusal([&] {
              files::read_input("config", dir_, "a JSON file", 100);
            }).find("is a directory, not a regular file"),
            std::string::npos);
  EXPECT_NE(refusal([&] {
              files::read_input("config", "/dev/zero", "a JSON file", 100);
            }).find("is a character device"),
            std::string::npos);
  EXPECT_NE(refusal([&] {
              files::read_input("config", path("none"), "a JSON file", 100);
            }).find("cannot open the file (No such file or directory)"),
            std::string::npos);
  EXPECT_NE(refusal([&] { files::read_input("", "", "a JSON file", 100); }).find("is empty"),
            std::string::npos);
}

TEST_F(FilesTest, ReadInputBoundsTheSize) {
  put(path("big"), std::string(101, 'x'));
  EXPECT_NE(refusal([&] {
              files::read_input("config", path("big"), "a file", 100);
            }).find("config '" + path("big") + "' is 101 bytes; at most 100"),
            std::string::npos);
  EXPECT_EQ(files::read_input("config", path("big"), "a file", 101).size(), 101u);
}

TEST_F(FilesTest, BadDestinations) {
  EXPECT_NE(refusal([&] { files::AtomicOutput out("output", ""); }).find("output is empty"),
            std::string::npos);
  EXPECT_NE(refusal([&] { files::AtomicOutput out("output", dir_); }).find("is a directory"),
            std::string::npos);
  try {
    files::AtomicOutput out("output", path("missing/x"));
    ADD_FAILURE() << "a missing folder was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("the folder '" + path("missing") + "' does not exist"),
              std::string::npos)
        << e.what();
  }
  try {  // a device is written in place; a full one fails on write or commit
    files::AtomicOutput out("output", "/dev/full");
    out.write("x");
    out.commit();
    ADD_FAILURE() << "/dev/full took the write";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("output '/dev/full': cannot write"), std::string::npos)
        << e.what();
  }
  files::write_atomically("output", "/dev/null", "discarded");
  EXPECT_EQ(listing(), std::vector<std::string>{});
}

}  // namespace
}  // namespace seqpar
