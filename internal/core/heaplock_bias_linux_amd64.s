//go:build !race

#include "textflag.h"
#include "go_asm.h"

// The warm paths of heapLock (heaplock.go). On the biased way the store to
// busy comes before the loads of revoke and bias in the instructions the
// CPU runs, and a revoker's membarrier orders it against them; assembly is
// never preempted, so a goroutine stopped by the GC is never half-way.

// func lockFast(l *heapLock)
TEXT ·lockFast(SB), NOSPLIT, $0-8
	MOVQ	l+0(FP), BX
	MOVQ	heapLock_bias(BX), DX
	TESTQ	DX, DX
	JEQ	shared
	MOVQ	(TLS), CX
	CMPQ	biasRec_owner(DX), CX
	JNE	shared
	MOVL	$1, biasRec_busy(DX)
	CMPL	heapLock_revoke(BX), $0
	JNE	back
	CMPQ	heapLock_bias(BX), DX
	JNE	back
	MOVB	$1, heapLock_byBias(BX)
	RET
back:
	MOVL	$0, biasRec_busy(DX)
shared:
	MOVL	$0, AX
	MOVL	$1, CX
	LOCK
	CMPXCHGL	CX, heapLock_state(BX)
	JNE	wait
	// The compare-and-swap is a full barrier: a bias set by the holder
	// before, as it let go, is seen here.
	MOVQ	heapLock_bias(BX), DX
	TESTQ	DX, DX
	JNE	revoke
	RET
revoke:
	JMP	·lockRevoke(SB)
wait:
	JMP	·lockWait(SB)

// func unlockFast(l *heapLock)
TEXT ·unlockFast(SB), NOSPLIT, $0-8
	MOVQ	l+0(FP), AX
	CMPB	heapLock_byBias(AX), $0
	JEQ	shared
	// Held the biased way: bias is still the record taken through, as
	// a revoker waits for its busy before it clears bias.
	MOVB	$0, heapLock_byBias(AX)
	MOVQ	heapLock_bias(AX), DX
	MOVL	$0, biasRec_busy(DX)
	CMPL	heapLock_revoke(AX), $0
	JNE	wake
	RET
wake:
	JMP	·unlockWake(SB)
shared:
	JMP	·unlockShared(SB)

// func goroutineID() uintptr
TEXT ·goroutineID(SB), NOSPLIT, $0-8
	MOVQ	(TLS), AX
	MOVQ	AX, ret+0(FP)
	RET
