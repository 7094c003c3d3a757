/* cfbn scratch buffers: the per-call work memory of the driver (parameters,
 * shifts, partial sums).
 *
 * A small tensor's call needs four to six such buffers of a few KiB, and a
 * trip through malloc and free for each was a tenth of the whole call on
 * (1,8,8,16) float32 (0.2 of 2.4 us, Python included).  Buffers up to
 * CFBN_SCRATCH_KEEP_BYTES are therefore taken from blocks kept between
 * calls, in a pool of CFBN_SCRATCH_SLOTS blocks that a thread is given on its
 * first call and keeps: no lock or atomic operation on the way.  The first
 * CFBN_SCRATCH_POOLS threads that call cfbn get one; every other buffer
 * (larger ones, those beyond a pool's slots, those of later threads) comes
 * from and goes back to the C library.  A pool outlives its thread: the C
 * library's per-thread destructor (pthread_key_create) carries glibc 2.34's
 * symbol version when linked on a newer system, above the wheels' floor of
 * 2.31.  The memory kept is therefore bounded instead, at most
 * POOLS x SLOTS x KEEP_BYTES = 2 MiB, usually a few KiB per pool.
 *
 * A kept block is handed out only for a request of exactly its size (a loop
 * of calls on one shape asks for the same sizes each time), so every buffer
 * is as large as asked for and memcheck still sees a read or write past its
 * end. */
#ifndef CFBN_SCRATCH_H
#define CFBN_SCRATCH_H

#include <stddef.h>

#define CFBN_SCRATCH_KEEP_BYTES ((size_t)32 << 10)
#define CFBN_SCRATCH_SLOTS 8
#define CFBN_SCRATCH_POOLS 8

/* A 64-byte-aligned buffer of at least `bytes` bytes (one cache line when 0),
 * or NULL when out of memory.  64 bytes: no vector access to it straddles
 * two cache lines (measured: up to 30% on the channels-last gradient sums
 * with malloc's 16-byte alignment). */
void *cfbn_scratch_alloc(size_t bytes);

/* Give back a buffer of cfbn_scratch_alloc (NULL is ignored), on the thread
 * that took it. */
void cfbn_scratch_free(void *p);

#endif
