// check loads libxseg.so with dlopen, as PyTorch does, and exercises every
// function of xseg.h on the host backend (XSEG_BACKEND=host, set by the Go
// test, with XSEG_HOST_CAPACITY of 1 GiB). Usage: check LIB [nodriver|share].
// It prints "ok" and exits 0, or prints what failed and exits 1.
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "xseg.h"
#include "harness.h"

SYM(xseg_malloc)
SYM(xseg_free)
SYM(xseg_record_stream)
SYM(xseg_snapshot_json)
SYM(xseg_empty_cache)
SYM(xseg_reset_peak_stats)
SYM(xseg_configure)
SYM(xseg_set_log_level)
SYM(xseg_version)
SYM(xseg_share)
SYM(xseg_unshare)
SYM(xseg_open)
SYM(xseg_close)
SYM(xseg_open_nowait)
SYM(xseg_open_wait)
SYM(xseg_thread_error)


static void load(const char* path) {
	void* h = open_common(path);
	LOAD(h, xseg_malloc) LOAD(h, xseg_free) LOAD(h, xseg_record_stream)
	LOAD(h, xseg_snapshot_json)
	LOAD(h, xseg_empty_cache) LOAD(h, xseg_reset_peak_stats) LOAD(h, xseg_configure)
	LOAD(h, xseg_set_log_level) LOAD(h, xseg_version)
	LOAD(h, xseg_share) LOAD(h, xseg_unshare) LOAD(h, xseg_open) LOAD(h, xseg_close)
	LOAD(h, xseg_open_nowait) LOAD(h, xseg_open_wait) LOAD(h, xseg_thread_error)
}


static int error_has_ptr(const char* prefix, const void* p) {
	char want[64];
	snprintf(want, sizeof want, "%s%#lx", prefix, (unsigned long)(uintptr_t)p);
	return error_has(want);
}



static void* worker(void* arg) {
	long bad = 0;
	for (int i = 0; i < 2000; i++) {
		size_t n = 256 + (size_t)(i % 7) * 100000;
		unsigned char* p = p_xseg_malloc((ssize_t)n, 0, NULL);
		if (!p) { bad++; continue; }
		p[0] = (unsigned char)i; p[n - 1] = (unsigned char)i;  // host memory: really writable
		p_xseg_free(p, (ssize_t)n, 0, NULL);
	}
	return (void*)bad;
}

static void before_start(void) {
	CHECK(strcmp(p_xseg_version(), XSEG_VERSION) == 0, "version %s", p_xseg_version());
	CHECK(strcmp(p_xseg_last_error(), "") == 0, "a fresh library has no error");
	CHECK(stat(0, "allocated_bytes", "current") == 0, "zero stats before any allocation");
	CHECK(p_xseg_configure("no_such_key:1") == -1, "unknown configuration key accepted");
	CHECK(error_has("no_such_key"), "the error names the key");
	CHECK(p_xseg_configure("oom_max_retries:1,oom_delay_ms:1") == 0, "a good configuration refused");
	CHECK(p_xseg_set_log_level("loud") == -1, "unknown log level accepted");
	CHECK(p_xseg_set_log_level("off") == 0, "log level off refused");
	CHECK(p_xseg_empty_cache(0) == 0 && p_xseg_reset_peak_stats(-1) == 0, "no-op before start");
}

static void basics(void) {
	CHECK(p_xseg_malloc(0, 0, NULL) == NULL, "size 0 gives NULL");
	CHECK(p_xseg_malloc(-8, 0, NULL) == NULL && error_has("negative size"), "negative size");
	unsigned char* a = p_xseg_malloc(1000, 0, NULL);
	unsigned char* b = p_xseg_malloc(3 << 20, 0, NULL);
	CHECK(a && b, "two allocations");
	if (!a || !b) return;
	memset(a, 0xab, 1000);
	memset(b, 0xcd, 3 << 20);
	CHECK(a[999] == 0xab && b[0] == 0xcd, "blocks keep their bytes");
	CHECK(a + 1000 <= b || b + (3 << 20) <= a, "blocks overlap: %p %p", (void*)a, (void*)b);
	CHECK(stat(0, "allocated_bytes", "current") >= 1000 + (3 << 20), "allocated bytes counted");
	CHECK(stat(0, "allocation", "current") == 2, "allocation count");
	CHECK(stat(0, "reserved_bytes", "current") >= (3 << 20), "reserved bytes counted");
	CHECK(p_xseg_record_stream(a, NULL) == 0, "record_stream of a block");
	CHECK(p_xseg_record_stream((void*)0x10000, NULL) == 1, "record_stream of foreign memory");
	CHECK(p_xseg_configure("oom_max_retries:2") == -1 && error_has("first use"), "configure after start");
	char* snap = p_xseg_snapshot_json(0);
	CHECK(snap && strstr(snap, "\"segments\":[{") && strstr(snap, "\"state\":\"allocated\""), "snapshot");
	if (snap) p_xseg_string_free(snap);
	p_xseg_free(a, 1000, 0, NULL);
	p_xseg_free(b, 3 << 20, 0, NULL);
	CHECK(stat(0, "allocated_bytes", "current") == 0, "all freed");
	CHECK(stat(0, "allocated_bytes", "peak") >= 1000 + (3 << 20), "peak kept");
	CHECK(p_xseg_reset_peak_stats(0) == 0 && stat(0, "allocated_bytes", "peak") == 0, "peak reset");
	CHECK(p_xseg_empty_cache(-1) == 0 && stat(0, "reserved_bytes", "current") == 0, "cache emptied");
	CHECK(top(0, "device_total_bytes") == 1LL << 30, "device total %lld", top(0, "device_total_bytes"));

	// Bad input: none of it may crash or change the books.
	char* c = p_xseg_malloc(4096, 0, NULL);
	p_xseg_free((void*)0x7f0000001000, 64, 0, NULL);
	CHECK(error_has("xseg_free: 0x7f0000001000"), "free of a pointer xseg never returned");
	p_xseg_free(c + 16, 64, 0, NULL);
	CHECK(error_has_ptr("xseg_free: ", c + 16), "free of an interior pointer");
	p_xseg_free(c, 4096, 5, NULL);
	CHECK(error_has("device 5"), "free on a device without allocations");
	p_xseg_free(c, 4096, 0, NULL);
	p_xseg_malloc(-3, 0, NULL);
	p_xseg_free(c, 4096, 0, NULL);
	CHECK(error_has_ptr("xseg_free: ", c), "double free");
	p_xseg_malloc(-3, 0, NULL);
	p_xseg_free(NULL, 0, 0, NULL);
	CHECK(error_has("negative size"), "free of NULL is no error");
	CHECK(stat(0, "allocation", "current") == 0, "bad frees changed nothing");
	CHECK(p_xseg_malloc(64, 7, NULL) == NULL && error_has("device 7"), "malloc on a missing device");
	CHECK(p_xseg_stats_json(-3) == NULL && error_has("out of range"), "stats of a bad device");
	CHECK(stat(3, "allocated_bytes", "current") == -1, "stats of a missing device");
	CHECK(p_xseg_empty_cache(-2) == -1, "empty_cache of a bad device");
}

static void out_of_memory(void) {
	long long ooms = top(0, "num_ooms");
	CHECK(p_xseg_malloc(2LL << 30, 0, NULL) == NULL, "2 GiB on a 1 GiB device");
	CHECK(error_has("out of memory"), "the error says out of memory");
	CHECK(top(0, "num_ooms") == ooms + 1, "num_ooms counted");
	void* p = p_xseg_malloc(1 << 20, 0, NULL);
	CHECK(p != NULL, "allocation after an OOM");
	p_xseg_free(p, 1 << 20, 0, NULL);
}

static void threads(void) {
	pthread_t t[4];
	for (int i = 0; i < 4; i++) pthread_create(&t[i], NULL, worker, NULL);
	for (int i = 0; i < 4; i++) {
		void* bad;
		pthread_join(t[i], &bad);
		CHECK(bad == NULL, "thread %d: %ld failed allocations", i, (long)bad);
	}
	CHECK(stat(0, "allocation", "current") == 0, "threads freed everything");
}

// free_queue: xseg_free parks frees that the next call applies (see
// cmd/libxseg/freequeue.go). More frees than the ring holds, with no call
// between them, all take effect; and while four threads allocate and free,
// another's stats never count more than the four blocks they can hold.
static void* counter(void* arg) {
	volatile int* stop = arg;
	long worst = 0;
	while (!*stop) {
		long long n = stat(0, "allocation", "current");
		if (n < 0 || n > 4) worst = n < 0 ? -1 : (n > worst ? n : worst);
	}
	return (void*)worst;
}

static void free_queue(void) {
	enum { N = 1000 };
	static void* ps[N];
	int got = 0;
	for (int i = 0; i < N; i++) got += (ps[i] = p_xseg_malloc(4096 + 512 * (i % 5), 0, NULL)) != NULL;
	CHECK(got == N, "%d of %d allocations", got, N);
	for (int i = 0; i < N; i++) p_xseg_free(ps[i], 4096, 0, NULL);
	CHECK(stat(0, "allocation", "current") == 0, "%d frees without a call between them: %lld blocks left",
	      N, stat(0, "allocation", "current"));
	CHECK(strcmp(p_xseg_last_error(), "") == 0 || !error_has("xseg_free"), "a good free failed: %s", p_xseg_last_error());

	int stop = 0;
	pthread_t w[4], c;
	pthread_create(&c, NULL, counter, &stop);
	for (int i = 0; i < 4; i++) pthread_create(&w[i], NULL, worker, NULL);
	for (int i = 0; i < 4; i++) {
		void* bad;
		pthread_join(w[i], &bad);
		CHECK(bad == NULL, "thread %d: %ld failed allocations", i, (long)bad);
	}
	stop = 1;
	void* worst;
	pthread_join(c, &worst);
	CHECK(worst == NULL, "stats counted %ld blocks live (at most 4 are)", (long)worst);
	CHECK(stat(0, "allocation", "current") == 0, "threads freed everything");
}

// thread_errors: two threads fail differently at once; each reads its own
// reason with xseg_thread_error, whatever xseg_last_error says by then.
static void* fail_negative(void* arg) {
	long wrong = 0;
	for (int i = 0; i < 300; i++) {
		wrong += p_xseg_malloc(-8, 0, NULL) != NULL || !strstr(p_xseg_thread_error(), "negative size");
	}
	return (void*)wrong;
}

static void* fail_oom(void* arg) {
	long wrong = 0;
	for (int i = 0; i < 300; i++) {
		wrong += p_xseg_malloc(2LL << 30, 0, NULL) != NULL || !strstr(p_xseg_thread_error(), "out of memory");
	}
	return (void*)wrong;
}

static void* fresh_thread(void* arg) { return (void*)(long)(strcmp(p_xseg_thread_error(), "") != 0); }

static void thread_errors(void) {
	pthread_t a, b, c;
	pthread_create(&c, NULL, fresh_thread, NULL);
	void* dirty;
	pthread_join(c, &dirty);
	CHECK(dirty == NULL, "a thread that never failed has an error: %s", p_xseg_thread_error());
	pthread_create(&a, NULL, fail_negative, NULL);
	pthread_create(&b, NULL, fail_oom, NULL);
	void *wa, *wb;
	pthread_join(a, &wa);
	pthread_join(b, &wb);
	CHECK(wa == NULL && wb == NULL, "threads read another's reason: %ld and %ld of 300", (long)wa, (long)wb);
	// The calling thread's text is bounded: a 10 KB log level is quoted
	// cut short.
	static char conf[10000];
	memset(conf, 'k', sizeof conf - 1);
	CHECK(p_xseg_set_log_level(conf) == -1, "a 10 KB log level accepted");
	size_t n = strlen(p_xseg_thread_error());
	CHECK(n > 0 && n <= 256 && strstr(p_xseg_thread_error(), "...") != NULL, "thread error of %zu bytes", n);
	// A call that succeeds leaves the thread's last failure as it was.
	void* p = p_xseg_malloc(1 << 20, 0, NULL);
	CHECK(p != NULL, "allocation after the failures");
	CHECK(n == strlen(p_xseg_thread_error()), "a successful call changed the thread's error");
	p_xseg_free(p, 1 << 20, 0, NULL);
}

static void latency(void) {
	const size_t sizes[] = {512, 4096, 65536, 1 << 20, 3 << 20, 24 << 20, 100 << 20};
	const int n = sizeof sizes / sizeof sizes[0], rounds = 20000;
	void* ps[7];
	struct timespec t0, t1;
	clock_gettime(CLOCK_MONOTONIC, &t0);
	for (int i = 0; i < rounds; i++) {
		for (int j = 0; j < n; j++) ps[j] = p_xseg_malloc((ssize_t)sizes[j], 0, NULL);
		for (int j = 0; j < n; j++) p_xseg_free(ps[j], (ssize_t)sizes[j], 0, NULL);
	}
	clock_gettime(CLOCK_MONOTONIC, &t1);
	double ns = ((t1.tv_sec - t0.tv_sec) * 1e9 + (t1.tv_nsec - t0.tv_nsec)) / ((double)rounds * n);
	printf("host backend warm malloc+free pair: %.1f ns\n", ns);
}

// sharing opens a share of this process with bad arguments (issue 15: a
// NULL ptr crashed in the shim; a NULL size left a mapping without a handle,
// pinning the page after unshare, free and empty_cache), then properly.
static void sharing(void) {
	CHECK(p_xseg_configure("shareable:true") == 0, "shareable configuration refused");
	const size_t n = 3 << 20;
	unsigned char* p = p_xseg_malloc((ssize_t)n, 0, NULL);
	CHECK(p != NULL, "allocation");
	if (!p) return;
	memset(p, 0x5a, n);
	static char desc[65536];
	CHECK(p_xseg_share(p, 0, NULL, sizeof desc) == -1 && error_has("out is NULL") && !error_has("nil"), "NULL out");
	CHECK(p_xseg_share(p, 0, desc, 4) == -1 && error_has("the share is undone"), "a buffer too small");
	ssize_t len = p_xseg_share(p, 0, desc, sizeof desc);
	CHECK(len > 0, "share");
	if (len <= 0) return;

	void* q = (void*)0x1;
	size_t size = 7;
	CHECK(p_xseg_open(desc, (size_t)len, 0, NULL, &size) == -1 && error_has("ptr is NULL"), "NULL ptr");
	CHECK(p_xseg_open(desc, (size_t)len, 0, &q, NULL) == -1 && error_has("size is NULL"), "NULL size");
	CHECK(p_xseg_open(desc, (size_t)len, 0, NULL, NULL) == -1, "NULL ptr and size");
	CHECK(p_xseg_open(NULL, (size_t)len, 0, &q, &size) == -1 && error_has("desc is NULL"), "NULL desc");
	CHECK(p_xseg_open(desc, 0, 0, &q, &size) == -1 && error_has("descriptor of 0 bytes"), "len 0");
	CHECK(p_xseg_open(desc, 5, 0, &q, &size) == -1, "a cut descriptor");
	CHECK(q == (void*)0x1 && size == 7, "a failed open leaves *ptr and *size alone");

	int64_t h = p_xseg_open(desc, (size_t)len, 0, &q, &size);
	CHECK(h > 0 && size == n && q != (void*)0x1 && q != p, "open: handle %lld, %zu bytes", (long long)h, size);
	if (h > 0) CHECK(((unsigned char*)q)[n - 1] == 0x5a, "the mapping shows the block's bytes");
	CHECK(h <= 0 || p_xseg_close(h) == 0, "close");
	CHECK(p_xseg_close(h) == -1, "a second close");

	// The lease's answer read later: the mapping (kept from the close
	// above, or new) is there at once, readable after xseg_open_wait.
	q = (void*)0x1;
	CHECK(p_xseg_open_nowait(NULL, (size_t)len, 0, &q, &size) == -1 && error_has("xseg_open_nowait: desc is NULL"), "open_nowait: NULL desc");
	h = p_xseg_open_nowait(desc, (size_t)len, 0, &q, &size);
	CHECK(h > 0 && size == n && q != (void*)0x1, "open_nowait: handle %lld", (long long)h);
	CHECK(h <= 0 || p_xseg_open_wait(h) == 0, "open_wait");
	CHECK(h <= 0 || p_xseg_open_wait(h) == 0, "a second open_wait");
	if (h > 0) CHECK(((unsigned char*)q)[0] == 0x5a, "the mapping shows the block's bytes after open_wait");
	CHECK(h <= 0 || p_xseg_close(h) == 0, "close after open_wait");
	CHECK(p_xseg_open_wait(h) == -1 && error_has("no mapping has handle"), "open_wait of a closed handle");
	int64_t h2 = p_xseg_open(desc, (size_t)len, 0, &q, &size);
	CHECK(h2 > 0 && p_xseg_open_wait(h2) == 0, "open_wait of an xseg_open handle");
	CHECK(h2 <= 0 || p_xseg_close(h2) == 0, "close");
	CHECK(p_xseg_unshare(desc, (size_t)len) == 0, "unshare");
	p_xseg_free(p, (ssize_t)n, 0, NULL);
	// The exporter hears of the closed lease over its socket, a moment
	// later: wait for the page to come free (a leaked mapping keeps it).
	long long reserved = -1;
	for (int i = 0; i < 1000 && reserved != 0; i++) {
		if (i > 0) nanosleep(&(struct timespec){0, 10 * 1000 * 1000}, NULL);
		CHECK(p_xseg_empty_cache(0) == 0, "empty_cache");
		reserved = stat(0, "reserved_bytes", "current");
	}
	CHECK(reserved == 0, "no mapping keeps the page: %lld bytes reserved after 10 s", reserved);
}

int main(int argc, char** argv) {
	if (argc < 2) {
		fprintf(stderr, "usage: check LIB [nodriver]\n");
		return 2;
	}
	load(argv[1]);
	if (argc > 2 && strcmp(argv[2], "nodriver") == 0) {
		void* p = p_xseg_malloc(1 << 20, 0, NULL);
		printf("%s\n", p ? "allocated" : p_xseg_last_error());
		void* q = p_xseg_malloc(1 << 20, 0, NULL);
		printf("%s\n", q ? "allocated" : p_xseg_last_error());
		return 0;
	}
	if (argc > 2 && strcmp(argv[2], "share") == 0) {
		sharing();
		printf(failures ? "%d checks failed\n" : "ok\n", failures);
		return failures != 0;
	}
	before_start();
	basics();
	out_of_memory();
	threads();
	free_queue();
	thread_errors();
	latency();
	if (failures) {
		printf("%d checks failed\n", failures);
		return 1;
	}
	printf("ok\n");
	return 0;
}
