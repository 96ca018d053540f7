/* The free queue of libxseg (freequeue.go says why and how): xseg_free parks
 * a block here instead of calling into Go, and every call into Go applies
 * the parked frees first. Shared by shim.c and freequeue.go. */
#ifndef XSEG_FREEQUEUE_H
#define XSEG_FREEQUEUE_H

#include <stdint.h>
#include <sys/types.h>

#ifdef __cplusplus
extern "C" {
#endif

enum { XSEG_FQ_CAP = 256 }; /* a power of two */

/* What a parked entry is (xseg_fq_entry.kind). */
enum {
	XSEG_FQ_FREE = 0,     /* a free for Go to apply */
	XSEG_FQ_REUSABLE = 1, /* that, and a block xseg_malloc may take back */
	XSEG_FQ_REUSED = 2,   /* taken back: Go counts an allocation and a free */
};

struct xseg_fq_entry {
	uint64_t ptr;
	int64_t device;
	uint64_t size;   /* REUSABLE, REUSED: the request the block was made for */
	uint64_t stream; /* REUSABLE, REUSED: the stream it was made for */
	uint32_t epoch;  /* REUSABLE: xseg_fq.epoch when it was made */
	uint32_t kind;
};

/* The blocks recently handed out on the plain path (freequeue.go), by
 * address: what xseg_free needs to know to let xseg_malloc take a block
 * back. A slot is a cache entry: a newer block overwrites it. */
enum { XSEG_FQ_RECENT = 4096 }; /* a power of two */

struct xseg_fq_recent {
	uint64_t ptr;
	uint64_t size;
	uint64_t stream;
	int32_t device;
	uint32_t epoch;
};

/* lock is a spin lock (0 free, 1 held) over head, tail, buf and recent.
 * direct, when not 0, sends every free to Go at once (a sum: freequeue.go
 * says of what). head counts the
 * entries taken, tail those parked; both wrap. epoch changes (atomically)
 * at the start and end of every call into Go but the plain allocation and
 * free; an entry of recent or buf made in another epoch is never taken back.
 * reused counts the blocks taken back (for tests). */
struct xseg_fq {
	int32_t lock;
	int32_t direct;
	uint32_t head;
	uint32_t tail;
	uint32_t epoch;
	uint32_t pad;
	uint64_t reused;
	struct xseg_fq_entry buf[XSEG_FQ_CAP];
	struct xseg_fq_recent recent[XSEG_FQ_RECENT];
};

extern struct xseg_fq xseg_fq;

/* xseg_fq_push parks a free: 1, or 0 when the queue is full or direct (the
 * caller then frees through Go). A block recent knows from this epoch is
 * parked REUSABLE; the block leaves recent either way. */
int xseg_fq_push(uint64_t ptr, int device);

/* xseg_fq_remember records a block the plain path handed out in epoch
 * (0: not plain; nothing is recorded). */
void xseg_fq_remember(uint64_t ptr, uint64_t size, int device, uint64_t stream, uint32_t epoch);

/* xseg_fq_take_back returns the most recently parked REUSABLE block made
 * for exactly size bytes on device and stream in this epoch, among the
 * last XSEG_FQ_SCAN entries parked, marked REUSED and remembered again; 0
 * if there is none. */
enum { XSEG_FQ_SCAN = 16 };
uint64_t xseg_fq_take_back(uint64_t size, int device, uint64_t stream);

/* xseg_fq_malloc is the plain (unrouted) path of xseg_malloc and
 * xseg_malloc_or_throw: a block taken back (xseg_fq_take_back), else one
 * from Go, remembered for taking back (xseg_fq_remember). With err NULL a
 * failure becomes the thread's error (xsegGoMalloc); else *err and *oom
 * receive it (xsegGoMallocOrError). */
uint64_t xseg_fq_malloc(ssize_t size, int device, uint64_t stream, char** err, int* oom);

#ifdef __cplusplus
}
#endif

#endif
