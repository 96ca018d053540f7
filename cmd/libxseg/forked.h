// Refusing calls in a child forked after the library loaded (shim.c).
#ifndef XSEG_FORKED_H
#define XSEG_FORKED_H

#ifdef __cplusplus
extern "C" {
#endif

extern volatile int xseg_forked;
extern const char xseg_fork_error[];

#ifdef __cplusplus
}
#endif

/* XSEG_FORK_GUARD(ret) returns ret (nothing if empty) from the calling
 * entry point in a child forked after the library loaded. */
#define XSEG_FORK_GUARD(...)        \
	do {                        \
		if (xseg_forked) {  \
			return __VA_ARGS__; \
		}                   \
	} while (0)

#endif
