/* cfbn output cache: large output buffers kept for reuse.
 *
 * A large output is fresh memory on most calls: above glibc's mmap ceiling
 * (32 MiB) a new mapping, below it heap that glibc trimmed when the last
 * outputs were freed (its trim threshold follows the mmap one).  The kernel
 * faults it in and zeroes every page while the kernels write it, which
 * costs as much as the pass itself.  Buffers of freed
 * outputs are kept here (up to a byte limit) and handed to the next output
 * of the same size.  The cache wraps an underlying allocator (NumPy's
 * default handler): every buffer comes from it and goes back to it. */
#ifndef CFBN_OUT_CACHE_H
#define CFBN_OUT_CACHE_H

#include <stddef.h>
#include <stdint.h>

/* the layout of NumPy's PyDataMemAllocator (NEP 49) */
typedef struct {
    void *ctx;
    void *(*malloc)(void *ctx, size_t size);
    void *(*calloc)(void *ctx, size_t nelem, size_t elsize);
    void *(*realloc)(void *ctx, void *ptr, size_t new_size);
    void (*free)(void *ctx, void *ptr, size_t size);
} cfbn_allocator;

typedef struct {
    size_t limit;        /* bytes the cache may hold */
    size_t held_bytes;   /* bytes it holds now */
    int held_buffers;
    uint64_t hits;       /* allocations served from the cache */
    uint64_t misses;     /* cacheable allocations passed to the underlying allocator */
} cfbn_cache_stats;

/* Smallest buffer worth keeping.  Two 24.5 MiB outputs freed after each
 * second-order gradient of (32,64,56,56) float32 were trimmed and faulted
 * in again on every call (40% of its time zeroing pages); kept from 1 MiB
 * up, the call took 5.5 ms instead of 15.5, and the gradient 4.1 instead
 * of 5.7.  Small outputs stay with glibc's arenas. */
#define CFBN_CACHE_MIN_BYTES ((size_t)1 << 20)

/* Wraps raw (copied); call once, before the first allocation. */
void cfbn_cache_init(const cfbn_allocator *raw, size_t limit);
/* The caching allocator (ctx and functions) to install in a NumPy handler. */
void cfbn_cache_allocator(cfbn_allocator *out);
/* Sets the limit, frees what no longer fits (oldest first); returns the old one. */
size_t cfbn_cache_set_limit(size_t limit);
/* Frees every buffer the cache holds. */
void cfbn_cache_release(void);
void cfbn_cache_stats_get(cfbn_cache_stats *st);

#endif
