/* Prefetching for runs of a channel-first tensor: included by the driver and
 * the ISA files (static inline: each gets its own copy, compiled with its own
 * flags). */
#ifndef CFBN_RUNS_H
#define CFBN_RUNS_H

#include <stdint.h>

/* A run of a channel-first tensor is often one short plane, too short for
 * the hardware prefetchers to catch: before reading it, ask (into L2) for as
 * many bytes from just past its end.  In NCHW that is the next channel's run,
 * which the same thread usually reads next.  Runs longer than
 * NEXT_RUN_PREFETCH_MAX bytes are left to the hardware.  Not so in the
 * channel-at-a-time passes, where the thread reads the same channel's next
 * plane and the prefetched lines of the next channel compete with this
 * channel's slice in L2: with 8192, the bfloat16 gradient of
 * (32,64,56,56) NCHW (planes of 6272 bytes) took 2250, 2241 and 2194 us on
 * average at 2 threads, against 1880, 1886 and 1975 with 4096 (one thread:
 * 4537 and 4481 against 3885 and 3649); (8,64,56,56), which goes plane by
 * plane, tied. */
#define NEXT_RUN_PREFETCH_MAX 4096
static inline void prefetch_next_run(const void *run, int64_t bytes)
{
    if (bytes > NEXT_RUN_PREFETCH_MAX) return;
    const char *q = (const char *)run + bytes;
    for (int64_t b = 0; b < bytes; b += 64) __builtin_prefetch(q + b, 0, 2);
}

/* The outputs of a run kernel's next run, which the hardware does not see
 * coming either: asked for with intent to write (into L1), whole lines
 * covering [run, run + bytes), so that the stores do not wait for their
 * lines.  Runs longer than NEXT_RUN_PREFETCH_MAX bytes are left alone. */
static inline void prefetch_run_out(const void *run, int64_t bytes)
{
    if (bytes > NEXT_RUN_PREFETCH_MAX) return;
    const char *q = (const char *)((uintptr_t)run & ~(uintptr_t)63), *end = (const char *)run + bytes;
    for (; q < end; q += 64) __builtin_prefetch(q, 1, 3);
}

#endif
