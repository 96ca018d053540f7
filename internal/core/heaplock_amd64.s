//go:build !race

#include "textflag.h"

// func releaseStore(p *uint32, v uint32)
TEXT ·releaseStore(SB), NOSPLIT, $0-12
	MOVQ	p+0(FP), AX
	MOVL	v+8(FP), BX
	MOVL	BX, 0(AX)
	RET
