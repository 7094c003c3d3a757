/* cfbn output cache: see out_cache.h.
 *
 * A handful of slots under a spin lock: outputs die with the GIL held in
 * CPython, so the lock is uncontended, and buffers are only handed back to
 * the underlying allocator after it is dropped. */
#include "out_cache.h"

#include <stdatomic.h>

#define SLOTS 32

typedef struct {
    void *ptr;
    size_t size;
    uint64_t stamp;   /* when it was cached: the oldest goes first */
} slot;

static cfbn_allocator raw;
static slot slots[SLOTS];
static int n_held;
static size_t held_bytes, limit_bytes;
static uint64_t clock_stamp, hits, misses;
static atomic_flag lock = ATOMIC_FLAG_INIT;

static void lock_take(void)
{
    while (atomic_flag_test_and_set_explicit(&lock, memory_order_acquire)) {
    }
}

static void lock_drop(void)
{
    atomic_flag_clear_explicit(&lock, memory_order_release);
}

static void drop_slot(int i)
{
    held_bytes -= slots[i].size;
    slots[i] = slots[--n_held];
}

static int oldest_slot(void)
{
    int best = 0;
    for (int i = 1; i < n_held; i++)
        if (slots[i].stamp < slots[best].stamp) best = i;
    return best;
}

/* Moves slots out until held_bytes + room <= limit and a slot is free (when
 * room > 0); the evicted buffers go to out[], their count is returned. */
static int evict_for(size_t room, slot *out)
{
    int n = 0;
    while (n_held > 0 && (held_bytes + room > limit_bytes || (room > 0 && n_held == SLOTS))) {
        int i = oldest_slot();
        out[n++] = slots[i];
        drop_slot(i);
    }
    return n;
}

static void free_all(const slot *s, int n)
{
    for (int i = 0; i < n; i++) raw.free(raw.ctx, s[i].ptr, s[i].size);
}

static void *cache_malloc(void *ctx, size_t size)
{
    (void)ctx;
    if (size >= CFBN_CACHE_MIN_BYTES) {
        void *p = NULL;
        lock_take();
        int found = -1;
        for (int i = 0; i < n_held; i++)   /* the most recently cached fits the caches best */
            if (slots[i].size == size && (found < 0 || slots[i].stamp > slots[found].stamp)) found = i;
        if (found >= 0) {
            p = slots[found].ptr;
            drop_slot(found);
            hits++;
        } else {
            misses++;
        }
        lock_drop();
        if (p) return p;
    }
    return raw.malloc(raw.ctx, size);
}

/* calloc must return zeros and realloc keeps the contents: both go straight
 * to the underlying allocator, which made every buffer the cache holds. */
static void *cache_calloc(void *ctx, size_t nelem, size_t elsize)
{
    (void)ctx;
    return raw.calloc(raw.ctx, nelem, elsize);
}

static void *cache_realloc(void *ctx, void *ptr, size_t new_size)
{
    (void)ctx;
    return raw.realloc(raw.ctx, ptr, new_size);
}

static void cache_free(void *ctx, void *ptr, size_t size)
{
    (void)ctx;
    if (ptr && size >= CFBN_CACHE_MIN_BYTES) {
        slot out[SLOTS];
        int n = 0, kept = 0;
        lock_take();
        if (size <= limit_bytes) {
            n = evict_for(size, out);
            slots[n_held].ptr = ptr;
            slots[n_held].size = size;
            slots[n_held].stamp = ++clock_stamp;
            n_held++;
            held_bytes += size;
            kept = 1;
        }
        lock_drop();
        free_all(out, n);
        if (kept) return;
    }
    raw.free(raw.ctx, ptr, size);
}

void cfbn_cache_init(const cfbn_allocator *under, size_t limit)
{
    raw = *under;
    limit_bytes = limit;
}

void cfbn_cache_allocator(cfbn_allocator *out)
{
    out->ctx = NULL;
    out->malloc = cache_malloc;
    out->calloc = cache_calloc;
    out->realloc = cache_realloc;
    out->free = cache_free;
}

size_t cfbn_cache_set_limit(size_t limit)
{
    slot out[SLOTS];
    lock_take();
    size_t old = limit_bytes;
    limit_bytes = limit;
    int n = evict_for(0, out);
    lock_drop();
    free_all(out, n);
    return old;
}

void cfbn_cache_release(void)
{
    slot out[SLOTS];
    int n;
    lock_take();
    for (n = 0; n_held > 0; n++) {
        out[n] = slots[0];
        drop_slot(0);
    }
    lock_drop();
    free_all(out, n);
}

void cfbn_cache_stats_get(cfbn_cache_stats *st)
{
    lock_take();
    st->limit = limit_bytes;
    st->held_bytes = held_bytes;
    st->held_buffers = n_held;
    st->hits = hits;
    st->misses = misses;
    lock_drop();
}
