// A moto_server child process for the S3 upload tests: an S3 and IAM look-alike on a free loopback port that
// checks SigV4 signatures, started with one IAM user, that user's access key and one bucket. When moto_server
// or the aws CLI is not on PATH, start() returns nullptr and says why, so the test can skip with the reason; a
// server that is installed but does not come up throws, so the test fails instead of silently passing.
//
//   std::string skip;
//   std::unique_ptr<cohort::testing::MotoServer> moto = cohort::testing::MotoServer::start(&skip);
//   if (!moto) GTEST_SKIP() << skip;
//   // upload to moto->endpoint() with moto->access_key() / moto->secret_key() into s3://<moto->bucket()>/...
//   auto got = moto->get_object("runs/model.bin");  // got.ok, got.out (the object's bytes), got.error
//   moto.reset();                                   // stops the server and removes its scratch directory
//
// Header-only, so that the unit tests and the process tests both use it without another library.
#pragma once

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

namespace cohort::testing {

// The executable `name` found on PATH, or "" when there is none.
inline std::string find_on_path(const std::string& name) {
  const char* path = std::getenv("PATH");
  std::stringstream ss(path ? path : "");
  for (std::string dir; std::getline(ss, dir, ':');) {
    const std::filesystem::path p = std::filesystem::path(dir.empty() ? "." : dir) / name;
    if (::access(p.c_str(), X_OK) == 0) return p.string();
  }
  return "";
}

namespace moto_detail {

inline std::string read_file(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

inline sockaddr_in loopback(int port) {
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  return addr;
}

// A port nobody listens on right now (port 0 asks the kernel for one).
inline int free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr = loopback(0);
  socklen_t len = sizeof(addr);
  ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  ::close(fd);
  return ntohs(addr.sin_port);
}

}  // namespace moto_detail

class MotoServer {
 public:
  struct AwsResult {
    bool ok = false;
    std::string out;    // stdout of the aws CLI (for get_object, the object's bytes)
    std::string error;  // the command and its stderr, when !ok
  };

  // Starts moto_server and creates the user, its key and `bucket`. Returns nullptr with *skip_reason set when
  // moto_server or aws is not on PATH; throws std::runtime_error (with moto's log) when the server fails.
  static std::unique_ptr<MotoServer> start(std::string* skip_reason, const std::string& bucket = "cohort-test") {
    const std::string moto = find_on_path("moto_server"), aws = find_on_path("aws");
    if (moto.empty() || aws.empty()) {
      *skip_reason = "moto_server or the aws CLI is not on PATH (pip install 'moto[server]' awscli to run these tests)";
      return nullptr;
    }
    // From here on the destructor cleans up whatever was started, also when a step below throws.
    std::unique_ptr<MotoServer> server(new MotoServer(moto, aws, bucket));
    server->launch();
    server->create_user_and_bucket();
    return server;
  }

  ~MotoServer() {
    if (pid_ > 0) {
      ::kill(-pid_, SIGTERM);  // the whole process group: the pyenv shim and the python server
      int status = 0;
      bool gone = false;
      for (int i = 0; i < 100 && !gone; ++i) {  // at most 5 s, then SIGKILL
        gone = ::waitpid(pid_, &status, WNOHANG) == pid_;
        if (!gone) std::this_thread::sleep_for(std::chrono::milliseconds(50));
      }
      ::kill(-pid_, SIGKILL);
      if (!gone) ::waitpid(pid_, &status, 0);
    }
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
  MotoServer(const MotoServer&) = delete;
  MotoServer& operator=(const MotoServer&) = delete;

  std::string endpoint() const { return "http://127.0.0.1:" + std::to_string(port_); }
  const std::string& bucket() const { return bucket_; }
  const std::string& access_key() const { return access_key_; }
  const std::string& secret_key() const { return secret_key_; }
  // A scratch directory for the test's files; removed with the server.
  const std::filesystem::path& dir() const { return dir_; }

  // Runs `aws --endpoint-url <endpoint> <args>` (a shell command line) with the user's key, isolated from
  // the caller's AWS profile, config and endpoint variables. Bounded at 60 s.
  AwsResult aws(const std::string& args) const {
    // Before the key exists the credentials are not checked (see kUnauthenticatedCalls), but must be present.
    const std::string ak = access_key_.empty() ? "dummy" : access_key_;
    const std::string sk = secret_key_.empty() ? "dummy" : secret_key_;
    const std::string log = (dir_ / "aws.log").string();
    const std::string cmd =
        "env -u AWS_PROFILE -u AWS_SESSION_TOKEN -u AWS_ENDPOINT_URL -u AWS_ENDPOINT_URL_S3 AWS_ACCESS_KEY_ID=" + ak +
        " AWS_SECRET_ACCESS_KEY=" + sk +
        " AWS_DEFAULT_REGION=us-east-1 AWS_CONFIG_FILE=/dev/null AWS_SHARED_CREDENTIALS_FILE=/dev/null timeout 60 '" +
        aws_ + "' --endpoint-url " + endpoint() + " " + args + " 2>" + log;
    AwsResult r;
    FILE* p = ::popen(cmd.c_str(), "r");
    if (!p) {
      r.error = "popen failed for: " + cmd;
      return r;
    }
    char buf[4096];
    for (size_t n; (n = std::fread(buf, 1, sizeof(buf), p)) > 0;) r.out.append(buf, n);
    const int status = ::pclose(p);
    r.ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
    if (!r.ok)
      r.error = "aws " + args + " failed (status " + std::to_string(status) + "): " + moto_detail::read_file(log);
    return r;
  }

  // The object as moto stores it, read back with the aws CLI: `out` holds its bytes when `ok`.
  AwsResult get_object(const std::string& key) const {
    const std::filesystem::path file = dir_ / "readback.bin";
    std::filesystem::remove(file);
    AwsResult r = aws("s3api get-object --bucket " + bucket_ + " --key '" + key + "' '" + file.string() + "'");
    r.out = r.ok ? moto_detail::read_file(file) : "";
    return r;
  }

 private:
  // moto authenticates nothing for its first INITIAL_NO_AUTH_ACTION_COUNT requests: create_user_and_bucket
  // spends exactly those on create-user, put-user-policy (moto denies S3 actions to a user without a policy),
  // create-access-key and create-bucket. With 3, create-bucket is refused; with 4, the next request is
  // checked (found by trying, moto 5.2).
  static constexpr int kUnauthenticatedCalls = 4;

  MotoServer(std::string moto, std::string aws, std::string bucket)
      : moto_(std::move(moto)), aws_(std::move(aws)), bucket_(std::move(bucket)) {
    static int counter = 0;
    dir_ = std::filesystem::temp_directory_path() /
           ("cohort_moto_" + std::to_string(::getpid()) + "_" + std::to_string(counter++));
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
    port_ = moto_detail::free_port();
  }

  void launch() {
    const std::string log = (dir_ / "moto.log").string();
    const std::string port = std::to_string(port_);
    // env(1) sets the count for moto alone; the argv strings live until execv in the child.
    std::vector<std::string> args{"/usr/bin/env",
                                  "INITIAL_NO_AUTH_ACTION_COUNT=" + std::to_string(kUnauthenticatedCalls),
                                  moto_,
                                  "-H",
                                  "127.0.0.1",
                                  "-p",
                                  port};
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    pid_ = ::fork();
    if (pid_ == 0) {
      ::setpgid(0, 0);
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);  // no server left behind if the test binary dies
      const int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      if (fd >= 0) {
        ::dup2(fd, 1);
        ::dup2(fd, 2);
      }
      ::execv(argv[0], argv.data());
      ::_exit(127);
    }
    if (pid_ < 0) throw std::runtime_error("fork failed for moto_server");
    ::setpgid(pid_, pid_);
    // Ready when the port accepts a connection (a TCP connect is not an HTTP request, so it does not use up
    // one of the unauthenticated calls). Bounded at 30 s.
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (std::chrono::steady_clock::now() < deadline) {
      int status = 0;
      if (::waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = -1;
        throw std::runtime_error("moto_server exited during startup: " + moto_detail::read_file(log));
      }
      const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
      const sockaddr_in addr = moto_detail::loopback(port_);
      const bool up = ::connect(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)) == 0;
      ::close(fd);
      if (up) return;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    throw std::runtime_error("moto_server did not listen on port " + port +
                             " within 30 s: " + moto_detail::read_file(log));
  }

  // Exactly kUnauthenticatedCalls requests.
  void create_user_and_bucket() {
    const std::string policy =
        R"('{"Version":"2012-10-17","Statement":[{"Effect":"Allow","Action":"*","Resource":"*"}]}')";
    const std::string calls[kUnauthenticatedCalls] = {
        "iam create-user --user-name cohort",
        "iam put-user-policy --user-name cohort --policy-name all --policy-document " + policy,
        "iam create-access-key --user-name cohort --query 'AccessKey.[AccessKeyId,SecretAccessKey]' --output text",
        "s3api create-bucket --bucket " + bucket_};
    std::string key;
    for (const std::string& args : calls) {
      const AwsResult r = aws(args);
      if (!r.ok) throw std::runtime_error(r.error);
      if (args.rfind("iam create-access-key", 0) == 0) key = r.out;
    }
    std::istringstream in(key);
    in >> access_key_ >> secret_key_;
    if (access_key_.empty() || secret_key_.empty())
      throw std::runtime_error("aws iam create-access-key printed '" + key + "'");
  }

  std::string moto_, aws_, bucket_, access_key_, secret_key_;
  std::filesystem::path dir_;
  int port_ = -1;
  pid_t pid_ = -1;
};

// A test suite sharing one moto_server, started once per suite: skipped with the reason where moto or
// the aws CLI is missing, failed (never skipped) where moto is installed but does not start.
class MotoSuite : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    try {
      moto_ = MotoServer::start(&skip_);
    } catch (const std::exception& e) {
      error_ = e.what();
    }
  }
  static void TearDownTestSuite() { moto_.reset(); }

  void SetUp() override {
    if (!skip_.empty()) {
      GTEST_SKIP() << skip_;
    }
    // A server that failed to start is a failure, never a skip.
    ASSERT_TRUE(moto_) << error_;
  }

  static inline std::unique_ptr<MotoServer> moto_;
  static inline std::string skip_, error_;
};

}  // namespace cohort::testing
