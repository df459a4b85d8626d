// envd's pid 1, before Go starts.
//
// Orphans of every process in a sandbox are re-parented to the pid
// namespace's init, which must wait for them or they stay zombies; doing that
// in the Go server would race with os/exec, whose Wait must see its own
// children's exit statuses. So the sandbox's pid 1 does nothing but reap: it
// forks the server, forwards to it the signals the host sends (a graceful
// stop, and the quiesce and wake around a checkpoint), and exits with its
// status; when pid 1 exits, the kernel kills the rest of the sandbox, which is
// the intended teardown.
//
// That reaper used to be envd itself, started once more: a second Go runtime
// and every package's init, about 1.3 MiB of private memory per sandbox and a
// few milliseconds of every cold start. Here it is a constructor that glibc
// runs before the Go runtime exists (as runc's nsexec is): the process forks,
// the child returns and becomes the Go server (pid 2), and pid 1 stays in this
// file for good, having touched a few pages of its own.
//
// tini does the same job but cannot drop the stdio the host gave it: a
// checkpoint must find no descriptor of pid 1 that points outside the sandbox.

#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

// is_agent reports whether this exec of the multi-call binary is the agent
// (plain `envd`, see main.go), as opposed to the sudo shim, the MCP gateway
// or `envd step`, which never reap for anyone.
static int is_agent(int argc, char **argv) {
	if (argc != 1 || argv == NULL || argv[0] == NULL) {
		return 0;
	}
	const char *name = strrchr(argv[0], '/');
	name = name ? name + 1 : argv[0];
	return strcmp(name, "sudo") != 0 && strcmp(name, "sudoedit") != 0 &&
	       strcmp(name, "mcp-gateway") != 0;
}

// forwarded are the signals the server handles (main.go; envdapi.QuiesceSignal
// is SIGUSR1 and WakeSignal SIGUSR2); pid 1 consumes the others, as the kernel
// ignores them for a namespace's init without a handler.
static int forwarded(int sig) {
	return sig == SIGTERM || sig == SIGINT || sig == SIGUSR1 || sig == SIGUSR2;
}

// drop_stdio points pid 1's standard descriptors at /dev/null. The server
// keeps its own copies: it reads its config on stdin and sends its output
// where the config says.
static void drop_stdio(void) {
	int null = open("/dev/null", O_RDWR | O_CLOEXEC);
	if (null < 0) {
		return;
	}
	for (int fd = 0; fd <= 2; fd++) {
		dup2(null, fd);
	}
	if (null > 2) {
		close(null);
	}
}

// reap waits for every child until the server ends, then exits as it did.
static void reap(pid_t server, const sigset_t *all) {
	for (;;) {
		siginfo_t info;
		int sig = sigwaitinfo(all, &info);
		if (sig < 0) {
			continue; // EINTR: nothing is lost, pending signals stay pending
		}
		if (forwarded(sig)) {
			kill(server, sig);
			continue;
		}
		if (sig != SIGCHLD) {
			continue;
		}
		// One SIGCHLD may stand for many exits: take all of them.
		for (;;) {
			int status;
			pid_t pid = waitpid(-1, &status, WNOHANG);
			if (pid <= 0) {
				if (pid < 0 && errno == EINTR) {
					continue;
				}
				break; // none left that has exited (or ECHILD)
			}
			if (pid != server) {
				continue;
			}
			if (WIFEXITED(status)) {
				_exit(WEXITSTATUS(status));
			}
			if (WIFSIGNALED(status)) {
				_exit(128 + WTERMSIG(status));
			}
		}
	}
}

__attribute__((constructor)) static void envd_pid1(int argc, char **argv, char **envp) {
	(void)envp;
	if (getpid() != 1 || !is_agent(argc, argv)) {
		return;
	}
	// Blocked from before the fork, so no signal for the server falls between
	// the cracks; the child unblocks what it had before returning to Go.
	sigset_t all, old;
	sigfillset(&all);
	sigprocmask(SIG_SETMASK, &all, &old);
	pid_t server = fork();
	if (server < 0) {
		fprintf(stderr, "envd: pid 1 cannot fork the server: %s\n", strerror(errno));
		_exit(1);
	}
	if (server == 0) {
		sigprocmask(SIG_SETMASK, &old, NULL);
		return;
	}
	drop_stdio();
	reap(server, &all);
}
