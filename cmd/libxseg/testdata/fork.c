// fork checks that a child forked after the library loaded is refused with
// a reason, at once, instead of waiting forever for Go's threads (which do
// not survive fork): right after dlopen, while the Go runtime may still be
// starting, and again after the parent has used the library. The parent
// goes on working. Host backend, as check.c. Usage: fork LIB. Prints "ok"
// and exits 0, or what failed.
#include <errno.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include "xseg.h"
#include "harness.h"

SYM(xseg_malloc)
SYM(xseg_free)
SYM(xseg_thread_error)
SYM(xseg_empty_cache)
SYM(xseg_record_stream)
SYM(xseg_set_memory_fraction)
SYM(xseg_memory_fraction)
SYM(xseg_set_memory_limit)
SYM(xseg_cache_info)
SYM(xseg_record_history)
SYM(xseg_history_json)

// child runs in a forked child: every call is refused with the reason.
static void child(void) {
	alarm(20); // a hang fails the parent's check
	CHECK(p_xseg_malloc(4096, 0, NULL) == NULL, "xseg_malloc in a forked child");
	CHECK(error_has("forked"), "xseg_last_error gives the reason");
	CHECK(strstr(p_xseg_thread_error(), "spawn") != NULL, "xseg_thread_error gives the way out: %s", p_xseg_thread_error());
	CHECK(p_xseg_stats_json(0) == NULL, "xseg_stats_json in a forked child");
	CHECK(p_xseg_empty_cache(-1) == -1, "xseg_empty_cache in a forked child");
	CHECK(p_xseg_record_stream((void*)0x1000, NULL) == -1, "xseg_record_stream in a forked child");
	p_xseg_free((void*)0x1000, 4096, 0, NULL); // refused without a word: nothing to report to
	// The memory limit and history functions, which had no guard: they
	// called into Go and hung in most children forked right after dlopen.
	p_xseg_set_memory_fraction(0.5, 0); // void: refused without a word
	double f = -1;
	CHECK(p_xseg_memory_fraction(0, &f) == -1 && f == -1, "xseg_memory_fraction in a forked child");
	CHECK(p_xseg_set_memory_limit(0, 1 << 30) == -1, "xseg_set_memory_limit in a forked child");
	size_t largest = 7;
	CHECK(p_xseg_cache_info(0, &largest) == -1 && largest == 7, "xseg_cache_info in a forked child");
	CHECK(p_xseg_record_history(0, 16) == -1, "xseg_record_history in a forked child");
	CHECK(p_xseg_history_json(0) == NULL, "xseg_history_json in a forked child");
	CHECK(error_has("forked"), "xseg_last_error gives the reason");
	_exit(failures == 0 ? 0 : 1);
}

// forkChild forks, runs child there, and checks it exited 0.
static void forkChild(const char* when) {
	fflush(stdout);
	pid_t pid = fork();
	if (pid < 0) {
		printf("FAIL fork: %s\n", strerror(errno));
		exit(1);
	}
	if (pid == 0) {
		child();
	}
	int status = 0;
	CHECK(waitpid(pid, &status, 0) == pid, "waitpid");
	CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0, "the child forked %s: status %#x (a signal %d is a hang)", when,
	      status, WIFSIGNALED(status) ? WTERMSIG(status) : 0);
}

int main(int argc, char** argv) {
	if (argc != 2) {
		printf("usage: fork LIB\n");
		return 2;
	}
	void* h = open_common(argv[1]);
	LOAD(h, xseg_malloc) LOAD(h, xseg_free) LOAD(h, xseg_thread_error) LOAD(h, xseg_empty_cache)
	LOAD(h, xseg_record_stream) LOAD(h, xseg_set_memory_fraction) LOAD(h, xseg_memory_fraction)
	LOAD(h, xseg_set_memory_limit) LOAD(h, xseg_cache_info) LOAD(h, xseg_record_history) LOAD(h, xseg_history_json)
	forkChild("right after dlopen");
	void* p = p_xseg_malloc(1 << 20, 0, NULL);
	CHECK(p != NULL, "the parent allocates");
	forkChild("after the parent allocated");
	p_xseg_free(p, 1 << 20, 0, NULL);
	CHECK(p_xseg_empty_cache(-1) == 0, "the parent goes on");
	if (failures == 0) {
		printf("ok\n");
	}
	return failures == 0 ? 0 : 1;
}
