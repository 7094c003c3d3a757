/* The pools of kept blocks behind cfbn_scratch_alloc (scratch.h). */
#define _POSIX_C_SOURCE 200112L   /* posix_memalign under -std=c11 */
#include <stdatomic.h>
#include <stdlib.h>

#include "scratch.h"

typedef struct {
    void *block[CFBN_SCRATCH_SLOTS];
    size_t size[CFBN_SCRATCH_SLOTS];
    unsigned char used[CFBN_SCRATCH_SLOTS];
} pool;

/* Only its thread touches a pool once it is handed out; pools_given is
 * the one shared word. */
static pool pools[CFBN_SCRATCH_POOLS];
static atomic_int pools_given;
static _Thread_local pool *mine;
static _Thread_local int asked;

static void *alloc64(size_t bytes)
{
    void *p = NULL;
    return posix_memalign(&p, 64, bytes) == 0 ? p : NULL;
}

/* This thread's pool, handed out on its first call while any is left;
 * NULL for the threads after the last. */
static pool *this_pool(void)
{
    if (mine || asked) return mine;
    asked = 1;
    int n = atomic_load(&pools_given);
    while (n < CFBN_SCRATCH_POOLS && !atomic_compare_exchange_weak(&pools_given, &n, n + 1)) {
    }
    if (n < CFBN_SCRATCH_POOLS) mine = &pools[n];
    return mine;
}

void *cfbn_scratch_alloc(size_t bytes)
{
    if (bytes == 0) bytes = 64;
    pool *p = bytes <= CFBN_SCRATCH_KEEP_BYTES ? this_pool() : NULL;
    if (!p) return alloc64(bytes);
    /* a kept block of exactly this size, else a slot to keep a new one in:
     * an empty one first, then a free one whose block is given back */
    int empty = -1, spare = -1;
    for (int i = 0; i < CFBN_SCRATCH_SLOTS; i++) {
        if (p->used[i]) continue;
        if (p->block[i] && p->size[i] == bytes) {
            p->used[i] = 1;
            return p->block[i];
        }
        if (!p->block[i] && empty < 0) empty = i;
        if (p->block[i] && spare < 0) spare = i;
    }
    int i = empty >= 0 ? empty : spare;
    if (i < 0) return alloc64(bytes);
    free(p->block[i]);
    p->block[i] = alloc64(bytes);
    p->size[i] = p->block[i] ? bytes : 0;
    p->used[i] = p->block[i] != NULL;
    return p->block[i];
}

void cfbn_scratch_free(void *q)
{
    if (!q) return;
    pool *p = mine;
    for (int i = 0; p && i < CFBN_SCRATCH_SLOTS; i++) {
        if (p->block[i] == q) {
            p->used[i] = 0;
            return;
        }
    }
    free(q);
}
