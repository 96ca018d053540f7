/* The free queue of libxseg (freequeue.go says why and how): xseg_free parks
 * a block here instead of calling into Go, and every call into Go applies
 * the parked frees first. Shared by shim.c and freequeue.go. */
#ifndef XSEG_FREEQUEUE_H
#define XSEG_FREEQUEUE_H

#include <stdint.h>

enum { XSEG_FQ_CAP = 256 }; /* a power of two */

struct xseg_fq_entry {
	uint64_t ptr;
	int64_t device;
};

/* lock is a spin lock (0 free, 1 held) over head, tail and buf. direct,
 * when not 0, sends every free to Go at once. head counts the entries
 * taken, tail those parked; both wrap. */
struct xseg_fq {
	int32_t lock;
	int32_t direct;
	uint32_t head;
	uint32_t tail;
	struct xseg_fq_entry buf[XSEG_FQ_CAP];
};

extern struct xseg_fq xseg_fq;

/* xseg_fq_push parks a free: 1, or 0 when the queue is full or direct (the
 * caller then frees through Go). */
int xseg_fq_push(uint64_t ptr, int device);

#endif
