// takeback exercises the C API's taking back of parked blocks (freequeue.go):
// xseg_malloc of exactly the request of a block freed by xseg_free on the
// same device and stream gets that block back without calling Go, and only
// while nothing else has been done to the library. It reads xseg_fq.reused
// (freequeue.h) to see which allocations were taken back. Host backend, as
// check.c. Usage: takeback LIB. Prints "ok" and exits 0, or what failed.
#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "freequeue.h"
#include "xseg.h"
#include "harness.h"

SYM(xseg_malloc)
SYM(xseg_free)
SYM(xseg_free_block)
SYM(xseg_record_stream)
SYM(xseg_record_history)
SYM(xseg_empty_cache)

static struct xseg_fq* fq;

static uint64_t reused(void) { return __atomic_load_n(&fq->reused, __ATOMIC_ACQUIRE); }


// The host backend knows the default stream only; other streams are
// checked by TestTakeBackMatching (freequeue_test.go). S2 goes where
// xseg_free's caller names a stream, which nothing reads.
#define S1 NULL
#define S2 ((void*)0x2)

// Threads share sizes and a stream; each writes its mark over its block and
// checks it is still there before freeing: a block handed to two owners at
// once shows.
enum { THREADS = 4, ROUNDS = 20000 };
static const size_t tsizes[] = {512, 4096, 70000, 1 << 20};

static void* worker(void* arg) {
	unsigned char mark = (unsigned char)(uintptr_t)arg;
	long bad = 0;
	unsigned char* held[4];
	for (int i = 0; i < ROUNDS; i++) {
		for (int j = 0; j < 4; j++) {
			held[j] = p_xseg_malloc((ssize_t)tsizes[j], 0, S1);
			if (!held[j]) { bad++; continue; }
			memset(held[j], mark, 512);
			held[j][tsizes[j] - 1] = mark;
		}
		for (int j = 3; j >= 0; j--) {
			if (!held[j]) continue;
			for (int k = 0; k < 512; k += 64) bad += held[j][k] != mark;
			bad += held[j][tsizes[j] - 1] != mark;
			p_xseg_free(held[j], (ssize_t)tsizes[j], 0, S1);
		}
	}
	return (void*)bad;
}

int main(int argc, char** argv) {
	void* h = open_common(argc > 1 ? argv[1] : "libxseg.so");
	LOAD(h, xseg_malloc) LOAD(h, xseg_free) LOAD(h, xseg_free_block) LOAD(h, xseg_record_stream)
	LOAD(h, xseg_record_history) LOAD(h, xseg_empty_cache)
	fq = dlsym(h, "xseg_fq");
	if (!fq) {
		printf("FAIL dlsym xseg_fq: %s\n", dlerror());
		return 1;
	}

	// The same request on the same stream: the same block, without Go.
	void* p = p_xseg_malloc(1000, 0, S1);
	CHECK(p != NULL, "first allocation");
	uint64_t r0 = reused();
	p_xseg_free(p, 1000, 0, S1);
	void* q = p_xseg_malloc(1000, 0, S1);
	CHECK(q == p && reused() == r0 + 1, "taken back: %p for %p, %llu taken", q, p, (unsigned long long)(reused() - r0));
	// The books: one block of 1,024 bytes live, two allocations and one free
	// counted (the drain of the stats call counts the pair taken back).
	CHECK(stat(0, "allocation", "current") == 1, "one live block");
	CHECK(stat(0, "allocation", "allocated") == 2, "allocations counted: %lld", stat(0, "allocation", "allocated"));
	CHECK(stat(0, "allocation", "freed") == 1, "frees counted: %lld", stat(0, "allocation", "freed"));
	CHECK(stat(0, "requested_bytes", "allocated") == 2000, "requested bytes counted: %lld", stat(0, "requested_bytes", "allocated"));
	CHECK(stat(0, "allocated_bytes", "peak") == 1024, "peak: %lld", stat(0, "allocated_bytes", "peak"));

	// Another request, even one of the same rounded size: not taken back.
	r0 = reused();
	p_xseg_free(q, 1000, 0, S1);
	void* a = p_xseg_malloc(1001, 0, S1);
	CHECK(a != NULL && reused() == r0, "another request: %llu taken", (unsigned long long)(reused() - r0));
	p_xseg_free(a, 1001, 0, S1);

	// A block of a page (2 MiB) or more goes through Go: it decides which
	// pages can be unmapped.
	p = p_xseg_malloc(2 << 20, 0, S1);
	r0 = reused();
	p_xseg_free(p, 2 << 20, 0, S1);
	q = p_xseg_malloc(2 << 20, 0, S1);
	CHECK(q != NULL && reused() == r0, "a block of a whole page was taken back");
	p_xseg_free(q, 2 << 20, 0, S1);

	// What xseg_free's caller says about size and stream is not trusted:
	// the block of 1000 bytes freed "as 1 GiB on stream 2" comes back only
	// for 1000 bytes on stream 1.
	p = p_xseg_malloc(1000, 0, S1);
	r0 = reused();
	p_xseg_free(p, 1 << 30, 0, S2);
	unsigned char* big = p_xseg_malloc(64 << 20, 0, S1);
	CHECK(big != NULL && reused() == r0, "a lying free's size was believed");
	if (big) big[(64 << 20) - 1] = 1;  // host memory: all of it is there
	p_xseg_free(big, 64 << 20, 0, S1);
	p = p_xseg_malloc(1000, 0, S1);
	q = p_xseg_malloc(1000, 0, S1);
	p_xseg_free(q, 5, 0, S2);
	void* q2 = p_xseg_malloc(1000, 0, S1);
	CHECK(q2 == q && reused() == r0 + 1, "the remembered request and stream were not used");

	// A free on another device than the block's: not taken back (Go
	// reports the bad free; the block stays the caller's).
	r0 = reused();
	p_xseg_free(q2, 1000, 1, S1);
	void* c = p_xseg_malloc(1000, 0, S1);
	CHECK(c != q2 && reused() == r0, "a free on the wrong device was taken back");
	CHECK(error_has("device 1"), "the bad free on device 1 was reported");
	p_xseg_free(c, 1000, 0, S1);
	p_xseg_free(q2, 1000, 0, S1);
	p_xseg_free(p, 1000, 0, S1);

	// Any other call into the library ends the epoch: blocks remembered
	// before it are not taken back after it.
	const char* calls[] = {"stats", "record_stream", "history", "empty_cache", "free_block"};
	for (int i = 0; i < 5; i++) {
		p = p_xseg_malloc(4096, 0, S1);
		void* other = p_xseg_malloc(8192, 0, S1);
		r0 = reused();
		p_xseg_free(p, 4096, 0, S1);
		switch (i) {
		case 0: stat(0, "allocation", "current"); break;
		case 1: CHECK(p_xseg_record_stream(other, S1) == 0, "record_stream"); break;
		case 2: CHECK(p_xseg_record_history(0, 100) == 0, "history on"); break;
		case 3: CHECK(p_xseg_empty_cache(0) == 0, "empty_cache"); break;
		case 4: CHECK(p_xseg_free_block(other, 0) == 0, "free_block"); other = NULL; break;
		}
		q = p_xseg_malloc(4096, 0, S1);
		CHECK(reused() == r0, "taken back after %s", calls[i]);
		if (i == 2) {
			// While history is recorded, nothing is taken back either.
			p_xseg_free(q, 4096, 0, S1);
			q = p_xseg_malloc(4096, 0, S1);
			CHECK(reused() == r0, "taken back while history is recorded");
			CHECK(p_xseg_record_history(0, 0) == 0, "history off");
		}
		p_xseg_free(q, 4096, 0, S1);
		if (other) p_xseg_free(other, 8192, 0, S1);
	}
	// A block whose use was recorded is not taken back.
	p = p_xseg_malloc(4096, 0, S1);
	CHECK(p_xseg_record_stream(p, S1) == 0, "record_stream");
	r0 = reused();
	p_xseg_free(p, 4096, 0, S1);
	q = p_xseg_malloc(4096, 0, S1);
	CHECK(reused() == r0, "a block whose use was recorded was taken back");
	p_xseg_free(q, 4096, 0, S1);

	// A double free: the block is not taken back (Go would apply the
	// second free to its new owner); Go reports the second free.
	p = p_xseg_malloc(3000, 0, S1);
	r0 = reused();
	p_xseg_free(p, 3000, 0, S1);
	p_xseg_free(p, 3000, 0, S1);
	q = p_xseg_malloc(3000, 0, S1);
	CHECK(reused() == r0, "a block freed twice was taken back");
	CHECK(stat(0, "allocation", "current") == 1, "after a double free, one live block: %lld", stat(0, "allocation", "current"));
	CHECK(error_has("double free"), "the double free was reported");
	p_xseg_free(q, 3000, 0, S1);

	// Past the ring's capacity: blocks keep coming back, and the frees that
	// find it full go through Go.
	r0 = reused();
	for (int i = 0; i < 3 * XSEG_FQ_CAP; i++) {
		p = p_xseg_malloc(777, 0, S1);
		p_xseg_free(p, 777, 0, S1);
	}
	CHECK(reused() - r0 >= 3 * XSEG_FQ_CAP - 4, "%llu of %d taken back", (unsigned long long)(reused() - r0), 3 * XSEG_FQ_CAP);
	CHECK(stat(0, "allocation", "current") == 0, "nothing live after the loop");
	CHECK(stat(0, "allocation", "allocated") == stat(0, "allocation", "freed"), "allocations and frees balance");

	// Threads on one stream: no block has two owners at once, and the books
	// balance.
	long long before = stat(0, "allocation", "allocated");
	pthread_t th[THREADS];
	for (int i = 0; i < THREADS; i++) pthread_create(&th[i], NULL, worker, (void*)(uintptr_t)(i + 1));
	long bad = 0;
	for (int i = 0; i < THREADS; i++) {
		void* rv;
		pthread_join(th[i], &rv);
		bad += (long)rv;
	}
	CHECK(bad == 0, "%ld blocks failed or were overwritten by another owner", bad);
	CHECK(stat(0, "allocation", "current") == 0, "threads freed everything");
	long long made = stat(0, "allocation", "allocated") - before;
	CHECK(made == (long long)THREADS * ROUNDS * 4, "%lld allocations counted, %d made", made, THREADS * ROUNDS * 4);
	if (failures == 0) printf("ok\n");
	return failures != 0;
}
