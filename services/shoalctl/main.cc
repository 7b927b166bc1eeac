// shoalctl: the command-line client of the coordinator, and the local cluster launcher.
// Flags are parsed by commands.cc (absl's built-in --version flag would clash with
// `model get --version V`).

#include <signal.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <iostream>
#include <string_view>
#include <thread>

#include "libs/common/build_info.h"
#include "libs/common/log.h"
#include "libs/rpc/grpc_lifetime.h"
#include "libs/rpc/signals.h"
#include "services/shoalctl/commands.h"

int main(int argc, char** argv) {
  shoal::SetLogProgramName("shoalctl");
  // `shoalctl --version` alone; commands.cc owns every other flag (`model get --version V`).
  if (argc == 2 && std::string_view(argv[1]) == "--version") {
    std::cout << shoal::VersionLine("shoalctl") << "\n";
    return 0;
  }
  // Before any thread exists: SIGINT/SIGTERM are taken by the thread below, which lets
  // long-running commands stop their calls and children cleanly.
  shoal::rpc::BlockShutdownSignals();
  shoal::rpc::GrpcLifetime grpc;  // outlives every gRPC object below (see its header)
  shoal::shoalctl::Interrupt interrupt;
  std::atomic<bool> exiting{false};
  std::thread signal_thread([&] {
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGTERM);
    const timespec tick{0, 200'000'000};
    int received = 0;
    while (!exiting.load()) {
      const int sig = sigtimedwait(&set, nullptr, &tick);
      if (sig <= 0) continue;
      // A second signal, or one during a short command, ends the process now (children still
      // get SIGTERM through PR_SET_PDEATHSIG).
      if (++received > 1 || !interrupt.graceful.load()) _exit(130);
      interrupt.interrupted = true;
      interrupt.canceller.Cancel();
    }
  });

  shoal::shoalctl::Environment env;
  env.out = &std::cout;
  env.err = &std::cerr;
  env.out_is_tty = isatty(STDOUT_FILENO) == 1;
  if (winsize ws{}; env.out_is_tty && ioctl(STDOUT_FILENO, TIOCGWINSZ, &ws) == 0) {
    env.tty_columns = ws.ws_col;
  }
  env.interrupt = &interrupt;
  if (const char* c = std::getenv("SHOAL_COORDINATOR"); c != nullptr && *c != '\0') {
    env.default_coordinator = c;
  }
  if (const char* t = std::getenv("TMPDIR"); t != nullptr) env.temp_dir = t;
  if (const char* d = std::getenv("SHOAL_TLS_DIR"); d != nullptr) env.default_tls_dir = d;
  if (const char* t = std::getenv("SHOAL_JOIN_TOKEN"); t != nullptr) env.default_join_token = t;
  const int code =
      shoal::shoalctl::RunShoalctl(std::vector<std::string>(argv + 1, argv + argc), env);
  std::cout.flush();
  exiting = true;
  signal_thread.join();
  return grpc.Exit(code);
}
